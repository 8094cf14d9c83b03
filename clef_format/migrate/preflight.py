"""Preflight: everything checked before anything is written (the dry run runs the same)."""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from clef_format.errors import MigrateRefused
from clef_format.migrate.plan import Plan
from clef_format.migrate.tree_state import Identity, TreeState
from clef_format.migrate.workspace import Target, foreign_lock
from clef_format.shell import quote_path


_SPECIAL = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"))


def _mount_refusal(root: str, inner: list[str], in_place: bool) -> MigrateRefused | None:
    """A mount boundary is never crossed: a filesystem or bind mount below the checkpoint holds files
    of another disk (in place, the old tree's deletion would empty it; out of place, its files would
    be copied as if they were the checkpoint's), and a checkpoint that is itself a mount point cannot
    be replaced by rename. Refused before anything is written; the dry run says the same."""
    from clef_format.migrate.tree_state import is_mount_point

    if inner:
        more = f" (and {len(inner) - 1} more)" if len(inner) > 1 else ""
        return MigrateRefused(f"{inner[0]} is a mount point inside the checkpoint{more}: migrate never crosses a mount "
                              "(in place, deleting the old tree would empty the mounted folder); nothing was written",
                              f"unmount {os.path.join(root, inner[0])} (or copy its files into the checkpoint as "
                              "plain files), then run migrate again")
    if in_place and is_mount_point(root):
        return MigrateRefused(f"{root} is a mount point: the new tree cannot replace it by rename; nothing was written",
                              "use --output DIR (a new folder inside it or elsewhere)")
    return None


@dataclass(frozen=True)
class Survey:
    """One walk of the source, before anything is written: every entry (rel paths, in walk order), the
    tree's state (``tree_state``: what the recheck before the swap compares with; None when a part
    could not be looked at) and why the tree cannot be carried, if it cannot (raised by ``check``,
    where the run asks, so the order of refusals is the one the user sees)."""

    entries: list[str]
    state: TreeState | None
    refusal: Exception | None

    def check(self) -> list[str]:
        """The entries, each proven carriable; raises ``CouldNotRun`` (unreadable) or ``MigrateRefused``."""
        if self.refusal is not None:
            raise self.refusal
        return self.entries


