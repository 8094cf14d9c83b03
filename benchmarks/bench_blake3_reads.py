"""BLAKE3 over a memory map (what hashing used before) vs plain reads of several sizes (what it uses now:
a map of a file that shrinks under the reader kills the process with SIGBUS; a read returns less).

Usage: PYTHONPATH=. .venv/bin/python benchmarks/bench_blake3_reads.py FILE [--runs 4]
(FILE: about 1 GB, warm in the page cache; the steps are interleaved, medians printed.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import blake3

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from clef_format.read import hashing  # noqa: E402


def _mapped(path: str) -> str:
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    h.update_mmap(path)
    return str(h.hexdigest())


def _reads(chunk: int) -> Callable[[str], str]:
    return lambda path: hashing._stream(path, lambda _s: blake3.blake3(max_threads=blake3.blake3.AUTO), chunk, None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--runs", type=int, default=4)
    args = ap.parse_args()
    gb = os.path.getsize(args.file) / 1e9
    steps: dict[str, Callable[[str], str]] = {"update_mmap": _mapped}
    steps.update({f"reads of {c >> 20} MiB": _reads(c) for c in (1 << 20, 4 << 20, 16 << 20, 64 << 20)})
    times: dict[str, list[float]] = {name: [] for name in steps}
    digests = set()
    for _ in range(args.runs):
        for name, fn in steps.items():
            t = time.perf_counter()
            digests.add(fn(args.file))
            times[name].append(time.perf_counter() - t)
    assert len(digests) == 1, "every way must give the same digest"
    for name, v in times.items():
        med = statistics.median(v)
        print(f"{name:18s} median {med:.3f} s  {gb / med:.2f} GB/s  runs {[round(x, 3) for x in v]}")


if __name__ == "__main__":
    main()
