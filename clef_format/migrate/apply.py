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
(``CRASH_PHASES``: lock, journal, stage, verify, swap, cleanup; ``:INT`` sends SIGINT instead): the
crash-injection tests use it, and any other value is a usage error (``check_crash_env``).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
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
#: Every phase with crash points, in the order a run meets them (docs/MIGRATION.md lists them).
CRASH_PHASES = ("lock", "journal", "stage", "verify", "swap", "cleanup")
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


def check_crash_env() -> None:
    """A ``CLEF_FORMAT_CRASH_AT`` that names no crash point is a usage error, never silently ignored:
    ``<phase>[:<n>[:INT]]``, phase one of ``CRASH_PHASES``, n a positive integer (default 1)."""
    from clef_format.errors import UsageError

    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    phase, _, rest = spec.partition(":")
    n, _, sig = rest.partition(":")
    count_ok = n == "" or (n.isascii() and n.isdigit() and int(n) >= 1)
    if phase not in CRASH_PHASES or not count_ok or sig not in ("", "INT"):
        raise UsageError(f"{CRASH_ENV}={spec!r} names no crash point: it takes <phase>[:<n>[:INT]], phase one of "
                         f"{', '.join(CRASH_PHASES)}, n a positive integer",
                         fix=f"unset {CRASH_ENV} (it is for the crash-injection tests), or set e.g. {CRASH_ENV}=stage:2")


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
        return os.path.join(self.parent, f".{os.path.basename(self.path)}{_WS_SUFFIX}")

    @property
    def lock_path(self) -> str:
        return os.path.join(self.parent, f".{os.path.basename(self.path)}{_LOCK_SUFFIX}")

    @property
    def journal_path(self) -> str:
        return os.path.join(self.ws, "journal.json")

    @property
    def new(self) -> str:
        return os.path.join(self.ws, "new")

    @property
    def old(self) -> str:
        return os.path.join(self.ws, "old")


_WS_SUFFIX, _LOCK_SUFFIX = ".clef-migrate", ".clef-migrate.lock"


def workspace_owner(name: str) -> str | None:
    """The target name whose workspace or lock ``name`` is (``.T.clef-migrate[.lock]`` -> ``T``), else None.
    The one home of the naming rule: such a name is migrate's, never a place for a user's folder."""
    for suffix in (_LOCK_SUFFIX, _WS_SUFFIX):
        if name.startswith(".") and name.endswith(suffix) and len(name) > len(suffix) + 1:
            return name[1:-len(suffix)]
    return None


def foreign_entries(ws: str) -> list[str]:
    """What a workspace without a journal holds that migrate cannot have left there. A run leaves a
    journal-less workspace only before its journal is first written (an empty ``new/``, a partial
    ``journal.json.tmp``) or after the cleanup removed the journal (empty): anything else is someone's
    data (an ``--output`` given that name, a user's copy) and is never deleted as litter."""
    out: list[str] = []

    def unlistable(exc: OSError) -> None:  # never delete what could not be looked at
        out.append(f"{os.path.relpath(exc.filename, ws) if exc.filename else '.'} (cannot be listed: {exc.strerror})")

    for dirpath, dirnames, filenames in os.walk(ws, onerror=unlistable):
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), ws)
            if rel != "journal.json.tmp":
                out.append(rel)
        for name in dirnames:
            if os.path.islink(os.path.join(dirpath, name)):
                out.append(os.path.relpath(os.path.join(dirpath, name), ws))
    return sorted(out)


