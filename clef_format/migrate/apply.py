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
``CLEF_FORMAT_CRASH_AT=<phase>:<n>`` SIGKILLs the process at the n-th crash point of a phase
(lock, stage, journal, verify, swap, cleanup): the crash-injection tests use it.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from clef_format.errors import Refused
from clef_format.migrate import fsutil
from clef_format.migrate.plan import Plan, Safetensors
from clef_format.migrate.writer import wait_all, write_output
from clef_format.progress import NO_PROGRESS, Progress
from clef_format.read.checkpoint import Checkpoint, read_checkpoint
from clef_format.read.hf_cache import blobs_dir
from clef_format.report import Report

CRASH_ENV = "CLEF_FORMAT_CRASH_AT"
JOURNAL_VERSION = 1
_crash_counts: dict[str, int] = {}
_crash_lock = threading.Lock()


def crashpoint(phase: str) -> None:
    """Signal this process at the n-th crash point of ``phase`` when CLEF_FORMAT_CRASH_AT says so:
    ``<phase>:<n>`` sends SIGKILL, ``<phase>:<n>:INT`` SIGINT (what Ctrl-C does)."""
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    want, _, rest = spec.partition(":")
    if want != phase:
        return
    n, _, sig = rest.partition(":")
    with _crash_lock:
        _crash_counts[phase] = _crash_counts.get(phase, 0) + 1
        hit = _crash_counts[phase] == int(n or 1)
    if hit:
        os.kill(os.getpid(), signal.SIGINT if sig == "INT" else signal.SIGKILL)


@dataclass
class Target:
    """Where the result lands, and the workspace beside it."""

    path: str
    source: str
    in_place: bool

    @property
    def parent(self) -> str:
        return os.path.dirname(self.path)

    @property
    def ws(self) -> str:
        return os.path.join(self.parent, f".{os.path.basename(self.path)}.clef-migrate")

    @property
    def lock_path(self) -> str:
        return self.ws + ".lock"

    @property
    def journal_path(self) -> str:
        return os.path.join(self.ws, "journal.json")

    @property
    def new(self) -> str:
        return os.path.join(self.ws, "new")

    @property
    def old(self) -> str:
        return os.path.join(self.ws, "old")


def make_target(source: str, output: str | None) -> Target:
    src = os.path.realpath(source)
    if output is None:
        return Target(src, src, True)
    out = os.path.abspath(output)
    return Target(os.path.join(os.path.realpath(os.path.dirname(out)), os.path.basename(out)), src, False)


# ---- lock ----------------------------------------------------------------------------------

class Lock:
    """An exclusive, non-blocking flock on the target's lock file; refused when another run holds it."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.fd: int | None = None

    def __enter__(self) -> "Lock":
        import fcntl

        path = self.target.lock_path
        for _ in range(5):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise Refused("migrate-refused", f"cannot create the lock {path}: {exc.strerror}",
                              "the directory (or its parent) is read-only: use --output DIR on a writable disk") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise Refused("migrate-refused",
                              f"another clef-format migrate (pid {holder}) is working on {self.target.path}",
                              "wait for it to finish; a killed run's lock is released by the kernel") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
                self.fd = fd
                crashpoint("lock")
                return self
            os.close(fd)  # the previous holder removed the file after we opened it: take the new one
        raise Refused("migrate-refused", f"could not take the lock {path}")

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            try:
                os.unlink(self.target.lock_path)  # still held: a waiting run re-checks the inode and retries
            except OSError:
                pass
            os.close(self.fd)
            self.fd = None


# ---- journal -------------------------------------------------------------------------------

def read_journal(target: Target) -> dict[str, Any] | None:
    try:
        with open(target.journal_path, "rb") as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) and data.get("version") == JOURNAL_VERSION else None
    except (OSError, ValueError):
        return None


def write_journal(target: Target, journal: dict[str, Any]) -> None:
    """Atomic: temp file, fsync, rename, fsync the workspace."""
    crashpoint("journal")
    tmp = target.journal_path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(journal, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target.journal_path)
    fsutil.fsync_dir(target.ws)


def fingerprint(ck: Checkpoint) -> dict[str, list[int]]:
    """The source's state: size and mtime of every file; a journal only resumes on the same state."""
    out = {}
    for rel in sorted(ck.files):
        st = os.stat(ck.path(rel))
        out[rel] = [st.st_size, st.st_mtime_ns]
    return out


