"""``clef-format manifest``: hash every file and write ``clef_manifest.json`` (the one writer of it).

Refuses (a finding, exit 1) inside a Hugging Face cache snapshot, which is never written (its blob
names already serve as a manifest), and when reading the checkpoint found errors (a truncated,
unsafe or escaping file): a manifest must not bless a broken download, unless ``force``.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from typing import Any, Iterator

from clef_format.errors import CouldNotRun, Refused
from clef_format.migrate.crash import crashpoint
from clef_format.progress import NO_PROGRESS, Progress
from clef_format.read.checkpoint import open_checkpoint
from clef_format.shell import quote_path
from clef_format.read.hashing import HashTask, hash_many
from clef_format.read.hf_cache import in_hf_cache
from clef_format.read.manifest import ALGORITHM, MANIFEST_NAME, build_manifest, manifest_files
from clef_format.records import Record
from clef_format.report import Report, make_report
from clef_format.spec.findings import error


class ManifestDetails(Record):
    """manifest's own keys: the file written (``None``: nothing was), the hash algorithm, and what it
    lists (``files``, ``bytes``) once written."""

    written: str | None
    algorithm: str = ALGORITHM
    files: int | None = None
    bytes: int | None = None

    @property
    def capped_after(self) -> str | None:
        return None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"written": self.written, "algorithm": self.algorithm}
        if self.written is not None:
            out.update(files=self.files, bytes=self.bytes)
        return out


def write_manifest(root: str, manifest: dict[str, Any]) -> str:
    """Write atomically (temp file, fsync, rename) so a crash never leaves half a manifest."""
    if in_hf_cache(root):
        raise Refused("manifest-refused", f"{root} is inside a Hugging Face cache, which clef-format never writes to")
    from clef_format.migrate.fsutil import fsync_dir, mode_for, sync_xattrs

    target = os.path.join(root, MANIFEST_NAME)
    mode = mode_for(target)
    fd, tmp = tempfile.mkstemp(prefix=".clef_manifest.", suffix=".tmp", dir=root)
    try:
        if os.path.isfile(target) and not os.path.islink(target):
            sync_xattrs(target, fd)  # the manifest it replaces keeps its xattrs and ACL
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=1, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(root)  # the new name is durable only once its directory is
    return target


@contextmanager
def writer_lock(root: str, code: str = "manifest-refused",
                fix: str = "wait for it to finish, then run clef-format manifest on the result",
                unlockable: str = "copy the checkpoint to a folder you can write, and run it there") -> Iterator[None]:
    """The lock ``migrate`` holds on ``root`` (``.ROOT.clef-migrate.lock`` beside it), held by every other
    writer of the checkpoint too: a migrate staging now would swap away what is written meanwhile.
    ``Refused`` (``code``, with ``fix``) while a migrate runs; with ``unlockable`` when the lock cannot be
    made there at all (a folder no file can be created in, such as ``/proc``; no flock), where waiting
    would not help; with the lock's own fix otherwise (something else sits at the lock's name). Where the
    folder beside ``root`` is not writable no lock file can be made, and no migrate can run in place there
    either: nothing to hold."""
    from clef_format.migrate.preflight import lock_held
    from clef_format.migrate.workspace import Lock, LockHeld, LockUnmade, make_target, name_too_long

    target = make_target(root, None)
    if name_too_long(target):  # no lock can be named beside it, so no migrate can run on it: nothing to hold
        yield
        return
    if not os.access(target.parent, os.W_OK | os.X_OK):
        if lock_held(target):
            raise Refused(code, f"a clef-format migrate is working on {root}; nothing was written", fix)
        yield
        return
    try:
        lock = Lock(target).__enter__()
    except Refused as exc:  # a lock that is held is waited out; one that cannot be made needs another place
        own = fix if isinstance(exc, LockHeld) else unlockable if isinstance(exc, LockUnmade) else exc.fix
        raise Refused(code, exc.message if "nothing was written" in exc.message else f"{exc.message}; nothing was "
                      "written", own) from None
    try:
        yield
    finally:
        lock.__exit__(None, None, None)


def make_manifest(path: str, force: bool = False, progress: Progress | None = None) -> Report:
    """Hash the checkpoint at ``path`` and write its manifest; a report with ``written`` (or a refusal).
    Holds migrate's lock on the checkpoint meanwhile (``writer_lock``)."""
    ck = open_checkpoint(path)
    layout = str(ck.layout)
    details = ManifestDetails(None)  # nothing written (yet)
    if ck.unreadable:
        return make_report("manifest", path, layout, ck.findings, details)
    if ck.hf_snapshot or in_hf_cache(ck.root):
        return make_report("manifest", path, layout, [error(
            "manifest-refused", f"{ck.root} is inside a Hugging Face cache, which clef-format never writes to",
            fix=f"clef-format verify {quote_path(path)} --deep already checks it against the cache's blob names")], details)
    try:
        with writer_lock(ck.root):
            before = _state(ck.root)  # taken before the files are read: a change after it is seen
            ck = open_checkpoint(path)  # read again under the lock: what a migrate that just ended left
            return _make_manifest_locked(ck, path, force, progress, details, before)
    except Refused as exc:
        return make_report("manifest", path, layout, [error(exc.code, exc.message, fix=exc.fix)], details)