def foreign_lock(path: str) -> str | None:
    """Why what lies at a lock path is not a lock migrate may take (None: nothing there, or a lock file).
    A lock migrate wrote is a regular file holding a pid; a symlink is never followed (it could lead to
    anyone's file, which taking the lock would truncate), and any other content is someone's data."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"it cannot be examined ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return "a symlink has the name migrate keeps for its lock"
    if stat.S_ISDIR(st.st_mode):
        return "a directory has the name migrate keeps for its lock"
    if not stat.S_ISREG(st.st_mode):
        return "something other than a file has the name migrate keeps for its lock"
    if st.st_size > 64:
        return f"a file of {st.st_size} bytes has the name migrate keeps for its lock (a lock holds only a pid)"
    try:
        with open(path, "rb") as fh:
            content = fh.read(65)
    except OSError as exc:
        return f"it cannot be read ({exc.strerror})"
    if content.strip() and not content.strip().isdigit():
        return "a file that is not a lock (it holds more than a pid) has the name migrate keeps for its lock"
    return None


def make_target(source: str, output: str | None) -> Target:
    """Both ends resolved: a symlinked checkpoint or ``--output`` is the folder it leads to (so the
    workspace lands beside that folder, and a symlink is never swapped away in its place)."""
    src = os.path.realpath(source)
    if output is None:
        return Target(src, src, True)
    out = os.path.abspath(output)
    if os.path.islink(out):
        out = os.path.realpath(out)
    return Target(os.path.join(os.path.realpath(os.path.dirname(out)), os.path.basename(out)), src, False)


# ---- lock ----------------------------------------------------------------------------------

class Lock:
    """An exclusive, non-blocking flock on the target's lock file; refused when another run holds it."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.fd: int | None = None

    def __enter__(self) -> "Lock":
        import fcntl

        from clef_format.read.hf_cache import cache_area

        path = self.target.lock_path
        area = cache_area(path)
        if area:
            raise Refused("migrate-refused", f"{path} would lie inside a Hugging Face cache ({area}), which is never "
                                             "written", "use --output DIR outside the cache")
        for _ in range(5):
            foreign = foreign_lock(path)
            if foreign:
                raise Refused("migrate-refused", f"cannot take the lock {path}: {foreign}; nothing was written",
                              f"move {path} away (it may be your data), then run clef-format migrate again")
            try:  # never through a symlink, even one put there since the check above
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.EISDIR):
                    continue  # replaced between the check and the open: the check says what it is now
                raise Refused("migrate-refused", f"cannot create the lock {path}: {exc.strerror}",
                              "the directory (or its parent) is read-only: use --output DIR on a writable disk") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise Refused("migrate-refused", f"cannot take the lock {path}: {exc.strerror}; nothing was written",
                                  "run it again; if it persists, the filesystem does not support flock: "
                                  "use --output DIR on a local disk") from None
                try:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                except OSError:
                    holder = "?"
                os.close(fd)
                raise Refused("migrate-refused",
                              f"another clef-format migrate (pid {holder}) is working on {self.target.path}",
                              "wait for it to finish; a killed run's lock is released by the kernel") from None
            try:
                try:
                    same = os.fstat(fd).st_ino == os.stat(path).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, str(os.getpid()).encode(), 0)
            except OSError as exc:
                self._drop(fd)
                raise Refused("migrate-refused", f"cannot record the lock {path}: {exc.strerror or exc}; nothing was "
                                                 "written", "free the cause (disk, permissions) and run it again") from None
            if same:
                self.fd = fd
                crashpoint("lock")
                return self
            os.close(fd)  # the previous holder removed the file after we opened it: take the new one
        raise Refused("migrate-refused", f"could not take the lock {path}")

    def _drop(self, fd: int) -> None:
        """Give up a lock taken but not recorded: remove its file (still held, so no other run has it)."""
        try:
            os.unlink(self.target.lock_path)
        except OSError:
            pass
        os.close(fd)

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
    """The source's state: size, mtime and inode of every file; a journal only resumes on the same
    state. The inode tells a file replaced by another of the same size and mtime (a re-download or
    copy that keeps times, renamed into place); an edit in place that restores the mtime is not seen."""
    out = {}
    for rel in sorted(ck.files):
        st = os.stat(ck.path(rel))
        out[rel] = [st.st_size, st.st_mtime_ns, st.st_ino]
    return out


