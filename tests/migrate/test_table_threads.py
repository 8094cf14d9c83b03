"""The table streams use every core given, and write the same bytes whatever the thread count.

``migrate.table_stream`` quantizes (or decodes) a table on several compute threads over row blocks:
real files in, real files out, each thread count against the single-thread path, byte for byte
(the int8 values, the scales bit for bit, the quality figures to the last digit). No torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clef_format.migrate import table_stream
from clef_format.quant import int8 as N

ROOT = Path(__file__).resolve().parents[2]
ROWS, HIDDEN, LEAD = 701, 96, 40


def _table(dtype: str, seed: int) -> np.ndarray:
    """Rows as a real table holds them (Gaussian, a log-normal scale per row), with the rows that take
    the rare paths: all zero, tiny (a denormal scale in F32), one dominant feature, ties at .5."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((ROWS, HIDDEN)).astype(np.float32) * (0.02 * np.exp(0.3 * rng.standard_normal((ROWS, 1))))
    x = x.astype(np.float32)
    x[5] = 0
    x[77] *= 1e-39 if dtype == "F32" else 1e-3
    x[300, 7] = 40.0
    x[650, :4] = [127.0, 63.5, -0.5, 1.5]
    if dtype == "BF16":
        return N.f32_to_bf16(x)
    if dtype == "F16":
        return x.astype(np.float16).view(np.uint16)
    return x.view(np.uint32)


def _quantize(tmp_path: Path, bits: np.ndarray, dtype: str, workers: int) -> tuple[bytes, bytes, dict]:
    src_path = tmp_path / f"src-{dtype}.bin"
    if not src_path.exists():
        src_path.write_bytes(b"\x11" * LEAD + bits.tobytes())
    dst_path = tmp_path / f"q-{dtype}-{workers}.bin"
    src = os.open(src_path, os.O_RDONLY)
    dst = os.open(dst_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    try:
        scales, figures = table_stream.quantize_table(src, LEAD, ROWS, HIDDEN, dtype, dst, 8, lambda n: None,
                                                      workers=workers)
    finally:
        os.close(src)
        os.close(dst)
    return dst_path.read_bytes(), scales.tobytes(), figures


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_every_thread_count_writes_the_single_thread_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            dtype: str) -> None:
    monkeypatch.setattr(table_stream, "IO_ROWS", 16)  # 44 blocks: threads finish them out of order
    bits = _table(dtype, seed=3)
    one = _quantize(tmp_path, bits, dtype, 1)
    assert len(one[0]) == 8 + ROWS * HIDDEN and one[2]["rows"] == ROWS
    for workers in (2, 3, 8):
        assert _quantize(tmp_path, bits, dtype, workers) == one, f"{workers} threads"
    # and the single-thread path is the quantizer itself, in one call
    q, s = N.quantize_rows(bits, dtype)
    assert one[0][8:] == q.tobytes() and one[1] == s.tobytes()


def test_decoding_on_every_thread_count_writes_the_single_thread_bytes(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(table_stream, "IO_ROWS", 16)
    q, s = N.quantize_rows(_table("BF16", seed=4), "BF16")
    s[9] = np.float32(np.inf)  # a scale no writer makes: the decoder's NaN path runs too
    src_path = tmp_path / "tables.bin"
    src_path.write_bytes(q.tobytes() + s.tobytes())
    outs = []
    for workers in (1, 2, 5):
        dst_path = tmp_path / f"d-{workers}.bin"
        src = os.open(src_path, os.O_RDONLY)
        dst = os.open(dst_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        try:
            table_stream.decode_table(src, 0, ROWS * HIDDEN, ROWS, HIDDEN, "BF16", dst, 0, lambda n: None,
                                      workers=workers)
        finally:
            os.close(src)
            os.close(dst)
        outs.append(dst_path.read_bytes())
    assert outs[0] == N.dequantize_rows(q, s, "BF16").tobytes()
    assert outs[1] == outs[0] and outs[2] == outs[0]


# Each compute thread is recorded as it starts running (threading.settrace's hook runs first in every
# thread started after it): a thread is counted whether or not it is still alive when a block is written.
# Sampling threading.enumerate() at each write missed threads on a 16-core box, where the 16 tiny
# blocks are computed, and the threads given their end marker and gone, before the writer runs.
_COUNT_THREADS = """
import json, os, sys, threading
os.sched_setaffinity(0, {cpus})
from clef_format.migrate import table_stream
table_stream.IO_ROWS = 4
seen = set()
def started(frame, event, arg):
    name = threading.current_thread().name
    if name.startswith("clef-table-compute"):
        seen.add(name)
    sys.settrace(None)  # the thread's first call only: that it ran is all this records
threading.settrace(started)
src = os.open(sys.argv[1], os.O_RDONLY)
dst = os.open(sys.argv[2], os.O_RDWR | os.O_CREAT)
table_stream.quantize_table(src, 0, 64, 8, "BF16", dst, 0, lambda n: None)
print(json.dumps({{"given": table_stream.cores_given(), "threads": 1 + len(seen),
                   "two_tables": table_stream.workers_for(2)}}))
"""


def test_a_table_uses_every_core_the_process_is_given(tmp_path: Path) -> None:
    """Default thread count: the cores of the affinity mask (``taskset``, a container's cpuset), all of
    them for one table, half each for the two tables the tables file streams at once."""
    src = tmp_path / "t.bin"
    src.write_bytes(np.full((64, 8), 0x3F80, np.uint16).tobytes())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("CLEF_FORMAT_TABLE_WORKERS", None)
    mine = sorted(os.sched_getaffinity(0))
    for cpus in ({mine[0]}, set(mine)):
        proc = subprocess.run([sys.executable, "-c", _COUNT_THREADS.format(cpus=cpus), str(src), str(tmp_path / "o")],
                              capture_output=True, text=True, env=env, check=True)
        got = json.loads(proc.stdout)
        assert got["given"] == len(cpus)
        assert got["threads"] == len(cpus)  # the calling thread and one more per further core
        assert got["two_tables"] == max(1, len(cpus) // 2)
