"""Filesystem moves for ``apply``: atomic directory exchange, fsync of directories, carrying files over.

Carrying an unchanged file tries, in order: a reflink (copy-on-write clone: shares blocks, never
shares later writes), a hard link (same inode; not used for Hugging Face blobs, whose content a
write through the link would corrupt), then a copy with ``copy_file_range`` of the file's data
extents only (``fileio.data_extents``: its holes stay holes). Every file and folder migrate makes in place of
one of the source's gets that one's extended attributes, POSIX ACLs included (``sync_xattrs``).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import stat
from typing import Iterator

from clef_format.read.paths import inside

TYPE_CHECKING = False
if TYPE_CHECKING:
    from clef_format.migrate.workspace import Target

RENAME_EXCHANGE = 2
AT_FDCWD = -100
FICLONE = 0x40049409


def umask() -> int:
    """The process umask, read from /proc (no window where another thread sees a changed umask)."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def mode_for(predecessor: str) -> int:
    """Permission bits for a new file: those of the file it replaces, else what the umask gives."""
    try:
        st = os.stat(predecessor)
        if stat.S_ISREG(st.st_mode):
            return stat.S_IMODE(st.st_mode)
    except OSError:
        pass
    return 0o666 & ~umask()


#: Where the destination cannot hold an attribute (no xattrs on that filesystem, a namespace this
#: user may not write, such as ``trusted.*`` or ``security.*`` without the capability): not carried.
_XATTR_UNSUPPORTED = (errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM, errno.EACCES, errno.EINVAL)


def sync_xattrs(src: str, dst: "str | int") -> None:
    """Give ``dst`` (a path or an open fd) exactly the extended attributes of ``src`` (``user.*``, the
    POSIX ACLs ``system.posix_acl_access`` / ``_default``, and ``trusted.*`` / ``security.*`` where this
    process may set them); those ``dst`` got elsewhere (an inherited default ACL) are removed. A file
    migrate writes anew in place of another keeps what the user had set on it. Where either side
    keeps none (no xattr support), nothing is done; any other failure raises."""
    try:
        names = os.listxattr(src, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in _XATTR_UNSUPPORTED or exc.errno == errno.ENODATA:
            return
        raise
    want = {}
    for name in names:
        try:
            want[name] = os.getxattr(src, name, follow_symlinks=False)
        except OSError as exc:
            if exc.errno in _XATTR_UNSUPPORTED or exc.errno == errno.ENODATA:
                continue
            raise
    try:
        have = os.listxattr(dst)
    except OSError as exc:
        if exc.errno in _XATTR_UNSUPPORTED:
            return
        raise
    for name in have:
        if name not in want:
            try:
                os.removexattr(dst, name)
            except OSError as exc:
                if exc.errno not in _XATTR_UNSUPPORTED and exc.errno != errno.ENODATA:
                    raise
    for name, value in want.items():
        try:
            os.setxattr(dst, name, value)
        except OSError as exc:
            if exc.errno not in _XATTR_UNSUPPORTED:
                raise


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def exchange(a: str, b: str) -> None:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE). Raises OSError when unsupported."""
    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), a)


def reflink(src: str, dst: str) -> bool:
    try:
        with open(src, "rb") as s, open(dst, "wb") as d:
            fcntl.ioctl(d.fileno(), FICLONE, s.fileno())
            os.fsync(d.fileno())  # the clone's extent map is metadata: durable only once fsynced
        return True
    except OSError:
        try:
            os.unlink(dst)
        except OSError:
            pass
        return False


def copy_file(src: str, dst: str) -> None:
    from clef_format.migrate.fileio import copy_range

    size = os.stat(src).st_size
    with open(src, "rb") as s, open(dst, "wb") as d:
        copy_range(s.fileno(), d.fileno(), 0, size, lambda n: None)
        os.ftruncate(d.fileno(), size)  # a hole at the end: the size, without writing it
        os.fsync(d.fileno())
    sync_xattrs(src, dst)
    shutil.copystat(src, dst)


def carry(src: str, dst: str, link_first: bool, allow_hardlink: bool) -> str:
    """Bring one unchanged file over; returns how: link | reflink | copy.

    In place a hard link comes first (the old tree is dropped right after); out of place a reflink
    (no inode shared with the source), else a copy: never a hard link, so editing an output file
    in place can never change the source's.
    """
    if link_first and allow_hardlink and _link(src, dst):
        return "link"
    if reflink(src, dst):
        sync_xattrs(src, dst)
        shutil.copystat(src, dst)
        return "reflink"
    if allow_hardlink and _link(src, dst):
        return "link"
    copy_file(src, dst)
    return "copy"


def _link(src: str, dst: str) -> bool:
    try:
        os.link(src, dst, follow_symlinks=True)
        return True
    except OSError:
        return False


def inner_link(full: str, rel: str, src_root: str) -> str:
    """The text of the link ``full`` (at ``rel``) for the staged tree. A link to a file of the checkpoint
    by a path that leaves it (absolute, or ``../ck/x``) would lead into the old tree from the staged
    one (and verify of the staged tree would see a link leaving it): it becomes the relative link to
    the same file. Any other link is carried as it is."""
    text = os.readlink(full)
    lexical = os.path.normpath(os.path.join(os.path.dirname(rel), text))
    if not os.path.isabs(text) and lexical != ".." and not lexical.startswith("../"):
        return text
    real, root = os.path.realpath(full), os.path.realpath(src_root)
    if not inside(real, root) or real == root:
        return text
    return os.path.relpath(real, os.path.realpath(os.path.dirname(full)))


def replicate(src_root: str, dst_root: str, skip: set[str], in_place: bool, allowed_real: list[str],
              snapshot: bool) -> dict[str, str]:
    """Rebuild ``src_root``'s tree under ``dst_root`` without the ``skip`` files (rel paths).

    In place, symlinks are recreated (``inner_link``) and every file is hard-linked (the old tree is
    dropped afterwards). Out of place, symlinks are resolved (snapshot files live in blobs/),
    links escaping the checkpoint are not followed, and ``.cache`` (download metadata that would no
    longer match) is left behind. Returns rel -> how each file came over.
    """
    how: dict[str, str] = {}
    for dirpath, dirnames, filenames in tree_walk(src_root):
        rel_dir = os.path.relpath(dirpath, src_root)
        out_dir = os.path.normpath(os.path.join(dst_root, rel_dir))
        os.makedirs(out_dir, exist_ok=True)
        sync_xattrs(dirpath, out_dir)  # before its files: a default ACL is inherited as in the source
        if not in_place and rel_dir == ".":
            dirnames[:] = [d for d in dirnames if d != ".cache"]
        for name in list(dirnames) + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.normpath(os.path.join(rel_dir, name)).replace(os.sep, "/")
            dst = os.path.join(out_dir, name)
            st = os.lstat(full)
            if stat.S_ISDIR(st.st_mode):
                continue
            if rel in skip:
                continue
            if stat.S_ISLNK(st.st_mode):
                if os.path.lexists(dst):
                    os.unlink(dst)
                if in_place:
                    os.symlink(inner_link(full, rel, src_root), dst)
                    how[rel] = "symlink"
                    continue
                real = os.path.realpath(full)
                if not any(inside(real, a) for a in allowed_real):
                    how[rel] = "skipped (symlink leaves the checkpoint)"
                    continue
                if os.path.isdir(real):
                    how[rel] = "skipped (directory symlink)"
                    continue
                how[rel] = carry(real, dst, link_first=False, allow_hardlink=in_place and not snapshot)
            elif stat.S_ISREG(st.st_mode):
                if os.path.lexists(dst):
                    os.unlink(dst)
                how[rel] = carry(full, dst, link_first=in_place, allow_hardlink=in_place)
            else:
                raise OSError(errno.EINVAL, f"{rel} is not a regular file, directory or symlink; not carried")
    return how


def tree_walk(root: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(root)`` for migrate: iterative (``os.walk`` recurses on Python 3.11: a folder nested
    ~1,000 deep raised ``RecursionError``), symlinks never followed, and no folder skipped in silence: one
    that cannot be listed, or lies deeper than the reader's ``MAX_DEPTH``, raises ``OSError`` (the
    caller's rollback and its check of the source say what changed)."""
    from clef_format.read.walk import walk

    def unlistable(exc: OSError) -> None:
        raise exc

    def too_deep(path: str) -> None:
        raise TreeTooDeep(path, root)

    return walk(root, onerror=unlistable, too_deep=too_deep)