def _rmtree(path: str) -> None:
    """Delete a tree migrate made (workspace, old tree). A folder without write or search permission
    is opened up first (it is ours to delete); anything that still cannot go raises ``OSError``."""
    if not os.path.lexists(path):
        return
    failed: list[BaseException] = []

    def onexc(func: Any, p: str, exc: Any) -> None:
        err = exc[1] if isinstance(exc, tuple) else exc
        if func in (os.rmdir, os.unlink, os.remove) or func is os.lstat:
            target = os.path.dirname(p)
        else:  # os.open / os.scandir of the folder itself could not list it
            target = p
        try:
            if not os.path.islink(target):
                os.chmod(target, 0o700)
        except OSError:
            failed.append(err)

    for _ in range(3):
        failed.clear()
        shutil.rmtree(path, onerror=onexc)
        if not os.path.lexists(path):
            return
    err = failed[0] if failed else None
    if isinstance(err, OSError):
        raise OSError(err.errno, f"cannot delete {path}: {err.strerror}", err.filename)
    raise OSError(errno.ENOTEMPTY, f"cannot delete {path}", path)


def _discard(target: Target, path: str) -> None:
    """Remove a parked tree: renamed aside first (one atomic step), then deleted, so a tree still at
    ``new`` or ``old`` is always complete and ``--abort`` can always put it back."""
    if not os.path.lexists(path):
        return
    doomed = os.path.join(target.ws, "discard")
    _rmtree(doomed)  # what an earlier, interrupted cleanup had begun to delete
    os.rename(path, doomed)
    fsutil.fsync_dir(target.ws)  # the rename is durable before any deletion: a tree at new/old stays whole
    _rmtree(doomed)


def _cleanup(target: Target) -> None:
    crashpoint("cleanup")
    _discard(target, target.new)
    crashpoint("cleanup")
    _discard(target, target.old)
    try:
        os.unlink(target.journal_path)
    except FileNotFoundError:
        pass
    crashpoint("cleanup")
    _rmtree(target.ws)
    try:
        fsutil.fsync_dir(target.parent)  # persists only the empty workspace's removal: the swap was fsynced
    except OSError:
        pass


def _swapped(target: Target, journal: dict[str, Any]) -> bool:
    try:
        st = os.stat(target.path)
    except FileNotFoundError:
        return False
    return [st.st_dev, st.st_ino] == journal.get("new_ino")


class SwapFailed(OSError):
    """The swap did not happen and was undone: the target is exactly as it was, the workspace removed."""


class CleanupIncomplete(OSError):
    """The new tree is in place (the migration is done) but removing what it replaced failed; the
    journal says ``swapped`` so the next call finishes the cleanup."""


def _put_back(target: Target) -> None:
    """Undo half a fallback swap: the parked old tree goes back to ``T``."""
    if not os.path.lexists(target.path) and os.path.isdir(target.old):
        os.rename(target.old, target.path)
    elif not target.in_place and not os.path.lexists(target.path):
        os.mkdir(target.path)


def _exchange(target: Target) -> None:
    if os.path.isdir(target.path) and not os.path.islink(target.path):
        try:
            fsutil.exchange(target.new, target.path)
            return
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EPERM):
                raise
        if not target.in_place:
            os.rmdir(target.path)  # refused earlier unless empty
        else:
            os.rename(target.path, target.old)
            fsutil.fsync_dir(target.ws)  # the old tree is safe in the workspace before the new one takes its name
            crashpoint("swap")
    os.rename(target.new, target.path)


