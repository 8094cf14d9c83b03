"""Stream one table between files through the numpy quantizer or decoder: read, compute, write overlapped.

Three stages over a ring of preallocated slots (``WORKERS + 2`` blocks of ``IO_ROWS`` rows):

    reader thread     os.preadv the next block of source rows into a free slot
    compute threads   quantize (or decode) blocks into their slots' output buffers, ``workers``
                      of them (the calling thread is one; numpy releases the GIL): by default
                      together with the file's other table, every core the process is given
    writer thread     os.pwrite each result at its place in the output file, tick, free the slot

so the cores compute while reads and writes wait on the disk. Results do not depend on the
thread count: every block has its place in the output, and the quality figures are accounted
in row order. Memory is fixed: the slots (input + output block each), the compute scratch of
``quant.int8`` (a few MiB per thread) and the scales of the table (4 bytes a row).
No torch: numpy and the standard library only.
"""

from __future__ import annotations

import errno
import os
import queue
import threading
from typing import Any, Callable

import numpy as np

from clef_format.migrate.fileio import advise, write_all_at
from clef_format.quant.int8 import NormLog, QualityMeter, RowDecoder, RowQuantizer, itemsize

Tick = Callable[[int], None]
#: Rows per read and write: 1024 x 4096 BF16 = 8 MiB read, 4 MiB written per block.
IO_ROWS = 1024
#: Compute threads per table when set (``CLEF_FORMAT_TABLE_WORKERS``); 0: a share of the cores this
#: process is given (``workers_for``). Blocks in flight: one per compute thread, one being read, one
#: being written.
WORKERS = int(os.environ.get("CLEF_FORMAT_TABLE_WORKERS", "0") or 0)
_POLL_S = 0.1


