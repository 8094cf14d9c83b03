"""The workspace of a run and its on-disk records: the target and the names beside it, the lock,
the journal (the on-disk contract of crash safety) and the source's fingerprint.

A run for target directory ``T`` (in place: the checkpoint itself; else ``--output``) works in a
sibling workspace ``.T.clef-migrate/`` and holds ``.T.clef-migrate.lock`` (``flock``; the kernel
drops it when the process dies, so a SIGKILL never leaves a stale lock).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from clef_format.errors import MigrateRefused
from clef_format.migrate import fsutil
from clef_format.migrate.crash import crashpoint
from clef_format.migrate.tree_state import is_record
from clef_format.read.checkpoint import Checkpoint
from clef_format.spec.workspace_names import LOCK_SUFFIX, WS_SUFFIX, is_workspace, workspace_owner

JOURNAL_VERSION = 1


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
        return os.path.join(self.parent, f".{os.path.basename(self.path)}{WS_SUFFIX}")

    @property
    def lock_path(self) -> str:
        return os.path.join(self.parent, f".{os.path.basename(self.path)}{LOCK_SUFFIX}")

    @property
    def journal_path(self) -> str:
        return os.path.join(self.ws, "journal.json")

    @property
    def new(self) -> str:
        return os.path.join(self.ws, "new")

    @property
    def old(self) -> str:
        return os.path.join(self.ws, "old")




def workspace_holding(path: str) -> tuple[str, str] | None:
    """(workspace, the target it belongs to) when ``path``, resolved, is a migrate workspace or lies inside
    one (``.T.clef-migrate/...``: an interrupted run's parked original or staged tree, where a shell that sat
    in the checkpoint during the swap now finds itself), else None."""
    here = os.path.realpath(path)
    while True:
        name = os.path.basename(here)
        owner = workspace_owner(name)
        if owner is not None and is_workspace(name):
            return here, os.path.join(os.path.dirname(here), owner)
        up = os.path.dirname(here)
        if up == here:
            return None
        here = up


#: What a run keeps at the top of its workspace: its journal (and the journal being written), the staged
#: or parked trees, and a tree being discarded (``swap._discard``). Anything else there is someone's.
RUN_ENTRIES = frozenset({"journal.json", "journal.json.tmp", "new", "old", "discard"})


def foreign_entries(ws: str) -> list[str]:
    """What a workspace without a journal holds that migrate cannot have left there. A run leaves a
    journal-less workspace only before its journal is first written (an empty ``new/``, a partial
    ``journal.json.tmp``) or after the cleanup removed the journal (empty): anything else is someone's
    data (an ``--output`` given that name, a user's copy) and is never deleted as litter."""
    out: list[str] = []

    def unlistable(exc: OSError) -> None:  # never delete what could not be looked at
        out.append(f"{os.path.relpath(exc.filename, ws) if exc.filename else '.'} (cannot be listed: {exc.strerror})")

    from clef_format.read.walk import walk

    def too_deep(path: str) -> None:  # nothing a run leaves nests that deep: someone's, never deleted
        out.append(f"{fsutil.short_rel(os.path.relpath(path, ws))} (nested too deep to be looked at)")

    for dirpath, dirnames, filenames in walk(ws, onerror=unlistable, too_deep=too_deep):
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), ws)
            if rel != "journal.json.tmp":
                out.append(rel)
        for name in dirnames:
            if os.path.islink(os.path.join(dirpath, name)):
                out.append(os.path.relpath(os.path.join(dirpath, name), ws))
    return sorted(out)