def survey(root: str, in_place: bool) -> Survey:
    """Walk the source once: list every folder, ``lstat`` every entry, open every file (proves it
    readable), find the mount points below it (never crossed) and record the state. In place the old
    tree is deleted after the swap, so every folder must also be one this process may empty. Out of
    place the top-level ``.cache`` (download metadata) is not carried, so not surveyed."""
    from clef_format.errors import CouldNotRun
    from clef_format.migrate.tree_state import identity, mount_table

    real = os.path.realpath(root)
    skip_top = frozenset() if in_place else frozenset({".cache"})
    entries: list[str] = []
    ids: dict[str, Identity] = {}
    listings: dict[str, tuple[str, ...]] = {}
    problems: list[Exception] = []  # the first, in walk order, is the one raised
    unseen: list[OSError] = []  # what keeps the state from being whole
    table = mount_table(real)
    mounts: list[str] = [os.path.relpath(m, real) for m in table]
    fix = "make it readable (chmod / chown), or run as a user who can read the whole checkpoint"
    me = os.geteuid()
    try:
        root_st = os.lstat(real)
        ids["."] = identity(root_st)
        dev = root_st.st_dev
    except OSError as exc:
        unseen.append(exc)
        dev = -1

    from clef_format.migrate.fsutil import TreeTooDeep, short_rel
    from clef_format.read.walk import MAX_DEPTH

    def listed(dirpath: str, rel_dir: str) -> list[os.DirEntry[str]] | None:
        """The folder's entries (sorted), recorded; None when it cannot be listed (a problem recorded)."""
        try:
            with os.scandir(dirpath) as it:
                items = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            unseen.append(exc)
            if exc.errno == errno.ENAMETOOLONG:
                problems.append(MigrateRefused(
                    f"{short_rel(rel_dir)} has a path longer than this system opens ({len(dirpath)} bytes; PATH_MAX "
                    "is 4096): migrate cannot carry it; nothing was written",
                    f"shorten the folder names under {rel_dir.split('/', 1)[0][:100]}, then run migrate again"))
            else:
                problems.append(CouldNotRun(f"{short_rel(rel_dir or '.')} cannot be listed: {exc.strerror or exc}; "
                                            "nothing was written", fix=fix))
            return None
        if not rel_dir:
            items = [i for i in items if i.name not in skip_top]
        listings[rel_dir or "."] = tuple(i.name for i in items)
        if in_place and rel_dir and not os.access(dirpath, os.W_OK | os.X_OK):
            try:
                owner = os.lstat(dirpath).st_uid
            except OSError:
                owner = -1
            if owner != me:
                problems.append(MigrateRefused(f"{rel_dir} is not writable by this user (owner uid {owner}): after "
                                               "the swap the old copy of it could not be removed; nothing was written",
                                               "make it writable (chown / chmod), or use --output DIR"))
        return items

    def walk(top: str) -> None:
        """Every entry in walk order (a folder's entries right after it), with an explicit stack: a folder
        nested ~1,000 deep is a refusal at the reader's depth limit, never a RecursionError."""
        first = listed(top, "")
        stack = [("", 0, iter(first))] if first is not None else []
        while stack:
            rel_dir, depth, items = stack[-1]
            item = next(items, None)
            if item is None:
                stack.pop()
                continue
            rel = f"{rel_dir}/{item.name}" if rel_dir else item.name
            try:
                st = os.lstat(item.path)
            except OSError as exc:
                unseen.append(exc)
                problems.append(CouldNotRun(f"{short_rel(rel)} cannot be read: {exc.strerror or exc}; nothing was "
                                            "written", fix=fix))
                continue
            ids[rel] = identity(st)
            entries.append(rel)
            if stat.S_ISDIR(st.st_mode):
                if item.path in table:
                    continue  # listed by the mount table: never entered
                if st.st_dev != dev or os.path.ismount(item.path):
                    mounts.append(rel)
                    continue
                if depth + 1 > MAX_DEPTH:
                    deep = TreeTooDeep(item.path, real)
                    unseen.append(deep)
                    problems.append(MigrateRefused(
                        f"{deep.strerror} (tree-too-deep): migrate carries no folder below that; nothing was written",
                        f"remove the deeply nested folders under {rel.split('/', 1)[0]}, then run migrate again"))
                    continue
                inner = listed(item.path, rel)
                if inner is not None:
                    stack.append((rel, depth + 1, iter(inner)))
            elif stat.S_ISREG(st.st_mode):
                try:
                    os.close(os.open(item.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW))
                except OSError as exc:
                    problems.append(CouldNotRun(f"{short_rel(rel)} cannot be read: {exc.strerror or exc}; nothing "
                                                "was written", fix=fix))
            elif not stat.S_ISLNK(st.st_mode):
                kind = next((name for test, name in _SPECIAL if test(st.st_mode)), "a special file")
                problems.append(MigrateRefused(f"{rel} is {kind}: migrate carries only regular files, folders and "
                                               "symlinks, and never reads or drops anything else; nothing was written",
                                               f"move {rel} out of the checkpoint, then run migrate again"))

    if not unseen:
        walk(real)
    else:  # the root itself cannot be looked at: say it as a listing would
        problems.append(CouldNotRun(f". cannot be listed: {unseen[0].strerror or unseen[0]}; nothing was written",
                                    fix=fix))
    refusal = _mount_refusal(root, sorted(set(mounts)), in_place) or (problems[0] if problems else None)
    state = None if unseen or refusal is not None else TreeState(real, ids, listings)
    return Survey(entries, state, refusal)


def survey_source(root: str, in_place: bool) -> list[str]:
    """Every entry of the source (rel paths, in walk order), each proven carriable (``survey``).
    Raises ``CouldNotRun`` (unreadable) or ``MigrateRefused``."""
    return survey(root, in_place).check()


def lock_held(target: Target) -> bool:
    """Whether another process holds the target's migrate lock (the manifest writer waits for it too)."""
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


def _read_only_in_workspace(target: Target) -> str | None:
    """The first folder of an interrupted run's workspace this user cannot write (the workspace itself, or
    a folder of its staged tree, ``new/``), else None: resuming writes there and a rollback removes it, and
    either would stop half-way with "Permission denied". Only folders: the files of a staged or parked
    tree may be hard links to the checkpoint's own, whose modes a ``chmod -R`` would change. The parked
    original of the fallback swap (``old/``) is not looked at."""
    for top, dirs, _ in os.walk(target.ws):
        if not os.access(top, os.W_OK | os.X_OK):
            return top
        if top == target.ws:
            dirs[:] = [d for d in dirs if d == "new"]
    return None


