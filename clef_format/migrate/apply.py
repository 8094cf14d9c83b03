"""Carry out a plan, losing nothing at any moment. The only code of clef-format that writes a checkpoint.

A run for target directory ``T`` (in place: the checkpoint itself; else ``--output``) works in a
sibling workspace ``.T.clef-migrate/`` and holds ``.T.clef-migrate.lock`` (``flock``; the kernel
drops it when the process dies, so a SIGKILL never leaves a stale lock):

1. *staging*: the result is built as a complete new tree ``ws/new``: unchanged files hard-linked
   (or reflinked / copied), changed files written by streaming and fsynced, each recorded in
   ``ws/journal.json`` when done (an interrupted staging resumes from there).
2. *staged*: verify runs on the new tree; it must be clean and of the target layout.
3. the swap: ``renameat2(RENAME_EXCHANGE)`` swaps ``ws/new`` and ``T`` in one atomic step, so
   ``T`` is at every instant either the whole old checkpoint or the whole new one. (Where the
   filesystem cannot exchange, two renames with the old tree parked in ``ws/old``; the journal
   finishes them.)
4. *swapped*: the old tree is deleted, then the journal, the workspace, the lock.

The next call on ``T`` reads the journal first: staging -> resume (or roll back with ``abort``),
staged -> finish the swap if the source is unchanged, swapped -> finish the cleanup.

The parts live beside this module: ``crash`` (crash injection, ``CLEF_FORMAT_CRASH_AT``), ``workspace``
(target, names, lock, journal, fingerprint), ``preflight``, ``swap`` and ``recovery``; this one stages
and runs them in order (``run_plan``).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from clef_format.errors import MigrateRefused
from clef_format.migrate import fsutil
from clef_format.migrate.crash import crashpoint
from clef_format.migrate.plan import Plan, Safetensors
from clef_format.migrate.preflight import survey_source
from clef_format.migrate.swap import cleanup_or_say, swap_in
from clef_format.migrate.tree_state import TreeState, changes, folders, looked_at_again, record, snapshot
from clef_format.migrate.workspace import (
    NOT_READ,
    Journal,
    NotRead,
    Phase,
    Target,
    fingerprint,
    read_journal,
    remove_tree,
    write_journal,
)
from clef_format.migrate.writer import wait_all, write_output
from clef_format.progress import NO_PROGRESS, Progress
from clef_format.read.checkpoint import Checkpoint, read_checkpoint
from clef_format.read.hf_cache import blobs_dir
from clef_format.report import Report


# ---- the run -------------------------------------------------------------------------------

@dataclass
class Result:
    quality: dict[str, dict[str, float]] = field(default_factory=dict)
    carried_by: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per phase and per written file
    entries: dict[str, int] = field(default_factory=dict)  # user entries before and after
    #: verify's report on the staged tree: the tree now at the target, the same bytes (the swap is a
    #: rename), so it is the run's final report; nothing is read or verified again after the swap
    report: Report | None = None


def _verify_staged(plan: Plan, target: Target, display: str, name: str | None = None) -> Report:
    """verify of the staged tree, its fixes naming ``name`` (default ``display``): the folder the tree
    becomes once swapped in (never the workspace, which is gone by the time the user reads them)."""
    from clef_format.verify.run import verify_checkpoint

    crashpoint("verify")
    report = verify_checkpoint(read_checkpoint(target.new, name or display), display)
    if not report.ok or report.layout != plan.to_layout:
        errors = "; ".join(f"{f.code}: {f.message}" for f in report.findings if f.severity == "error")
        raise OSError(errno.EIO, f"the new files did not verify as {plan.to_layout} "
                                 f"(got {report.layout}: {errors or 'no errors'}); nothing was changed")
    return report


def _check_carried(entries: list[str], plan: Plan, target: Target) -> dict[str, int]:
    """In place, the new tree holds every entry of the old one but those the plan removes: else nothing
    is swapped (a tree with fewer entries is never produced)."""
    removed = set(plan.removed)
    missing = [rel for rel in entries if rel not in removed and not os.path.lexists(os.path.join(target.new, rel))]
    if missing and target.in_place:
        raise OSError(errno.EIO, f"the new tree lacks {len(missing)} entr{'y' if len(missing) == 1 else 'ies'} of the "
                                 f"old one ({', '.join(missing[:5])}); nothing was changed")
    after = sum(1 for _ in _walk_entries(target.new))
    return {"before": len(entries), "after": after, "removed": len(removed & set(entries))}


def _walk_entries(root: str) -> Any:
    for dirpath, dirnames, filenames in fsutil.tree_walk(root):
        for name in dirnames + filenames:
            yield os.path.join(dirpath, name)


def refresh_references(plan: Plan, ck: Checkpoint, new_root: str, out_of_place: bool = False) -> None:
    """Migrate owns the references it invalidates: the ``local_dir`` download metadata of every file it
    replaced or removed goes (its etag described the old bytes), and ``clef_manifest.json`` is rewritten
    for the new files when the source had one, or when a replaced file lost its metadata. Out of place,
    the source's download metadata and cache blob names do not travel: the output gets a manifest
    (its files were checked against those references before the run, ``session``)."""
    from clef_format.migrate.manifest_writer import rewrite_manifest
    from clef_format.read.hf_cache import LOCAL_DIR_DOWNLOAD

    changed = {o.rel for o in plan.outputs} | set(plan.removed)
    dropped = False
    for rel in sorted(changed):
        meta = os.path.join(new_root, *LOCAL_DIR_DOWNLOAD.split("/"), *rel.split("/")) + ".metadata"
        if os.path.lexists(meta):
            os.unlink(meta)
            dropped = True
    left_behind = out_of_place and (ck.hf_snapshot or os.path.isdir(os.path.join(ck.root, *LOCAL_DIR_DOWNLOAD.split("/"))))
    rewrite_manifest(ck, new_root, changed, always=dropped or left_behind)


def _roll_back(target: Target, exc: BaseException) -> None:
    """Remove the workspace after a failed staging; if even that fails, say where it is."""
    try:
        remove_tree(target.ws)
    except OSError as rm:
        if isinstance(exc, OSError):
            exc.strerror = (f"{exc.strerror or exc}; the workspace {target.ws} could not be removed "
                            f"({rm.strerror}): rerun clef-format migrate, or --abort")


class SourceChanged(MigrateRefused):
    """The source changed while its new tree was staged: nothing was swapped, the staged files were
    removed, the source holds the change. The caller names the command that redoes the step."""

    def __init__(self, root: str, what: list[str]) -> None:
        shown = "; ".join(what[:5]) + (f"; and {len(what) - 5} more" if len(what) > 5 else "")
        super().__init__(f"{root} changed while migrate staged it ({shown}): the new tree was built from what "
                         "it held before, so nothing was swapped in; the checkpoint keeps the change and the staged "
                         "files were removed")
        self.changes = what


def _refuse_if_changed(before: TreeState, ck: Checkpoint, target: Target, exc: OSError) -> None:
    """After ``exc``: raise ``SourceChanged`` when the source is no longer what ``before`` recorded (the
    failure came from the change: say that, not an I/O error); return when it is, or cannot be read
    again (the caller raises ``exc``: the first failure says why). Every ctime is ignored: the files
    linked before the failure are not known."""
    try:
        changed = changes(before, source_state(ck, target), frozenset(before.entries))
    except fsutil.TreeTooDeep as deep:  # a folder nested past the limit appeared meanwhile
        raise SourceChanged(ck.root, [f"{deep.strerror} now"]) from None
    except OSError:
        return
    if changed:
        raise SourceChanged(ck.root, changed) from exc


def source_state(ck: Checkpoint, target: Target) -> TreeState:
    """The state the step is planned from: taken before the checkpoint is read for the plan."""
    return snapshot(ck.root, frozenset() if target.in_place else frozenset({".cache"}))


def run_plan(plan: Plan, ck: Checkpoint, target: Target, progress: Progress | None = None,
             workers: int = 2, before: TreeState | None = None, entries: list[str] | None = None,
             journal: Journal | None | NotRead = NOT_READ, display: str | None = None,
             name: str | None = None) -> Result:
    """Stage, verify, swap, clean up. Raises ``OSError`` (rolled back: the original is intact) on failure,
    ``SourceChanged`` when the source is not, right before the swap, what it was in ``before`` (by
    default its state when this call began; the caller takes it before it reads the checkpoint).

    What the caller already has is passed, not read again: ``entries`` (``survey_source`` of ``ck.root``,
    taken since ``before``), ``journal`` (read under the lock, after any recovery: None when there is
    no workspace). ``display``: the path the staged tree's verify report names (default the target);
    ``name``: what its fixes call the result (``Checkpoint.name``; default ``display``)."""
    progress = progress or NO_PROGRESS
    result = Result()
    t0 = time.perf_counter()
    before = before or source_state(ck, target)
    if entries is None:
        entries = survey_source(ck.root, target.in_place)  # proves every entry can be carried, before any write
    try:
        fp = fingerprint(ck)
    except OSError as exc:  # a file gone since the survey (taken before the lock): the source changed
        _refuse_if_changed(before, ck, target, exc)
        raise
    if isinstance(journal, NotRead):
        journal = read_journal(target)
    if not (journal and journal.phase is Phase.STAGING and journal.fingerprint == fp
            and journal.step == (plan.revision, plan.direction)):
        remove_tree(target.ws)
        journal = Journal(revision=plan.revision, direction=plan.direction, from_layout=plan.from_layout,
                          to_layout=plan.to_layout, source=target.source, target=target.path, in_place=target.in_place,
                          phase=Phase.STAGING, fingerprint=fp)
    os.makedirs(target.new, exist_ok=True)
    linked: frozenset[str] = frozenset()
    try:
        write_journal(target, journal)
        allowed = [os.path.realpath(ck.root)] + ([os.path.realpath(blobs_dir(ck.root))] if ck.hf_snapshot else [])
        skip = {o.rel for o in plan.outputs} | set(plan.removed)
        how = fsutil.replicate(ck.root, target.new, skip, target.in_place, allowed, ck.hf_snapshot)
        for way in how.values():
            result.carried_by[way] = result.carried_by.get(way, 0) + 1
        linked = frozenset(rel for rel, way in how.items() if way == "link")
        crashpoint("stage")
        jlock = threading.Lock()
        stop = threading.Event()

        def produce(out: Any) -> None:
            dst = os.path.join(target.new, *out.rel.split("/"))
            if journal.done.get(out.rel) == out.size and os.path.isfile(dst) and os.path.getsize(dst) == out.size:
                return  # finished by the interrupted run
            tick_progress = progress.add(out.rel, out.size)

            def tick(n: int) -> None:
                if stop.is_set():
                    raise OSError(errno.ECANCELED, "another output failed")
                tick_progress(n)
                crashpoint("stage")

            started = time.perf_counter()
            try:
                quality = write_output(out, ck.root, dst, tick)
            except BaseException:
                stop.set()
                raise
            result.seconds[out.rel] = round(time.perf_counter() - started, 3)
            with jlock:
                journal.done[out.rel] = out.size
                journal.quality.update(quality)
                write_journal(target, journal)

        big = [o for o in plan.outputs if isinstance(o, Safetensors)]
        small = [o for o in plan.outputs if not isinstance(o, Safetensors)]
        for out in small:
            produce(out)
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            wait_all([pool.submit(produce, o) for o in big])
        result.entries = _check_carried(entries, plan, target)
        refresh_references(plan, ck, target.new, out_of_place=not target.in_place)
        staged = snapshot(target.new)  # the finished tree's one walk: its folders, and the state its journal records
        fsutil.finish_tree(ck.root, target.new, folders(staged),
                           replaced=None if target.in_place else target.path)
        staged = looked_at_again(staged, folders(staged))  # their modes, as finish_tree left them
        result.quality = dict(journal.quality)
        t1 = time.perf_counter()
        result.seconds["stage"] = round(t1 - t0, 3)
        shown = display or target.path
        result.report = _verify_staged(plan, target, shown, name or shown)  # raises unless it verifies clean
        result.seconds["verify"] = round(time.perf_counter() - t1, 3)
        st = os.stat(target.new)
        journal.new_ino = [st.st_dev, st.st_ino]
        journal.new_tree = record(staged, linked)  # what an --abort after the swap proves unchanged
        journal.phase = Phase.STAGED
        write_journal(target, journal)
    except BaseException as exc:
        _roll_back(target, exc)  # nothing outside the workspace was touched
        if isinstance(exc, OSError):  # a file gone or changed under the staging: say that, not an I/O error
            _refuse_if_changed(before, ck, target, exc)
        raise
    t2 = time.perf_counter()

    def recheck() -> None:  # under the lock, last thing before the exchange
        try:
            now = source_state(ck, target)
        except OSError as exc:  # an entry gone, or no longer readable: not the tree that was staged
            where = fsutil.short_rel(os.path.relpath(exc.filename, ck.root)) if exc.filename else "."
            if isinstance(exc, fsutil.TreeTooDeep):
                raise SourceChanged(ck.root, [f"{exc.strerror} now"]) from None
            raise SourceChanged(ck.root, [f"{where} cannot be read again ({exc.strerror or exc})"]) from None
        changed = changes(before, now, linked)
        if changed:
            raise SourceChanged(ck.root, changed)
        written = fsutil.output_written(target)
        if written:  # the --output was made or filled meanwhile: the exchange would move that into the workspace
            raise SourceChanged(target.path, written)

    swap_in(target, journal, recheck)
    t3 = time.perf_counter()
    cleanup_or_say(target)
    result.seconds["swap"] = round(t3 - t2, 3)
    result.seconds["cleanup"] = round(time.perf_counter() - t3, 3)
    return result