class TreeTooDeep(OSError):
    """A folder nested deeper than the reader descends (``read.walk.MAX_DEPTH``): never walked below."""

    def __init__(self, path: str, root: str) -> None:
        from clef_format.read.walk import MAX_DEPTH

        rel = os.path.relpath(path, root)
        super().__init__(errno.ELOOP, f"{short_rel(rel)} nests more than {MAX_DEPTH} folders deep", path)


def short_rel(rel: str) -> str:
    """A relative path fit for a message: a deep or long one as its first folder and ``/...``."""
    return rel if len(rel) <= 200 and rel.count("/") < 8 else f"{rel.split('/', 1)[0][:100]}/..."


def output_written(target: Target) -> list[str]:
    """What an ``--output`` holds that the run did not put there, checked under the lock just before the
    exchange: it was absent or empty when the run began (else refused), so anything in it now is
    someone's, and the exchange would move it into the workspace to be deleted. Empty: nothing."""
    path = target.path
    if target.in_place or not os.path.lexists(path):
        return []
    if os.path.islink(path) or not os.path.isdir(path):
        return [f"{path} was created meanwhile (not a folder)"]
    names = sorted(os.listdir(path))
    return [f"{name} was created in the --output" for name in names]


def finish_tree(src_root: str, dst_root: str, folders: list[str], replaced: str | None = None) -> None:
    """Give the new tree's directories (``folders``, rel paths: the caller's walk of it) the source's
    permission bits, and fsync every one of them. ``replaced``: an existing (empty) --output the new tree
    will replace, whose own permission bits and extended attributes the tree's top folder takes instead
    (a private 0700 folder the user made stays private)."""
    # each folder after everything below it (a read-only mode comes last)
    for rel_dir in sorted(folders, key=lambda rel: 0 if rel == "." else rel.count("/") + 1, reverse=True):
        dirpath = os.path.join(dst_root, *rel_dir.split("/")) if rel_dir != "." else dst_root
        src_dir = os.path.normpath(os.path.join(src_root, rel_dir))
        if rel_dir == "." and replaced is not None and os.path.isdir(replaced) and not os.path.islink(replaced):
            sync_xattrs(replaced, dirpath)
            shutil.copymode(replaced, dirpath)
        elif os.path.isdir(src_dir) and not os.path.islink(src_dir):
            shutil.copymode(src_dir, dirpath)
        fsync_dir(dirpath)
