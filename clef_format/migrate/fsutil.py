"""Filesystem moves for ``apply``: atomic directory exchange, fsync of directories, carrying files over.

Carrying an unchanged file tries, in order: a reflink (copy-on-write clone: shares blocks, never
shares later writes), a hard link (same inode; not used for Hugging Face blobs, whose content a
write through the link would corrupt), then a copy with ``copy_file_range``.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import stat

from clef_format.read.paths import inside

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
        os.fsync(d.fileno())
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
    for dirpath, dirnames, filenames in os.walk(src_root, followlinks=False):
        rel_dir = os.path.relpath(dirpath, src_root)
        out_dir = os.path.normpath(os.path.join(dst_root, rel_dir))
        os.makedirs(out_dir, exist_ok=True)
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


def finish_tree(src_root: str, dst_root: str) -> None:
    """Give the new tree's directories the source's permission bits, and fsync every one of them."""
    for dirpath, dirnames, _ in os.walk(dst_root, topdown=False):
        rel_dir = os.path.relpath(dirpath, dst_root)
        src_dir = os.path.normpath(os.path.join(src_root, rel_dir))
        if os.path.isdir(src_dir) and not os.path.islink(src_dir):
            shutil.copymode(src_dir, dirpath)
        fsync_dir(dirpath)
