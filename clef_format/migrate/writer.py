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
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, cast

from clef_format.migrate.fileio import Tick, copy_range, write_all, write_all_at
from clef_format.migrate.plan import (
    Decoded,
    FileBytes,
    IndexFile,
    JsonFile,
    OutFile,
    QuantScales,
    QuantValues,
    Safetensors,
    TensorOut,
    header_bytes,
)

#: Jobs of one safetensors file run at once (copy runs, tables): the two tables of the tables file together.
_POOL = 2


def wait_all(futures: list) -> None:
    """Wait for every job; raise the first real error (not a sibling's cancellation)."""
    errors = []
    for fut in futures:
        try:
            fut.result()
        except BaseException as exc:  # noqa: B902 - re-raised below
            errors.append(exc)
    if errors:
        raise next((e for e in errors if not (isinstance(e, OSError) and e.errno == errno.ECANCELED)), errors[0])


def _merged(tensors: tuple[TensorOut, ...], data_start: int) -> Iterator[tuple[str, object, int]]:
    """(kind, item, destination offset): contiguous verbatim ranges of one source file become one copy."""
    run: list[int] | None = None  # [src offset, nbytes, dst offset]
    run_rel = ""
    at = data_start
    for t in tensors:
        s = t.source
        if isinstance(s, FileBytes):
            if run is not None and s.rel == run_rel and run[0] + run[1] == s.offset:
                run[1] += s.nbytes
            else:
                if run is not None:
                    yield "copy", (run_rel, run[0], run[1]), run[2]
                run, run_rel = [s.offset, s.nbytes, at], s.rel
        else:
            if run is not None:
                yield "copy", (run_rel, run[0], run[1]), run[2]
                run = None
            yield "tensor", t, at
        at += t.nbytes
    if run is not None:
        yield "copy", (run_rel, run[0], run[1]), run[2]


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


def _quantize(src: _Sources, s: QuantValues, dst_fd: int, at: int, tick: Tick, scales: dict, quality: dict,
              tables: int) -> None:
    from clef_format.migrate.table_stream import quantize_table, workers_for  # numpy: only when a table is quantized

    scales[s.table], quality[s.table] = quantize_table(src.fd(s.rel), s.offset, s.rows, s.hidden, s.dtype, dst_fd,
                                                       at, tick, f"{s.rel}: {s.table}", workers_for(tables))


def _decode(src: _Sources, s: Decoded, dst_fd: int, at: int, tick: Tick, tables: int) -> None:
    from clef_format.migrate.table_stream import decode_table, workers_for

    decode_table(src.fd(s.rel), s.values_offset, s.scales_offset, s.rows, s.hidden, s.dtype, dst_fd, at, tick,
                 f"{s.rel}: {s.table}", workers_for(tables))


def _seal(out: Safetensors, dst_path: str) -> dict[str, str]:
    """Scan the tables just written with the one table rule, and digest every tensor of the file.

    The rule proves migrate's own output (a quantizer or write bug stops the run, rolled back, before
    anything is swapped in); the digests go into the file's metadata, so ``verify --deep`` and the
    serving gate see a table later edited, swapped or replaced without any download reference."""
    from clef_format.read.safetensors import read_header
    from clef_format.read.table_scan import scan_tables
    from clef_format.spec import tables_format as TF

    header = read_header(dst_path)
    tables = [t.name for t in out.tensors if isinstance(t.source, QuantValues)]
    scan = scan_tables(dst_path, header, tables, list(header.tensors))
    bad = {t: p for t, p in scan.problems.items() if p}
    if bad:
        raise OSError(errno.EIO, "the int8 tables written break the format's rule (" +
                      "; ".join(f"{t}: {p.describe()}" for t, p in sorted(bad.items())) + ")")
    return {name: f"{TF.DIGEST_ALGORITHM}:{digest}" for name, digest in scan.digests.items()}


def _write_safetensors(out: Safetensors, src_root: str, fd: int, tick: Tick, dst_path: str = "") -> dict:
    header = header_bytes(out)
    write_all(fd, header)
    src = _Sources(src_root)
    for rel in {t.source.rel for t in out.tensors if hasattr(t.source, "rel")}:
        src.fd(rel)  # opened here, before the worker threads share the table
    scales: dict = {}
    quality: dict = {}
    deferred: list[tuple[TensorOut, int]] = []
    # the tables of this file stream at once (below, up to the pool's two jobs): they share the cores given
    tables = min(_POOL, sum(1 for t in out.tensors if isinstance(t.source, (QuantValues, Decoded))))

    def one(kind: str, item: object, at: int) -> None:
        if kind == "copy":
            rel, offset, nbytes = cast("tuple[str, int, int]", item)
            copy_range(src.fd(rel), fd, offset, nbytes, tick, at)
            return
        s = cast(TensorOut, item).source
        if isinstance(s, QuantValues):
            _quantize(src, s, fd, at, tick, scales, quality, tables)
        elif isinstance(s, Decoded):
            _decode(src, s, fd, at, tick, tables)
        else:  # pragma: no cover
            raise TypeError(s)

    try:
        jobs = []
        for kind, item, at in _merged(out.tensors, len(header)):
            if kind == "tensor" and isinstance(item, TensorOut) and isinstance(item.source, QuantScales):
                deferred.append((item, at))
            else:
                jobs.append((kind, item, at))
        # the two tables are independent: quantize (or decode) them on two cores at once
        with ThreadPoolExecutor(max_workers=_POOL) as pool:
            wait_all([pool.submit(one, *job) for job in jobs])
        for t, at in deferred:
            data = scales[cast(QuantScales, t.source).table]  # numpy F32 [rows, 1], contiguous
            write_all_at(fd, data.data, at)
            tick(data.nbytes)
    finally:
        src.close()
    if out.quality_metadata:
        from clef_format.spec.tables_format import DIGESTS_KEY, digests_text

        meta = dict(out.metadata)
        meta["quality"] = json.dumps(quality, sort_keys=True)
        if dst_path:
            meta[DIGESTS_KEY] = digests_text(_seal(out, dst_path))
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
    from clef_format.migrate.fsutil import mode_for

    mode = mode_for(os.path.join(src_root, *out.rel.split("/")))
    os.makedirs(os.path.dirname(dst_path), exist_ok=True)
    fd = os.open(dst_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        quality: dict = {}
        if isinstance(out, Safetensors):
            quality = _write_safetensors(out, src_root, fd, tick, dst_path)
        elif isinstance(out, JsonFile):
            write_all(fd, out.text())
        elif isinstance(out, IndexFile):
            write_all(fd, _write_index(out, src_root))
        if isinstance(out, Safetensors) and os.fstat(fd).st_size < out.size:
            os.ftruncate(fd, out.size)  # the last tensor ends in a hole: the size, without writing it
        predecessor = os.path.join(src_root, *out.rel.split("/"))
        if os.path.lexists(predecessor):  # what the user set on the file it replaces
            from clef_format.migrate.fsutil import sync_xattrs

            sync_xattrs(predecessor, fd)
        os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)
    return quality