def name_too_long(target: Target) -> MigrateRefused | None:
    """The workspace and lock names beside ``T`` (``.T.clef-migrate.lock``: ``T`` plus 19 bytes) must fit the
    filesystem's name limit (255 bytes on ext4, xfs, btrfs, tmpfs). A folder named near the limit has no
    room for them: said as that, never as a lock file in the way (there is none)."""
    name = os.path.basename(target.lock_path)
    try:
        limit = os.pathconf(target.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    if len(os.fsencode(name)) <= limit:
        return None
    room = limit - (len(os.fsencode(name)) - len(os.fsencode(os.path.basename(target.path))))
    what = "the checkpoint's folder name" if target.in_place else "the --output name"
    return MigrateRefused(f"{what} is {len(os.fsencode(os.path.basename(target.path)))} bytes long: migrate keeps its "
                          f"workspace and lock beside it as .NAME{LOCK_SUFFIX}, which would pass this filesystem's "
                          f"limit of {limit} bytes per name; nothing was written",
                          f"rename the folder to a name of at most {room} bytes, then run migrate again"
                          if target.in_place else f"pick an --output whose name is at most {room} bytes")


def lock_holder(target: Target) -> str | None:
    """The pid a running migrate (or another writer of this tool) wrote in the lock it holds on ``target``;
    None when no process holds it (no lock, or a killed run's: the kernel released it)."""
    try:
        fd = os.open(target.lock_path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        import fcntl

        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return None
        except OSError:
            return os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
    finally:
        os.close(fd)


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
    from clef_format.read.paths import as_the_kernel_resolves

    out = as_the_kernel_resolves(output)
    if os.path.islink(out):
        out = os.path.realpath(out)
    return Target(os.path.join(os.path.realpath(os.path.dirname(out)), os.path.basename(out)), src, False)


def output_filled(target: Target) -> bool:
    """Whether the target holds something: a file, a link, or a folder with entries (an --output must be
    new or an empty folder; a resumed --output run is refused on the same test)."""
    return os.path.lexists(target.path) and (not os.path.isdir(target.path) or bool(os.listdir(target.path)))


# ---- lock ----------------------------------------------------------------------------------

class LockHeld(MigrateRefused):
    """Another migrate holds the lock now: the refusal of ``Lock`` that waiting ends."""


class LockUnmade(MigrateRefused):
    """The lock cannot be made or taken in that folder at all (read-only, no such folder, no flock): the
    refusal of ``Lock`` that only another place ends. ``manifest_writer.writer_lock`` gives each its own fix."""


class Lock:
    """An exclusive, non-blocking flock on the target's lock file; refused when another run holds it."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.fd: int | None = None

    def __enter__(self) -> "Lock":
        import fcntl

        from clef_format.read.hf_cache import cache_area

        path = self.target.lock_path
        too_long = name_too_long(self.target)
        if too_long:
            raise too_long
        area = cache_area(path)
        if area:
            raise MigrateRefused(f"{path} would lie inside a Hugging Face cache ({area}), which is never "
                                 "written", "use --output DIR outside the cache")
        for _ in range(5):
            foreign = foreign_lock(path)
            if foreign:
                raise MigrateRefused(f"cannot take the lock {path}: {foreign}; nothing was written",
                  f"move {path} away (it may be your data), then run the command again")
            try:  # never through a symlink, even one put there since the check above
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.EISDIR):
                    continue  # replaced between the check and the open: the check says what it is now
                raise LockUnmade(f"cannot create the lock {path}: {exc.strerror}",
                  "the directory (or its parent) is read-only: use --output DIR on a writable disk") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise LockUnmade(f"cannot take the lock {path}: {exc.strerror}; nothing was written",
                      "run it again; if it persists, the filesystem does not support flock: "
                      "use --output DIR on a local disk") from None
                try:
                    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                except OSError:
                    holder = "?"
                os.close(fd)
                raise LockHeld(f"another clef-format migrate (pid {holder}) is working on {self.target.path}",
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
                raise MigrateRefused(f"cannot record the lock {path}: {exc.strerror or exc}; nothing was "
                                     "written", "free the cause (disk, permissions) and run it again") from None
            if same:
                self.fd = fd
                crashpoint("lock")
                return self
            os.close(fd)  # the previous holder removed the file after we opened it: take the new one
        raise MigrateRefused(f"could not take the lock {path}")

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

class Phase(str, Enum):
    """Where a run stood when it last wrote its journal (the ``phase`` key, its string on disk)."""

    STAGING = "staging"  # building ws/new; resumable
    STAGED = "staged"  # ws/new complete and verified; the swap may be under way (``new_ino`` tells)
    SWAPPED = "swapped"  # the new tree is at the target; only the cleanup is left


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


@dataclass
class Journal:
    """The on-disk contract of crash safety: ``ws/journal.json``, one JSON object whose keys and
    their order are fixed (``to_json``). A field the file lacks, or holds with the wrong type, reads
    as None (or empty): such a journal decides like an unknown one, it never raises."""

    revision: str | None
    direction: str | None
    from_layout: str | None  # "from"
    to_layout: str | None  # "to"
    source: str | None
    target: str | None
    in_place: bool | None
    phase: Phase | None  # None: a value no run writes
    fingerprint: dict[str, list[int]] | None
    done: dict[str, int] = field(default_factory=dict)  # output rel -> size, each file finished
    quality: dict[str, dict[str, float]] = field(default_factory=dict)
    new_ino: list[int] | None = None  # [st_dev, st_ino] of ws/new, written with phase staged
    #: the staged tree's state (``tree_state.record``), written with phase staged: an ``--abort`` after the
    #: swap proves by it that the tree at the target is unchanged before deleting it. A journal without it
    #: (an older clef-format's) proves nothing: that abort is refused (``recovery``)
    new_tree: dict[str, list[int | None]] | None = None
    version: int = JOURNAL_VERSION

    @property
    def step(self) -> tuple[str | None, str | None]:
        """(revision, direction): the step the run was staging."""
        return self.revision, self.direction

    @property
    def phase_name(self) -> str:
        return "unknown" if self.phase is None else self.phase.value

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"version": self.version, "revision": self.revision, "direction": self.direction,
                               "from": self.from_layout, "to": self.to_layout, "source": self.source,
                               "target": self.target, "in_place": self.in_place,
                               "phase": None if self.phase is None else self.phase.value,
                               "fingerprint": self.fingerprint, "done": self.done, "quality": self.quality}
        if self.new_ino is not None:
            out["new_ino"] = self.new_ino
        if self.new_tree is not None:
            out["new_tree"] = self.new_tree
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Journal":
        phase = data.get("phase")
        in_place = data.get("in_place")
        new_ino, new_tree = data.get("new_ino"), data.get("new_tree")
        fp, done, quality = data.get("fingerprint"), data.get("done"), data.get("quality")
        return cls(revision=_text(data.get("revision")), direction=_text(data.get("direction")),
                   from_layout=_text(data.get("from")), to_layout=_text(data.get("to")),
                   source=_text(data.get("source")), target=_text(data.get("target")),
                   in_place=in_place if isinstance(in_place, bool) else None,
                   phase=Phase(phase) if phase in {p.value for p in Phase} else None,
                   fingerprint=fp if isinstance(fp, dict) else None,
                   done=done if isinstance(done, dict) else {}, quality=quality if isinstance(quality, dict) else {},
                   new_ino=new_ino if isinstance(new_ino, list) else None,
                   new_tree=new_tree if is_record(new_tree) else None,
                   version=data.get("version", JOURNAL_VERSION))


class NotRead:
    """The type of ``NOT_READ``: a journal argument the caller has not read (the callee reads it)."""


#: Default of a ``journal`` argument: read it from the workspace. A caller that has read it passes what
#: it read (None: there is none), so one call of migrate reads the journal once.
NOT_READ = NotRead()


def read_journal(target: Target) -> Journal | None:
    """The journal of the run at ``target``; None when there is none, or it is not one this version wrote."""
    try:
        with open(target.journal_path, "rb") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return Journal.from_json(data) if isinstance(data, dict) and data.get("version") == JOURNAL_VERSION else None


def write_journal(target: Target, journal: Journal) -> None:
    """Atomic: temp file, fsync, rename, fsync the workspace."""
    crashpoint("journal")
    tmp = target.journal_path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(journal.to_json(), fh, indent=1)
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


def remove_tree(path: str) -> None:
    """Delete a tree migrate made (workspace, old tree): iterative and by folder handles, so any depth and
    any path length; never below a mount point nor through a symlink (``migrate.remove``). A folder
    without write or search permission is opened up first (it is ours to delete); anything that still
    cannot go raises ``OSError``."""
    from clef_format.migrate.remove import delete_tree

    delete_tree(path)