def _swap(target: Target, journal: dict[str, Any]) -> None:
    """Swap the staged tree in. A failure before the new tree is in place is undone (``SwapFailed``);
    one after it (fsync, journal) leaves a finished migration whose cleanup the next call completes."""
    crashpoint("swap")
    try:
        _exchange(target)
    except OSError as exc:
        cause = exc.strerror or str(exc)
        try:
            _put_back(target)
        except OSError as undo:
            raise SwapFailed(exc.errno, f"swapping the new tree into {target.path} failed ({cause}) and putting the "
                                        f"old one back failed too ({undo.strerror}); the complete old tree is in "
                                        f"{target.old} and the new one in {target.new}: rerun clef-format migrate "
                                        "to finish, or --abort to restore the old one") from None
        try:
            _rmtree(target.ws)
        except OSError as rm:
            raise SwapFailed(exc.errno, f"swapping the new tree into {target.path} failed: {cause}; the checkpoint "
                                        f"is unchanged, but the workspace {target.ws} could not be removed "
                                        f"({rm.strerror}): rerun with --abort") from None
        raise SwapFailed(exc.errno, f"swapping the new tree into {target.path} failed: {cause}; nothing was changed "
                                    "and the new files were removed") from None
    try:
        fsutil.fsync_dir(target.parent)
        fsutil.fsync_dir(target.ws)  # an exchange renamed in both directories: both durable before the journal
        crashpoint("swap")
        journal["phase"] = "swapped"
        write_journal(target, journal)
    except OSError as exc:
        raise CleanupIncomplete(exc.errno, f"the new tree is in place at {target.path}, but recording it failed "
                                           f"({exc.strerror or exc}): rerun clef-format migrate to finish") from None


def _cleanup_or_say(target: Target) -> None:
    try:
        _cleanup(target)
    except OSError as exc:
        raise CleanupIncomplete(exc.errno, f"the migration is complete ({target.path} holds the new tree), but "
                                           f"removing the old files in {target.ws} failed: {exc.strerror or exc}; "
                                           "rerun clef-format migrate to finish the cleanup") from None


#: ``wanted`` when the caller does not say which step it is about to run (it resumes any staging).
ANY_STEP = ("*", "*")


