"""Deleting a tree migrate made (its workspace, the staged or the old tree): any depth, any path length,
never through a mount, never through a symlink.

``shutil.rmtree`` recurses (a folder nested ~1,000 deep raised ``RecursionError`` on Python 3.11) and
would empty a filesystem mounted below the tree before failing on the mount point itself. Here the
tree is walked with one open folder at a time (``openat`` / ``unlinkat`` by name relative to it, and
``..`` checked against the folder it must be on the way back), so neither Python's recursion limit
nor PATH_MAX bounds it; a first pass looks for mount points and deletes nothing when it finds one,
the deleting pass checks every folder again before it enters it. A symlink is removed as the entry
it is; a folder swapped for a symlink or another folder meanwhile stops the deletion.
"""

from __future__ import annotations

import errno
import os
import stat

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class MountInside(OSError):
    """A mount point at or below the tree: nothing below it is deleted."""


def delete_tree(path: str) -> None:
    """Delete ``path`` and everything below it; raises ``OSError`` (``MountInside`` for a mount point)
    when something cannot go. A folder without write or search permission is opened up first (it is
    migrate's to delete). Three passes at most: a file someone adds meanwhile is taken by the next."""
    from clef_format.migrate.tree_state import is_mount_point, mount_table

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)  # a file or a symlink: the entry itself, never what a link leads to
        return
    real = os.path.realpath(path)
    if is_mount_point(path):
        raise MountInside(errno.EBUSY, f"{path} is a mount point: nothing below it is deleted (unmount it, then "
                                       "run again)", path)
    table = mount_table(real)
    first: OSError | None = None
    for _ in range(3):
        try:
            _pass(path, real, table, delete=False)  # a mount anywhere below: refused before anything is deleted
            _pass(path, real, table, delete=True)
            os.rmdir(path)
            return
        except MountInside as exc:
            raise MountInside(exc.errno, exc.strerror, path) from None  # named by the tree asked for
        except FileNotFoundError:
            if not os.path.lexists(path):
                return
        except OSError as exc:
            first = first or exc
    assert first is not None
    raise OSError(first.errno, f"cannot delete {path}: {first.strerror or first}", first.filename)


def _open_child(fd: int, name: str, want: os.stat_result, delete: bool) -> int | None:
    """The folder ``name`` of ``fd``, opened without following a link and proven to be the one looked at.
    A folder this user cannot read is opened up when deleting (None: left alone when only looking)."""
    try:
        child = os.open(name, _DIR, dir_fd=fd)
    except PermissionError:
        if not delete:
            return None
        handle = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        try:
            _same(os.fstat(handle), want, name)
            os.chmod(f"/proc/self/fd/{handle}", 0o700)  # this folder, by its handle: never a path that moved
            child = os.open(f"/proc/self/fd/{handle}", _DIR)
        finally:
            os.close(handle)
    try:
        _same(os.fstat(child), want, name)
    except OSError:
        os.close(child)
        raise
    return child


def _same(got: os.stat_result, want: os.stat_result, name: str) -> None:
    if (got.st_dev, got.st_ino) != (want.st_dev, want.st_ino):
        raise OSError(errno.EBUSY, f"{name} was replaced while it was being deleted; nothing below it was touched", name)


def _unlink(fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=fd)
    except PermissionError:
        os.fchmod(fd, 0o700)  # the folder is ours to empty
        os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        pass


def _scan(fd: int, where: str, dev: int, table: set[str], delete: bool) -> list[tuple[str, os.stat_result]]:
    """The subfolders of the open folder ``fd`` (its path ``where``, for the mount table), each checked not
    to be a mount point; when deleting, every other entry is removed on the way."""
    folders = []
    with os.scandir(fd) as it:
        entries = list(it)
    for entry in entries:
        st = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode):
            if delete:
                _unlink(fd, entry.name)
            continue
        full = f"{where}/{entry.name}"
        if st.st_dev != dev or full in table:
            raise MountInside(errno.EBUSY, f"{full} is a mount point: nothing below it is deleted (unmount it, "
                                           "then run again)", full)
        folders.append((entry.name, st))
    return folders


def _pass(path: str, real: str, table: set[str], delete: bool) -> None:
    """One walk of the tree, one open folder at a time, deepest first when deleting."""
    try:
        fd = os.open(path, _DIR)
    except PermissionError:
        if not delete:
            return  # looked at again, folder by folder, by the deleting pass
        os.chmod(path, 0o700)  # the top of a tree migrate made: its own
        fd = os.open(path, _DIR)
    try:
        top = os.fstat(fd)
        names: list[str] = []  # the folders from ``path`` down to the one open
        levels = [(top, _scan(fd, real, top.st_dev, table, delete))]
        while levels:
            here, pending = levels[-1]
            if pending:
                name, want = pending.pop()
                child = _open_child(fd, name, want, delete)
                if child is None:
                    continue
                os.close(fd)
                fd = child
                names.append(name)
                where = real + "/" + "/".join(names)
                levels.append((want, _scan(fd, where, top.st_dev, table, delete)))
                continue
            levels.pop()
            if not levels:
                break
            name = names.pop()
            parent = os.open("..", _DIR, dir_fd=fd)
            os.close(fd)
            fd = parent
            _same(os.fstat(fd), levels[-1][0], os.path.join(path, *names) if len(names) < 8 else "a folder")
            if delete:
                try:
                    os.rmdir(name, dir_fd=fd)
                except PermissionError:
                    os.fchmod(fd, 0o700)
                    os.rmdir(name, dir_fd=fd)
    finally:
        os.close(fd)
