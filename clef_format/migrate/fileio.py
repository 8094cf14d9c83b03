"""Byte copies between open files: whole writes at an offset, ranges copied in the kernel, read-ahead hints.

The bottom of the migration engine: it imports nothing of clef_format, so the output writer
(``writer.py``), the table quantizer (``table_stream.py``) and the tree copier (``fsutil.py``) all
share it without importing one another.
"""

from __future__ import annotations

import errno
import os
from typing import Callable

Tick = Callable[[int], None]
#: Bytes per copy_file_range call (a progress tick and a crash point each).
COPY_CHUNK = 256 * 1024 * 1024
FALLBACK_BUFFER = 8 * 1024 * 1024
_NO_CFR = (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF, errno.EPERM)


def write_all(fd: int, data: "memoryview | bytes") -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view)
        view = view[n:]


def write_all_at(fd: int, data: "memoryview | bytes", offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


def data_extents(fd: int, start: int, end: int) -> list[tuple[int, int]]:
    """The runs ``(offset, length)`` of ``[start, end)`` of the open file ``fd`` that hold data, by
    ``SEEK_DATA`` / ``SEEK_HOLE``: a copy of only these leaves the holes of a sparse file holes
    (``copy_file_range`` fills them: a 64 MiB file of 24 blocks came out 131,072 blocks on ext4).
    Where the filesystem cannot tell, the whole range is data."""
    runs: list[tuple[int, int]] = []
    pos = start
    while pos < end:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # nothing but a hole from pos to the end of the file
                break
            if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
                runs.append((pos, end - pos))
                break
            raise
        if data >= end:
            break
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        runs.append((data, hole - data))
        pos = hole
    return runs


def copy_range(src_fd: int, dst_fd: int, offset: int, nbytes: int, tick: Tick, dst_offset: int = 0) -> None:
    """Copy ``nbytes`` from ``offset`` of src to ``dst_offset`` of dst, a range of a new file (it reads
    as zeros): only the source's data extents are copied, so a hole stays a hole (``data_extents``).
    The caller gives the file its full size (a hole at its end is not written)."""
    have = os.fstat(src_fd).st_size
    if offset + nbytes > have:  # never read a missing tail as a hole
        raise OSError(errno.EIO, f"source ended {offset + nbytes - have} bytes early")
    at = offset
    for start, length in data_extents(src_fd, offset, offset + nbytes):
        if start > at:
            tick(start - at)  # a hole: nothing to copy, counted as done
        _copy_data(src_fd, dst_fd, start, length, tick, dst_offset + start - offset)
        at = start + length
    if offset + nbytes > at:
        tick(offset + nbytes - at)


def _copy_data(src_fd: int, dst_fd: int, offset: int, nbytes: int, tick: Tick, dst_offset: int) -> None:
    use_cfr = hasattr(os, "copy_file_range")
    advise(src_fd, offset, nbytes, "POSIX_FADV_SEQUENTIAL")  # larger kernel read-ahead for the long run
    done = 0
    buf = None
    while done < nbytes:
        want = min(COPY_CHUNK, nbytes - done)
        if use_cfr:
            try:
                n = os.copy_file_range(src_fd, dst_fd, want, offset + done, dst_offset + done)
            except OSError as exc:
                if exc.errno not in _NO_CFR:
                    raise
                use_cfr = False
                continue
        else:
            buf = buf or bytearray(FALLBACK_BUFFER)
            n = os.preadv(src_fd, [memoryview(buf)[:min(want, FALLBACK_BUFFER)]], offset + done)
            write_all_at(dst_fd, memoryview(buf)[:n], dst_offset + done)
        if n == 0:
            raise OSError(errno.EIO, f"source ended {nbytes - done} bytes early")
        done += n
        tick(n)


def advise(fd: int, offset: int, length: int, advice: str) -> None:
    """Ask the kernel to read ahead (the next blocks arrive while this one is quantized)."""
    if hasattr(os, "posix_fadvise") and length > 0:
        try:
            os.posix_fadvise(fd, offset, length, getattr(os, advice))
        except OSError:
            pass