def _state(root: str) -> Any:
    """The checkpoint's state (``migrate.tree_state``) to prove before writing; None for a tree nested past
    the reader's limit (the reader refuses it anyway: only ``--force`` writes there, without the proof).
    Anything else that cannot be looked at is ``CouldNotRun`` naming it and the cause."""
    from clef_format.migrate.fsutil import TreeTooDeep, short_rel
    from clef_format.migrate.tree_state import snapshot

    try:
        return snapshot(root)
    except TreeTooDeep:
        return None
    except OSError as exc:
        where = short_rel(os.path.relpath(exc.filename, root)) if isinstance(exc.filename, str) else "."
        raise CouldNotRun(f"{where} cannot be read: {exc.strerror or exc}; nothing was written",
                          fix="make it readable (chmod / chown), or run as a user who can read the whole "
                              "checkpoint") from None


def _changed_meanwhile(root: str, before: Any) -> list[str]:
    """What changed in the checkpoint since ``before``, proven after hashing and before writing: a file
    edited, added or removed meanwhile would be described by the manifest as it was, and ``verify
    --deep`` would then call the user's own edit damage."""
    from clef_format.migrate.fsutil import short_rel
    from clef_format.migrate.tree_state import changes, snapshot

    if before is None:
        return []
    try:
        now = snapshot(root)
    except OSError as exc:  # gone or unreadable since: not the tree that was hashed
        where = short_rel(os.path.relpath(exc.filename, root)) if isinstance(exc.filename, str) else "."
        return [f"{where} cannot be read again ({exc.strerror or exc})"]
    return changes(before, now)


def _make_manifest_locked(ck: Any, path: str, force: bool, progress: Progress | None,
                          details: ManifestDetails, before: Any = None) -> Report:
    layout = str(ck.layout)
    errors = [f for f in ck.findings if f.severity == "error"]
    if errors and not force:
        refusal = error("manifest-refused", "reading the checkpoint found errors; a manifest would record a broken "
                                           "download",
                        fix=f"fix what clef-format verify {quote_path(path)} reports, or pass --force")
        return make_report("manifest", path, layout, [refusal, *errors], details)
    files = manifest_files(ck)
    # a manifest is checked first by --deep: it must never vouch for bytes that fail a reference unawares
    damaged, differing = _failing_references(ck, files, progress)
    bad = damaged + differing
    unread = [f for f in bad if f.code == "unreadable"]
    if unread:
        raise CouldNotRun(f"{unread[0].message}; nothing was written", fix=unread[0].fix)
    if bad and not force:
        from clef_format.verify.deep import remanifest

        refusals = []
        if damaged:
            refusals.append(error(
                "manifest-refused", f"{len(damaged)} file(s) are not the bytes that were downloaded (they fail their "
                "download metadata): a manifest would record the damaged bytes as correct",
                fix=f"re-download them (clef-format verify {quote_path(path)} --deep lists them), or pass --force"))
        if differing:
            refusals.append(error(
                "manifest-refused", f"{len(differing)} file(s) differ from what {MANIFEST_NAME} recorded, and nothing "
                "else (no download metadata) says which bytes are right: a manifest would replace that record with "
                "the bytes as they are now", fix=f"if they are the bytes to keep (an intended edit, or a good copy "
                f"put back after `manifest --force` recorded other bytes), {remanifest(ck)}; otherwise copy them "
                f"again from the copy {MANIFEST_NAME} was made from (clef-format verify {quote_path(path)} --deep lists them)"))
        return make_report("manifest", path, layout, [*refusals, *bad], details)
    # --force writes past them, but says so: each error it was forced past stays in the report, a warning
    # now (a FIFO or an unsafe file is then simply not listed, a file that fails its reference recorded as
    # it is, and the user reads which)
    written_past = [f._replace(severity="warning", message=f"{f.message} (manifest written anyway: --force; the "
                                                           "manifest vouches for what it lists, nothing more)")
                    for f in errors + bad]
    tasks = [HashTask(rel, ck.path(rel), ALGORITHM, size) for rel, size in files.items()]
    results = hash_many(tasks, (progress or NO_PROGRESS).add(f"hashing {len(tasks)} file(s)", sum(files.values())))
    unreadable = [f"{r.key}: {r.error}" for r in results if r.digest is None]
    if unreadable:
        raise CouldNotRun("cannot read " + "; ".join(unreadable))
    digests = {r.key: r.digest for r in results if r.digest is not None}
    crashpoint("stage")
    changed = _changed_meanwhile(ck.root, before)
    if changed:
        shown = "; ".join(changed[:5]) + (f"; and {len(changed) - 5} more" if len(changed) > 5 else "")
        return make_report("manifest", path, layout, [error(
            "manifest-refused", f"{ck.root} changed while its files were hashed ({shown}): the manifest would "
            "describe them as they were; nothing was written",
            fix=f"clef-format manifest {quote_path(path)} again, once nothing else writes the checkpoint")], details)
    crashpoint("swap")
    try:
        target = write_manifest(ck.root, build_manifest(digests, files))
    except OSError as exc:
        raise CouldNotRun(f"cannot write the manifest in {ck.root}: {exc.strerror or exc}", code="unwritable",
                          fix="make the checkpoint directory writable, or run as its owner") from None
    crashpoint("cleanup")
    return make_report("manifest", path, layout, written_past, ManifestDetails(target, ALGORITHM, len(digests),
                                                                        sum(files.values())))