def cores_given() -> int:
    """The cores this process may run on (its affinity mask: a container's or ``taskset``'s limit)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def workers_for(tables_at_once: int) -> int:
    """Compute threads for each of ``tables_at_once`` tables streamed at the same time: together they
    use every core given (numpy releases the GIL, so each thread can have a core). ``writer`` runs the
    two tables of the tables file at once: half the cores each, one each on 2 cores, which measured
    faster there than two (benchmarks/RESULTS.md: the kernel's copy of the backbone needs CPU too)."""
    return WORKERS or max(1, cores_given() // max(1, tables_at_once))


class _Failed(Exception):
    """Another stage failed: stop quietly (its error is the one raised)."""


class _Slot:
    def __init__(self, in_bytes: int, out_bytes: int) -> None:
        self.inp = bytearray(in_bytes)
        self.out = bytearray(out_bytes)


def _pipeline(blocks: list[tuple[int, int]], slots: list[_Slot], read: Callable[[_Slot, int, int], None],
              computers: list[Callable[[_Slot, int, int, int], None]], write: Callable[[_Slot, int, int], None]) -> None:
    """Run read -> compute -> write over ``blocks`` ((first row, rows) each); raise the earliest block's error.

    One reader, one writer and one thread per entry of ``computers`` (the first is the calling
    thread); a computer gets the slot, the block's index, first row and row count.
    """
    free: queue.Queue = queue.Queue()
    filled: queue.Queue = queue.Queue()
    done: queue.Queue = queue.Queue()
    for s in slots:
        free.put(s)
    failed = threading.Event()
    errors: list[tuple[int, BaseException]] = []  # (block index, error): the earliest block's is raised
    at_block = threading.local()
    _END = None

    def get(q: queue.Queue) -> Any:  # a slot, or a (slot, index, first, rows) block
        while True:
            try:
                return q.get(timeout=_POLL_S)
            except queue.Empty:
                if failed.is_set():
                    raise _Failed from None

    def guarded(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except _Failed:
                pass
            except BaseException as exc:  # noqa: B902 - re-raised by the calling thread
                errors.append((getattr(at_block, "index", -1), exc))
                failed.set()
        return run

    def reader() -> None:
        for index, (first, r) in enumerate(blocks):
            slot = get(free)
            at_block.index = index
            read(slot, first, r)
            filled.put((slot, index, first, r))
            if failed.is_set():
                return
        for _ in computers:
            filled.put(_END)

    def writer() -> None:
        for _ in blocks:
            slot, index, first, r = get(done)
            at_block.index = index
            write(slot, first, r)
            free.put(slot)

    def worker(compute: Callable[[_Slot, int, int, int], None]) -> Callable[[], None]:
        def run() -> None:
            while True:
                item = get(filled)
                if item is _END:
                    return
                slot, index, first, r = item
                at_block.index = index
                compute(slot, index, first, r)
                done.put(item)
        return run

    threads = [threading.Thread(target=guarded(f), name=f"clef-table-{name}", daemon=True)
               for f, name in [(reader, "reader"), (writer, "writer")]
               + [(worker(c), f"compute-{i}") for i, c in enumerate(computers[1:], 1)]]
    for t in threads:
        t.start()
    try:
        guarded(worker(computers[0]))()
    finally:
        if errors:
            failed.set()
        for t in threads:
            t.join()
    if errors:
        raise min(errors, key=lambda e: e[0])[1]


def _blocks(rows: int) -> list[tuple[int, int]]:
    return [(first, min(IO_ROWS, rows - first)) for first in range(0, rows, IO_ROWS)]


def _read_exact(fd: int, view: memoryview, offset: int, what: str) -> None:
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            raise OSError(errno.EIO, f"short read in {what}")
        got += n


def quantize_table(src_fd: int, offset: int, rows: int, hidden: int, dtype: str, dst_fd: int, at: int,
                   tick: Tick, what: str = "table", workers: int | None = None) -> tuple[np.ndarray, dict[str, float]]:
    """Quantize ``rows`` x ``hidden`` ``dtype`` rows at ``offset`` of ``src_fd`` to I8 at ``at`` of ``dst_fd``,
    on ``workers`` compute threads (default ``workers_for(1)``: every core given). The bytes written,
    the scales and the figures are the same for any thread count.

    Returns the F32 ``[rows, 1]`` scales and the table's quality figures. Raises
    ``errors.NonFiniteRows`` for NaN/Inf rows (with the rows written before it: the
    caller discards the output file), ``OSError`` for I/O errors.
    """
    row_bytes = hidden * itemsize(dtype)
    scales = np.zeros((rows, 1), np.float32)
    blocks = _blocks(rows)
    io_rows = min(IO_ROWS, max(rows, 1))
    n = max(1, min(workers or workers_for(1), len(blocks)))
    slots = [_Slot(io_rows * row_bytes, io_rows * hidden) for _ in range(n + 2)]
    bits = np.uint32 if dtype == "F32" else np.uint16
    logs = [NormLog() for _ in blocks]  # norms per block, accounted in row order at the end
    advise(src_fd, offset, rows * row_bytes, "POSIX_FADV_SEQUENTIAL")

    def read(slot: _Slot, first: int, r: int) -> None:
        _read_exact(src_fd, memoryview(slot.inp)[: r * row_bytes], offset + first * row_bytes, what)

    def computer() -> Callable[[_Slot, int, int, int], None]:
        rq = RowQuantizer(hidden, dtype)  # scratch of its own per thread

        def compute(slot: _Slot, index: int, first: int, r: int) -> None:
            raw = np.frombuffer(slot.inp, bits, count=r * hidden).reshape(r, hidden)
            q = np.frombuffer(slot.out, np.int8, count=r * hidden).reshape(r, hidden)
            rq.block(raw, first, q, scales[first:first + r], logs[index])
        return compute

    def write(slot: _Slot, first: int, r: int) -> None:
        write_all_at(dst_fd, memoryview(slot.out)[: r * hidden], at + first * hidden)
        tick(r * row_bytes)

    _pipeline(blocks, slots, read, [computer() for _ in range(n)], write)
    meter = QualityMeter()
    for log in logs:
        log.replay(meter)
    return scales, meter.figures()


def decode_table(src_fd: int, values_offset: int, scales_offset: int, rows: int, hidden: int, dtype: str,
                 dst_fd: int, at: int, tick: Tick, what: str = "table", workers: int | None = None) -> None:
    """Decode an I8 table and its F32 scales from ``src_fd`` to ``dtype`` rows at ``at`` of ``dst_fd``
    (``workers`` as for ``quantize_table``)."""
    out_row = hidden * itemsize(dtype)
    raw = bytearray(rows * 4)
    _read_exact(src_fd, memoryview(raw), scales_offset, what)
    scales = np.frombuffer(raw, np.float32).reshape(rows, 1)
    blocks = _blocks(rows)
    io_rows = min(IO_ROWS, max(rows, 1))
    n = max(1, min(workers or workers_for(1), len(blocks)))
    slots = [_Slot(io_rows * hidden, io_rows * out_row) for _ in range(n + 2)]
    bits = np.uint32 if dtype == "F32" else np.uint16
    advise(src_fd, values_offset, rows * hidden, "POSIX_FADV_SEQUENTIAL")

    def read(slot: _Slot, first: int, r: int) -> None:
        _read_exact(src_fd, memoryview(slot.inp)[: r * hidden], values_offset + first * hidden, what)

    def computer() -> Callable[[_Slot, int, int, int], None]:
        dec = RowDecoder(hidden, dtype)

        def compute(slot: _Slot, index: int, first: int, r: int) -> None:
            q = np.frombuffer(slot.inp, np.int8, count=r * hidden).reshape(r, hidden)
            out = np.frombuffer(slot.out, bits, count=r * hidden).reshape(r, hidden)
            dec.block(q, scales[first:first + r], out)
        return compute

    def write(slot: _Slot, first: int, r: int) -> None:
        write_all_at(dst_fd, memoryview(slot.out)[: r * out_row], at + first * out_row)
        tick(r * hidden)

    _pipeline(blocks, slots, read, [computer() for _ in range(n)], write)
