"""Produce one planned output file: streaming, bounded memory. Called only by ``apply``.

Safetensors files are written header first, then each tensor's bytes in order. Runs of
untouched tensors that are contiguous in the source become one ``os.copy_file_range`` (an
in-kernel copy: no bytes pass through Python; a reflink where the filesystem can), falling
back to a plain read/write loop with a large buffer. Tables are quantized or decoded one row
block at a time. Every file is fsynced before the function returns.
"""

from __future__ import annotations

import errno
import json
import os
from typing import Callable, Iterator

from .plan import (Decoded, FileBytes, IndexFile, JsonFile, OutFile, QuantScales, QuantValues, Safetensors,
                   TensorOut, header_bytes)

Tick = Callable[[int], None]
#: Bytes per copy_file_range call (a progress tick and a crash point each).
COPY_CHUNK = 64 * 1024 * 1024
FALLBACK_BUFFER = 8 * 1024 * 1024
_NO_CFR = (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF, errno.EPERM)
_TORCH_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def write_all(fd: int, data: "memoryview | bytes") -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.write(fd, view)
        view = view[n:]


def copy_range(src_fd: int, dst_fd: int, offset: int, nbytes: int, tick: Tick) -> None:
    """Copy ``nbytes`` from ``offset`` of src to the current position of dst."""
    use_cfr = hasattr(os, "copy_file_range")
    done = 0
    buf = None
    while done < nbytes:
        want = min(COPY_CHUNK, nbytes - done)
        if use_cfr:
            try:
                n = os.copy_file_range(src_fd, dst_fd, want, offset + done)
            except OSError as exc:
                if exc.errno not in _NO_CFR:
                    raise
                use_cfr = False
                continue
        else:
            buf = buf or bytearray(FALLBACK_BUFFER)
            n = os.preadv(src_fd, [memoryview(buf)[:min(want, FALLBACK_BUFFER)]], offset + done)
            write_all(dst_fd, memoryview(buf)[:n])
        if n == 0:
            raise OSError(errno.EIO, f"source ended {nbytes - done} bytes early")
        done += n
        tick(n)


def _merged(tensors: tuple[TensorOut, ...]) -> Iterator[tuple[str, object]]:
    """Group contiguous verbatim ranges of one source file into one copy."""
    run: list[int] | None = None  # [offset, nbytes]
    run_rel = ""
    for t in tensors:
        s = t.source
        if isinstance(s, FileBytes):
            if run is not None and s.rel == run_rel and run[0] + run[1] == s.offset:
                run[1] += s.nbytes
                continue
            if run is not None:
                yield "copy", (run_rel, run[0], run[1])
            run, run_rel = [s.offset, s.nbytes], s.rel
            continue
        if run is not None:
            yield "copy", (run_rel, run[0], run[1])
            run = None
        yield "tensor", t
    if run is not None:
        yield "copy", (run_rel, run[0], run[1])