def _decide(target: Target, source_ck: Checkpoint | None, abort: bool, wanted: tuple[str, str] | None = ANY_STEP
            ) -> tuple[str, str, dict[str, Any] | None] | None:
    """What ``recover`` will do about an interrupted run: (action, what it says, journal), or None.
    ``wanted``: the (revision, direction) this run is about to stage, None when it has nothing to do: a
    staging of another step, or of a source that changed since, is rolled back, never "resumed".

    Pure (it only reads): ``--dry-run`` reports the same decision that a real run carries out.
    """
    if not os.path.lexists(target.ws):
        return None
    journal = read_journal(target)
    if journal is None:
        foreign = foreign_entries(target.ws) if os.path.isdir(target.ws) and not os.path.islink(target.ws) else ["."]
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise Refused("migrate-refused", f"{target.ws} is where migrate keeps its workspace, but it holds what no "
                                             f"migrate run leaves there ({shown}) and no journal: nothing was changed "
                                             "or removed", f"move {target.ws} away (it may be your data), then run "
                                                           "clef-format migrate again")
        return "remove", "removed an interrupted run's workspace (it held no journal, so nothing in it was needed)", None
    phase = journal.get("phase")
    what = f"{journal.get('revision')} {journal.get('direction')}"
    other = wanted != ANY_STEP and wanted != (journal.get("revision"), journal.get("direction"))
    if other and phase != "staging" and not abort:
        # this run goes elsewhere (e.g. back to the layout the interrupted one started from): finishing
        # the interrupted step first would discard the original tree only to rebuild it from the result
        # (int8 tables decoded, not the original BF16); undo it instead, exactly as --abort does
        decided = _decide(target, source_ck, True, ANY_STEP)
        if decided is not None and decided[0] != "cleanup":
            return decided[0], f"{decided[1]} (this run goes to another layout)", decided[2]
        return decided
    swapped = phase == "swapped" or (phase == "staged" and _swapped(target, journal))
    parked = os.path.isdir(target.new) or os.path.isdir(target.old)  # complete by construction (_discard)
    made_output = journal.get("in_place") is False and not parked  # an --output that did not exist before
    if swapped and abort and parked:
        return "unswap", (f"rolled back the interrupted migration {what}: it had swapped its new tree in, and the "
                          f"original tree, still complete in the workspace, is back at {target.path}"), journal
    if swapped and abort and made_output:
        return "unswap", (f"rolled back the interrupted migration {what}: removed the output {target.path} it had "
                          "created (the source was never changed)"), journal
    if swapped:
        note = f"the interrupted migration {what} had completed; finished its cleanup"
        if abort:
            note += (" (it cannot be rolled back: its cleanup had already removed the original tree; "
                     "migrate --to the previous layout goes back)")
        return "cleanup", note, journal
    if phase == "staged" and not os.path.lexists(target.path) and os.path.isdir(target.old):
        if abort:
            return "unswap", (f"rolled back the interrupted migration {what}: the original tree is back at "
                              f"{target.path}"), journal
        return "finish-fallback", f"finished the interrupted migration {what} (its new tree was complete)", journal
    if abort:
        return "remove", f"rolled back the interrupted migration {what}; the checkpoint was never changed", journal
    if phase == "staged" and source_ck is not None and journal.get("fingerprint") == fingerprint(source_ck):
        return "swap", f"finished the interrupted migration {what} (its new tree was complete and verified)", journal
    if phase == "staging" and source_ck is not None and journal.get("fingerprint") != fingerprint(source_ck):
        return "remove", f"rolled back the interrupted migration {what}: the checkpoint changed since", journal
    if phase == "staging" and wanted != ANY_STEP and wanted != (journal.get("revision"), journal.get("direction")):
        now = "has nothing to do" if wanted is None else f"runs {wanted[0]} {wanted[1]}"
        return "remove", f"rolled back the interrupted migration {what}: this run {now}, so none of it was needed", journal
    if phase == "staging":
        return "resume", f"resuming the interrupted migration {what}", journal
    return "remove", f"rolled back the interrupted migration {what}: the checkpoint changed since", journal


def can_roll_back(target: Target) -> bool:
    """Whether ``--abort`` would undo the interrupted run at ``target`` (not once its cleanup began
    removing the original tree: then it can only be finished)."""
    decided = _decide(target, None, True)
    return decided is None or decided[0] != "cleanup"


def pending_recovery(target: Target, source_ck: Checkpoint | None, abort: bool = False,
                     wanted: tuple[str, str] | None = ANY_STEP) -> str | None:
    """What the next run (with ``abort``) will do about an interrupted one, said before doing it."""
    decided = _decide(target, source_ck, abort, wanted)
    return None if decided is None or decided[0] == "resume" else decided[1]


def _unswap(target: Target) -> None:
    """Put the original tree back where it was, the new one into the workspace (then removed)."""
    if os.path.isdir(target.new) and os.path.lexists(target.path):
        fsutil.exchange(target.new, target.path)  # the exchange of the swap, done again
        fsutil.fsync_dir(target.parent)
        fsutil.fsync_dir(target.ws)
    elif os.path.isdir(target.old):  # the fallback swap: the original was renamed aside
        if os.path.lexists(target.path):
            os.rename(target.path, target.new)
            fsutil.fsync_dir(target.ws)
        os.rename(target.old, target.path)
        fsutil.fsync_dir(target.parent)
    elif os.path.lexists(target.path):  # an output that did not exist before (the journal says out of place)
        os.rename(target.path, target.new)
        fsutil.fsync_dir(target.parent)
    _rmtree(target.ws)
    fsutil.fsync_dir(target.parent)


