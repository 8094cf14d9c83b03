"""Preflight: everything checked before anything is written (the dry run runs the same)."""

from __future__ import annotations

import os
import stat

from clef_format.errors import MigrateRefused
from clef_format.migrate.plan import Plan
from clef_format.migrate.workspace import Target, foreign_lock


_SPECIAL = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"))


def refuse_mounts(root: str, in_place: bool) -> None:
    """A mount boundary is never crossed: a filesystem or bind mount below the checkpoint holds files
    of another disk (in place, the old tree's deletion would empty it; out of place, its files would
    be copied as if they were the checkpoint's), and a checkpoint that is itself a mount point cannot
    be replaced by rename. Refused before anything is written; the dry run says the same."""
    from clef_format.migrate.tree_state import is_mount_point, mount_points

    inner = mount_points(root)
    if inner:
        more = f" (and {len(inner) - 1} more)" if len(inner) > 1 else ""
        raise MigrateRefused(f"{inner[0]} is a mount point inside the checkpoint{more}: migrate never crosses a mount "
                             "(in place, deleting the old tree would empty the mounted folder); nothing was written",
                             f"unmount {os.path.join(root, inner[0])} (or copy its files into the checkpoint as "
                             "plain files), then run migrate again")
    if in_place and is_mount_point(root):
        raise MigrateRefused(f"{root} is a mount point: the new tree cannot replace it by rename; nothing was written",
                             "use --output DIR (a new folder inside it or elsewhere)")


def survey_source(root: str, in_place: bool) -> list[str]:
    """Every entry of the source (rel paths, sorted), each proven carriable: folders listed, files
    readable, no special file. In place the old tree is deleted after the swap, so every folder must
    also be one this process may empty. Raises ``CouldNotRun`` (unreadable) or ``MigrateRefused``."""
    from clef_format.errors import CouldNotRun

    refuse_mounts(root, in_place)
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
                raise MigrateRefused(f"{rel_dir} is not writable by this user (owner uid {owner}): after "
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
                raise MigrateRefused(f"{rel} is {kind}: migrate carries only regular files, folders and "
                                     "symlinks, and never reads or drops anything else; nothing was written",
                  f"move {rel} out of the checkpoint, then run migrate again")

    walk(root, "")
    return entries


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


def preflight(target: Target, plan: Plan | None, snapshot: bool, check_lock: bool) -> list[MigrateRefused]:
    """Why the write would fail, found before it starts: read-only places, a target that cannot be
    swapped by rename (a mount point, another filesystem), a lock held, not enough space."""
    out: list[MigrateRefused] = []
    parent = target.parent
    if not os.path.isdir(parent):
        return [MigrateRefused(f"{parent} does not exist", "create the parent folder of --output first")]
    exists = os.path.lexists(target.path)
    use_output = "use --output DIR (a new folder) on a writable disk"
    try:
        ro = bool(os.statvfs(parent).f_flag & os.ST_RDONLY)
    except OSError:
        ro = False
    if ro:
        out.append(MigrateRefused(f"{parent} is on a read-only filesystem; nothing was written", use_output))
    elif not os.access(parent, os.W_OK | os.X_OK):
        out.append(MigrateRefused(f"{parent} is read-only for this user: the workspace and lock beside "
                                  f"{os.path.basename(target.path)} cannot be created; nothing was written",
               use_output if target.in_place else "pick a writable --output"))
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
        if not os.access(target.path, os.W_OK | os.X_OK):
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