class _Sources:
    """Source files opened once per output file."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.fds: dict[str, int] = {}

    def fd(self, rel: str) -> int:
        if rel not in self.fds:
            self.fds[rel] = os.open(os.path.join(self.root, *rel.split("/")), os.O_RDONLY)
        return self.fds[rel]

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)


def _quantize(src: _Sources, s: QuantValues, dst_fd: int, tick: Tick, scales: dict, quality: dict) -> None:
    import torch

    from .stream_quant import BLOCK_ROWS, RowQuantizer

    torch.set_num_threads(1)  # one table per worker thread; OpenMP threads only contend on small machines
    dtype = getattr(torch, _TORCH_DTYPES[s.dtype])
    item = torch.empty((), dtype=dtype).element_size()
    rq = RowQuantizer(s.hidden)
    buf = bytearray(BLOCK_ROWS * s.hidden * item)
    fd = src.fd(s.rel)
    parts = []
    for first in range(0, s.rows, BLOCK_ROWS):
        r = min(BLOCK_ROWS, s.rows - first)
        view = memoryview(buf)[: r * s.hidden * item]
        got = os.preadv(fd, [view], s.offset + first * s.hidden * item)
        if got != len(view):
            raise OSError(errno.EIO, f"{s.rel}: short read in {s.table}")
        rows = torch.frombuffer(view, dtype=dtype).view(r, s.hidden)
        q, scale = rq.block(rows, first)
        write_all(dst_fd, q.numpy().data)
        parts.append(scale.clone())
        tick(len(view))
    scales[s.table] = torch.cat(parts) if parts else torch.empty(0, 1)
    quality[s.table] = rq.figures()


def _decode(src: _Sources, s: Decoded, dst_fd: int, tick: Tick) -> None:
    import torch

    from ..quantize import dequantize_rows
    from .stream_quant import BLOCK_ROWS

    fd = src.fd(s.rel)
    raw = os.pread(fd, s.rows * 4, s.scales_offset)
    scales = torch.frombuffer(bytearray(raw), dtype=torch.float32).view(s.rows, 1)
    dtype = getattr(torch, _TORCH_DTYPES[s.dtype])
    buf = bytearray(BLOCK_ROWS * s.hidden)
    for first in range(0, s.rows, BLOCK_ROWS):
        r = min(BLOCK_ROWS, s.rows - first)
        view = memoryview(buf)[: r * s.hidden]
        if os.preadv(fd, [view], s.values_offset + first * s.hidden) != len(view):
            raise OSError(errno.EIO, f"{s.rel}: short read in {s.table}")
        q = torch.frombuffer(view, dtype=torch.int8).view(r, s.hidden)
        out = dequantize_rows(q, scales[first:first + r], dtype)
        write_all(dst_fd, out.view(torch.uint8).numpy().data if dtype != torch.float32 else out.numpy().data)
        tick(r * s.hidden)


def _write_safetensors(out: Safetensors, src_root: str, fd: int, tick: Tick) -> dict:
    header = header_bytes(out)
    write_all(fd, header)
    src = _Sources(src_root)
    scales: dict = {}
    quality: dict = {}
    try:
        for kind, item in _merged(out.tensors):
            if kind == "copy":
                rel, offset, nbytes = item  # type: ignore[misc]
                copy_range(src.fd(rel), fd, offset, nbytes, tick)
                continue
            t: TensorOut = item  # type: ignore[assignment]
            s = t.source
            if isinstance(s, QuantValues):
                _quantize(src, s, fd, tick, scales, quality)
            elif isinstance(s, QuantScales):
                data = scales[s.table].contiguous().numpy()
                write_all(fd, data.data)
                tick(data.nbytes)
            elif isinstance(s, Decoded):
                _decode(src, s, fd, tick)
            else:  # pragma: no cover
                raise TypeError(s)
    finally:
        src.close()
    if out.quality_metadata:
        meta = dict(out.metadata)
        meta["quality"] = json.dumps(quality, sort_keys=True)
        final = header_bytes(out, meta)
        assert len(final) == len(header)
        os.pwrite(fd, final, 0)
    return quality


def _write_index(out: IndexFile, src_root: str) -> bytes:
    with open(os.path.join(src_root, *out.rel.split("/")), "rb") as fh:
        index = json.load(fh)
    wm = index["weight_map"]
    for name in out.drop:
        wm.pop(name, None)
    for name, rel in out.add:
        wm[name] = rel
    index["weight_map"] = dict(sorted(wm.items()))
    meta = index.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get("total_size"), int):
        meta["total_size"] += out.size_delta
    return (json.dumps(index, indent=2) + "\n").encode()


def write_output(out: OutFile, src_root: str, dst_path: str, tick: Tick) -> dict:
    """Write one planned file at ``dst_path`` (created new) and fsync it. Returns quality figures, if any."""
    mode = 0o644
    if getattr(out, "mode_from", None):
        try:
            mode = os.stat(os.path.join(src_root, *out.mode_from.split("/"))).st_mode & 0o777  # type: ignore[union-attr]
        except OSError:
            pass
    os.makedirs(os.path.dirname(dst_path), exist_ok=True)
    fd = os.open(dst_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        quality: dict = {}
        if isinstance(out, Safetensors):
            quality = _write_safetensors(out, src_root, fd, tick)
        elif isinstance(out, JsonFile):
            write_all(fd, out.text())
        elif isinstance(out, IndexFile):
            write_all(fd, _write_index(out, src_root))
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)
    return quality