def recover(target: Target, source_ck: Checkpoint | None, abort: bool = False,
            wanted: tuple[str, str] | None = ANY_STEP) -> str | None:
    """Deal with an interrupted run before anything else (the lock is held). Returns what was done."""
    decided = _decide(target, source_ck, abort, wanted)
    if decided is None:
        return None
    action, note, journal = decided
    if action == "remove":
        _rmtree(target.ws)
    elif action == "unswap":
        _unswap(target)
    elif action == "cleanup":
        assert journal is not None
        if journal.get("phase") == "staged":
            journal["phase"] = "swapped"
            write_journal(target, journal)
        _cleanup_or_say(target)
    elif action == "finish-fallback":
        assert journal is not None
        os.rename(target.new, target.path)  # killed between the two renames of the fallback swap
        fsutil.fsync_dir(target.parent)
        journal["phase"] = "swapped"
        write_journal(target, journal)
        _cleanup_or_say(target)
    elif action == "swap":
        assert journal is not None
        _swap(target, journal)
        _cleanup_or_say(target)
    return note


# ---- preflight: everything checked before anything is written (the dry run runs the same) ----------

_SPECIAL = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"))


def survey_source(root: str, in_place: bool) -> list[str]:
    """Every entry of the source (rel paths, sorted), each proven carriable: folders listed, files
    readable, no special file. In place the old tree is deleted after the swap, so every folder must
    also be one this process may empty. Raises ``CouldNotRun`` (unreadable) or ``Refused``."""
    from clef_format.errors import CouldNotRun

    entries: list[str] = []
    fix = "make it readable (chmod / chown), or run as a user who can read the whole checkpoint"
    me = os.geteuid()

    def walk(dirpath: str, rel_dir: str) -> None:
        try:
            with os.scandir(dirpath) as it:
                items = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            raise CouldNotRun(f"{rel_dir or '.'} cannot be listed: {exc.strerror or exc}; nothing was written",
                              fix=fix) from None
        if in_place and rel_dir and not os.access(dirpath, os.W_OK | os.X_OK):
            try:
                owner = os.lstat(dirpath).st_uid
            except OSError:
                owner = -1
            if owner != me:
                raise Refused("migrate-refused", f"{rel_dir} is not writable by this user (owner uid {owner}): after "
                                                 "the swap the old copy of it could not be removed; nothing was written",
                              "make it writable (chown / chmod), or use --output DIR") from None
        for item in items:
            rel = f"{rel_dir}/{item.name}" if rel_dir else item.name
            if not in_place and not rel_dir and item.name == ".cache":
                continue  # download metadata: not carried out of place
            try:
                st = os.lstat(item.path)
            except OSError as exc:
                raise CouldNotRun(f"{rel} cannot be read: {exc.strerror or exc}; nothing was written", fix=fix) from None
            entries.append(rel)
            if stat.S_ISDIR(st.st_mode):
                walk(item.path, rel)
            elif stat.S_ISREG(st.st_mode):
                try:
                    os.close(os.open(item.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW))
                except OSError as exc:
                    raise CouldNotRun(f"{rel} cannot be read: {exc.strerror or exc}; nothing was written",
                                      fix=fix) from None
            elif not stat.S_ISLNK(st.st_mode):
                kind = next((name for test, name in _SPECIAL if test(st.st_mode)), "a special file")
                raise Refused("migrate-refused", f"{rel} is {kind}: migrate carries only regular files, folders and "
                                                 "symlinks, and never reads or drops anything else; nothing was written",
                              f"move {rel} out of the checkpoint, then run migrate again")

    walk(root, "")
    return entries