def _failing_references(ck: Any, files: dict[str, int], progress: Progress | None) -> tuple[list[Any], list[Any]]:
    """The errors of checking ``files`` against their references (``unreadable`` included), split in two:
    the bytes that are not what was downloaded (damage), and those that differ from the present manifest
    with no download reference to tell which is right.

    A file the present manifest lists is checked against it first (as ``verify --deep`` does); one that
    differs from it is checked again against its download metadata alone: when it matches, it is what was
    downloaded (a good copy put back after ``--force`` recorded damaged bytes, say), so it passes and is
    recorded as it is; when it fails, the damage is said against the download."""
    from clef_format.read.manifest import read_manifest
    from clef_format.verify.deep import ReferenceCheck, reference_findings

    bad = [f for f in reference_findings(ck, sorted(files), progress) if f.severity == "error"]
    listed, _ = read_manifest(ck)
    stale = {f.file for f in bad if f.code == "hash-mismatch" and listed is not None and f.file in listed}
    if not stale:
        return bad, []
    again = ReferenceCheck(ck, stale.__contains__, progress=progress, use_manifest=False)
    downloaded = [f for f in again.finish() if f.severity == "error"]  # those with download metadata that fail it
    damaged = [f for f in bad if f.file not in stale] + downloaded
    return damaged, [f for f in bad if f.file in stale and f.file not in again.refs]


def rewrite_manifest(source: Any, new_root: str, changed: set[str], always: bool = False) -> str | None:
    """The manifest of a tree migrate staged at ``new_root`` from ``source`` (a read Checkpoint): entries
    of unchanged files are kept from the source's manifest, changed or unlisted files are hashed.
    Written when the source had a manifest (or ``always``); returns its path, or ``None``.

    A manifest is checked before any other reference, so it never lists an unchanged file that keeps
    its own download metadata: hashing that file now would vouch for whatever bytes it holds (a
    download corrupted in transit would pass ``verify --deep`` from then on)."""
    from clef_format.read.checkpoint import read_checkpoint
    from clef_format.read.hf_cache import local_dir_etag
    from clef_format.read.manifest import read_manifest

    old, _ = read_manifest(source)
    if old is None and not always:
        return None
    new = read_checkpoint(new_root)
    files = manifest_files(new)
    digests: dict[str, str] = {}
    tasks = []
    for rel, size in files.items():
        entry = (old or {}).get(rel)
        if entry is not None and rel not in changed and entry.size == size:
            digests[rel] = entry.digest
        elif entry is None and rel not in changed and local_dir_etag(new_root, rel):
            continue  # checked against what was downloaded, not against itself
        else:
            tasks.append(HashTask(rel, new.path(rel), ALGORITHM, size))
    for r in hash_many(tasks):
        if r.digest is None:
            raise OSError(5, f"cannot hash {r.key} for the manifest: {r.error}")
        digests[r.key] = r.digest
    return write_manifest(new_root, build_manifest(digests, {rel: files[rel] for rel in digests}))