def _rmtree(path: str) -> None:
    def onerror(func: Any, p: str, exc: Any) -> None:
        try:
            os.chmod(os.path.dirname(p), 0o700)
            func(p)
        except OSError:
            pass

    if os.path.lexists(path):
        shutil.rmtree(path, onerror=onerror)


def _cleanup(target: Target) -> None:
    crashpoint("cleanup")
    _rmtree(target.new)
    crashpoint("cleanup")
    _rmtree(target.old)
    try:
        os.unlink(target.journal_path)
    except FileNotFoundError:
        pass
    crashpoint("cleanup")
    _rmtree(target.ws)
    fsutil.fsync_dir(target.parent)


def _swapped(target: Target, journal: dict[str, Any]) -> bool:
    try:
        st = os.stat(target.path)
    except FileNotFoundError:
        return False
    return [st.st_dev, st.st_ino] == journal.get("new_ino")


def _swap(target: Target, journal: dict[str, Any]) -> None:
    crashpoint("swap")
    if os.path.isdir(target.path):
        try:
            fsutil.exchange(target.new, target.path)
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EXDEV, errno.ENOTSUP, errno.EPERM):
                raise
            if not target.in_place:
                os.rmdir(target.path)  # refused earlier unless empty
            else:
                os.rename(target.path, target.old)
                crashpoint("swap")
            os.rename(target.new, target.path)
    else:
        os.rename(target.new, target.path)
    fsutil.fsync_dir(target.parent)
    crashpoint("swap")
    journal["phase"] = "swapped"
    write_journal(target, journal)


def recover(target: Target, source_ck: Checkpoint | None, abort: bool = False) -> str | None:
    """Deal with an interrupted run before anything else (the lock is held). Returns what was done."""
    if not os.path.lexists(target.ws):
        return None
    journal = read_journal(target)
    if journal is None:
        _rmtree(target.ws)
        return "removed an interrupted run's workspace (nothing had been committed)"
    phase = journal.get("phase")
    what = f"{journal.get('revision')} {journal.get('direction')}"
    if phase == "swapped" or (phase == "staged" and _swapped(target, journal)):
        if phase != "swapped":
            journal["phase"] = "swapped"
            write_journal(target, journal)
        _cleanup(target)
        return f"the interrupted migration {what} had completed; finished its cleanup"
    if phase == "staged" and not os.path.lexists(target.path) and os.path.isdir(target.old):
        # killed between the two renames of the fallback swap: the new tree goes in
        os.rename(target.new, target.path)
        fsutil.fsync_dir(target.parent)
        journal["phase"] = "swapped"
        write_journal(target, journal)
        _cleanup(target)
        return f"finished the interrupted migration {what} (its new tree was complete)"
    if abort:
        _rmtree(target.ws)
        return f"rolled back the interrupted migration {what}; the checkpoint was never changed"
    if phase == "staged" and source_ck is not None and journal.get("fingerprint") == fingerprint(source_ck):
        _swap(target, journal)
        _cleanup(target)
        return f"finished the interrupted migration {what} (its new tree was complete and verified)"
    if phase == "staging":
        return f"resuming the interrupted migration {what}"
    _rmtree(target.ws)
    return f"rolled back the interrupted migration {what}: the checkpoint changed since"


# ---- the run -------------------------------------------------------------------------------

@dataclass
class Result:
    quality: dict[str, dict[str, float]] = field(default_factory=dict)
    carried_by: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per phase and per written file


def carried_by_link(target: Target, snapshot: bool) -> bool:
    if target.in_place:
        return True
    return not snapshot and os.path.isdir(target.parent) and fsutil.can_hardlink(target.source, target.parent)