def _lock_held(target: Target) -> bool:
    import fcntl

    try:
        fd = os.open(target.lock_path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def preflight(target: Target, plan: Plan | None, snapshot: bool, check_lock: bool) -> list[Refused]:
    """Why the write would fail, found before it starts: read-only places, a target that cannot be
    swapped by rename (a mount point, another filesystem), a lock held, not enough space."""
    out: list[Refused] = []
    parent = target.parent
    if not os.path.isdir(parent):
        return [Refused("migrate-refused", f"{parent} does not exist", "create the parent folder of --output first")]
    exists = os.path.lexists(target.path)
    use_output = "use --output DIR (a new folder) on a writable disk"
    try:
        ro = bool(os.statvfs(parent).f_flag & os.ST_RDONLY)
    except OSError:
        ro = False
    if ro:
        out.append(Refused("migrate-refused", f"{parent} is on a read-only filesystem; nothing was written", use_output))
    elif not os.access(parent, os.W_OK | os.X_OK):
        out.append(Refused("migrate-refused", f"{parent} is read-only for this user: the workspace and lock beside "
                                              f"{os.path.basename(target.path)} cannot be created; nothing was written",
                           use_output if target.in_place else "pick a writable --output"))
    if exists:
        if os.path.ismount(target.path):
            out.append(Refused("migrate-refused", f"{target.path} is a mount point: the new tree cannot replace it by "
                                                  "rename; nothing was written",
                               "use --output DIR (a new folder inside it or elsewhere)" if target.in_place
                               else "pick an --output that is a new folder"))
        else:
            try:
                cross = os.stat(target.path).st_dev != os.stat(parent).st_dev
            except OSError:
                cross = False
            if cross:
                out.append(Refused("migrate-refused", f"{target.path} is on another filesystem than {parent}: it cannot "
                                                      "be swapped by rename; nothing was written", use_output))
        if not os.access(target.path, os.W_OK | os.X_OK):
            out.append(Refused("migrate-refused", f"{target.path} is read-only for this user; nothing was written",
                               use_output if target.in_place else "pick a writable --output"))
    foreign = foreign_lock(target.lock_path) if check_lock else None
    if foreign:
        out.append(Refused("migrate-refused", f"cannot take the lock {target.lock_path}: {foreign}; nothing was written",
                           f"move {target.lock_path} away (it may be your data), then run clef-format migrate again"))
    elif check_lock and _lock_held(target):
        out.append(Refused("migrate-refused", f"another clef-format migrate is working on {target.path}",
                           "wait for it to finish; a killed run's lock is released by the kernel"))
    if plan is not None and not out:
        try:
            check_space(plan, target, snapshot)
        except Refused as exc:
            out.append(exc)
    return out


# ---- the run -------------------------------------------------------------------------------

@dataclass
class Result:
    quality: dict[str, dict[str, float]] = field(default_factory=dict)
    carried_by: dict[str, int] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per phase and per written file
    entries: dict[str, int] = field(default_factory=dict)  # user entries before and after


def carried_by_link(target: Target, snapshot: bool) -> bool:
    return target.in_place  # out of place, files are reflinked or copied: never a shared inode


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
    for dirpath, dirnames, filenames in os.walk(root):
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
        _rmtree(target.ws)
    except OSError as rm:
        if isinstance(exc, OSError):
            exc.strerror = (f"{exc.strerror or exc}; the workspace {target.ws} could not be removed "
                            f"({rm.strerror}): rerun clef-format migrate, or --abort")


def run_plan(plan: Plan, ck: Checkpoint, target: Target, progress: Progress | None = None,
             workers: int = 2) -> Result:
    """Stage, verify, swap, clean up. Raises ``OSError`` (rolled back: the original is intact) on failure."""
    progress = progress or NO_PROGRESS
    result = Result()
    t0 = time.perf_counter()
    entries = survey_source(ck.root, target.in_place)  # proves every entry can be carried, before any write
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
        result.entries = _check_carried(entries, plan, target)
        refresh_references(plan, ck, target.new, out_of_place=not target.in_place)
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
    except BaseException as exc:
        _roll_back(target, exc)  # nothing outside the workspace was touched
        raise
    t2 = time.perf_counter()
    _swap(target, journal)
    t3 = time.perf_counter()
    _cleanup_or_say(target)
    result.seconds["swap"] = round(t3 - t2, 3)
    result.seconds["cleanup"] = round(time.perf_counter() - t3, 3)
    return result