def preflight(target: Target, plan: Plan | None, snapshot: bool, check_lock: bool) -> list[MigrateRefused]:
    """Why the write would fail, found before it starts: read-only places, a target that cannot be
    swapped by rename (a mount point, another filesystem), a lock held, not enough space."""
    from clef_format.migrate.workspace import name_too_long

    out: list[MigrateRefused] = []
    parent = target.parent
    if not os.path.isdir(parent):
        return [MigrateRefused(f"{parent} does not exist", "create the parent folder of --output first")]
    too_long = name_too_long(target)
    if too_long:
        return [too_long]
    exists = os.path.lexists(target.path)
    use_output = "use --output DIR (a new folder) on a writable disk"
    try:
        ro = bool(os.statvfs(parent).f_flag & os.ST_RDONLY)
    except OSError:
        ro = False
    name = os.path.basename(target.path)
    # an interrupted run's workspace waits there: only a writable parent lets a run resume or roll it back
    waits = (f"the interrupted migrate waiting beside {name} (its workspace {target.ws}) can be neither resumed "
             "nor rolled back; nothing was written") if os.path.isdir(target.ws) else None
    if ro:
        out.append(MigrateRefused(f"{parent} is on a read-only filesystem; " + (waits or "nothing was written"),
                                  "remount it read-write, then run the same command again" if waits else use_output))
    elif not os.access(parent, os.W_OK | os.X_OK):
        if waits:
            out.append(MigrateRefused(f"{parent} is read-only for this user: {waits}",
                                      f"make {parent} writable for this user (as its owner: chmod u+w "
                                      f"{quote_path(parent)}), then run the same command again"))
        else:
            out.append(MigrateRefused(f"{parent} is read-only for this user: the workspace and lock beside {name} "
                                      "cannot be created; nothing was written",
                                      use_output if target.in_place else "pick a writable --output"))
    if waits and not out:
        locked = _read_only_in_workspace(target)
        if locked:
            out.append(MigrateRefused(f"{locked} is read-only for this user: {waits}",
                                      f"make the workspace's folders writable for this user (as its owner: find "
                                      f"{quote_path(target.ws)} -type d -exec chmod u+w {{}} +), then run the same "
                                      "command again"))
    if exists:
        from clef_format.migrate.tree_state import is_mount_point

        if is_mount_point(target.path):
            out.append(MigrateRefused(f"{target.path} is a mount point: the new tree cannot replace it by "
                                      "rename; nothing was written",
                   "use --output DIR (a new folder inside it or elsewhere)" if target.in_place
                   else "pick an --output that is a new folder"))
        else:
            try:
                cross = os.stat(target.path).st_dev != os.stat(parent).st_dev
            except OSError:
                cross = False
            if cross:
                out.append(MigrateRefused(f"{target.path} is on another filesystem than {parent}: it cannot "
                                          "be swapped by rename; nothing was written", use_output))
        if os.path.isdir(target.path) and not os.access(target.path, os.W_OK | os.X_OK):  # a file: refused as filled
            out.append(MigrateRefused(f"{target.path} is read-only for this user; nothing was written",
                   use_output if target.in_place else "pick a writable --output"))
    foreign = foreign_lock(target.lock_path) if check_lock else None
    if foreign:
        out.append(MigrateRefused(f"cannot take the lock {target.lock_path}: {foreign}; nothing was written",
               f"move {target.lock_path} away (it may be your data), then run clef-format migrate again"))
    elif check_lock and lock_held(target):
        out.append(MigrateRefused(f"another clef-format migrate is working on {target.path}",
               "wait for it to finish; a killed run's lock is released by the kernel"))
    if plan is not None and not out:
        try:
            check_space(plan, target, snapshot)
        except MigrateRefused as exc:
            out.append(exc)
    return out



def carried_by_link(target: Target, snapshot: bool) -> bool:
    return target.in_place  # out of place, files are reflinked or copied: never a shared inode


def check_space(plan: Plan, target: Target, snapshot: bool) -> None:
    st = os.statvfs(target.parent)
    free = st.f_bavail * st.f_frsize
    need = plan.space_needed(carried_by_link(target, snapshot))
    if need > free:
        raise MigrateRefused(f"not enough free space on {target.parent}: the migration needs {need:,} bytes, {free:,} "
                             "are free", "free some space, or use --output DIR on a disk with room")