def check_space(plan: Plan, target: Target, snapshot: bool) -> None:
    st = os.statvfs(target.parent)
    free = st.f_bavail * st.f_frsize
    need = plan.space_needed(carried_by_link(target, snapshot))
    if need > free:
        raise Refused("migrate-refused",
                      f"not enough free space on {target.parent}: the migration needs {need:,} bytes, {free:,} are free",
                      "free some space, or use --output DIR on a disk with room")


def _verify_staged(plan: Plan, target: Target, display: str) -> Report:
    from clef_format.verify.run import verify_checkpoint

    crashpoint("verify")
    report = verify_checkpoint(read_checkpoint(target.new), display)
    if not report.ok or report.layout != plan.to_layout:
        errors = "; ".join(f"{f.code}: {f.message}" for f in report.findings if f.severity == "error")
        raise OSError(errno.EIO, f"the new files did not verify as {plan.to_layout} "
                                 f"(got {report.layout}: {errors or 'no errors'}); nothing was changed")
    return report


def run_plan(plan: Plan, ck: Checkpoint, target: Target, progress: Progress | None = None,
             workers: int = 2) -> Result:
    """Stage, verify, swap, clean up. Raises ``OSError`` (rolled back: the original is intact) on failure."""
    progress = progress or NO_PROGRESS
    result = Result()
    t0 = time.perf_counter()
    fp = fingerprint(ck)
    journal = read_journal(target)
    if not (journal and journal.get("phase") == "staging" and journal.get("fingerprint") == fp
            and journal.get("revision") == plan.revision and journal.get("direction") == plan.direction):
        _rmtree(target.ws)
        journal = {"version": JOURNAL_VERSION, "revision": plan.revision, "direction": plan.direction,
                   "from": plan.from_layout, "to": plan.to_layout, "source": target.source, "target": target.path,
                   "in_place": target.in_place, "phase": "staging", "fingerprint": fp, "done": {}, "quality": {}}
    os.makedirs(target.new, exist_ok=True)
    try:
        write_journal(target, journal)
        allowed = [os.path.realpath(ck.root)] + ([os.path.realpath(blobs_dir(ck.root))] if ck.hf_snapshot else [])
        skip = {o.rel for o in plan.outputs} | set(plan.removed)
        how = fsutil.replicate(ck.root, target.new, skip, target.in_place, allowed, ck.hf_snapshot)
        for way in how.values():
            result.carried_by[way] = result.carried_by.get(way, 0) + 1
        crashpoint("stage")
        jlock = threading.Lock()
        stop = threading.Event()

        def produce(out: Any) -> None:
            dst = os.path.join(target.new, *out.rel.split("/"))
            if journal["done"].get(out.rel) == out.size and os.path.isfile(dst) and os.path.getsize(dst) == out.size:
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
                journal["done"][out.rel] = out.size
                journal["quality"].update(quality)
                write_journal(target, journal)

        big = [o for o in plan.outputs if isinstance(o, Safetensors)]
        small = [o for o in plan.outputs if not isinstance(o, Safetensors)]
        for out in small:
            produce(out)
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            wait_all([pool.submit(produce, o) for o in big])
        fsutil.finish_tree(ck.root, target.new)
        result.quality = dict(journal["quality"])
        t1 = time.perf_counter()
        result.seconds["stage"] = round(t1 - t0, 3)
        _verify_staged(plan, target, target.path)  # raises unless the staged tree verifies clean
        result.seconds["verify"] = round(time.perf_counter() - t1, 3)
        st = os.stat(target.new)
        journal["new_ino"] = [st.st_dev, st.st_ino]
        journal["phase"] = "staged"
        write_journal(target, journal)
    except BaseException:
        _rmtree(target.ws)  # roll back: nothing outside the workspace was touched
        raise
    t2 = time.perf_counter()
    _swap(target, journal)
    t3 = time.perf_counter()
    _cleanup(target)
    result.seconds["swap"] = round(t3 - t2, 3)
    result.seconds["cleanup"] = round(time.perf_counter() - t3, 3)
    return result
