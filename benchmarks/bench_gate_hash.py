"""The serving gate's hashing: hash rates on a multi-GB file, thread scaling, and the whole gate on the
full-size Hybrid layout (8.7 GB) as a ``--local-dir`` download, with and without hashing.

Usage: PYTHONPATH=. .venv/bin/python benchmarks/bench_gate_hash.py [--runs 3] [--gb 4] [--dir DIR] [--skip-gate]

Part 1, rates: one ``--gb`` GB file (a random 64 MiB block repeated: the hash functions' cost does not
depend on the bytes), warm in the page cache, each step interleaved ``--runs`` times:

* ``sha256``, ``git-sha1`` and ``blake3`` with clef-format's own readers (``read.hashing.hash_file``:
  what a cache blob name / small-file etag / ``clef_manifest.json`` entry needs);
* coreutils ``sha256sum`` of the same file;
* the file hashed twice with sha256 by ``hash_many``, one worker then two (do threads scale here?).

Part 2, the gate: ``clef-format example DIR --full-size --build hybrid`` (real headers; data a sparse
hole, so the hashing reads zeros from the page cache: CPU cost per byte, not disk speed), turned into
a ``--local-dir`` download (huggingface_hub's ``write_download_metadata``, etags sha256 / git-sha1),
then ``check_checkpoint`` with hashing (nothing remembered from the run before), the same call again
(what the plugin's later calls in one start cost: files proven are not hashed again) and with
``check_references=False`` (nothing remembered), interleaved ``--runs`` times. Prints medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BLOCK = 64 * 1024 * 1024


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def write_file(path: Path, gb: float) -> int:
    block = os.urandom(BLOCK)
    n = int(gb * 1e9) // BLOCK
    with open(path, "wb") as fh:
        for _ in range(n):
            fh.write(block)
    subprocess.run(["cat", str(path)], check=True, stdout=subprocess.DEVNULL)  # warm the page cache
    return n * BLOCK


def rates(tmp: Path, gb: float, runs: int) -> dict:
    from clef_format.read.hashing import HashTask, hash_file, hash_many

    path = tmp / "big.bin"
    size = write_file(path, gb)
    p = str(path)
    two = [HashTask("a", p, "sha256", size), HashTask("b", p, "sha256", size)]
    steps: dict[str, Callable[[], object]] = {
        "sha256 (hash_file)": lambda: hash_file(p, "sha256"),
        "git-sha1 (hash_file)": lambda: hash_file(p, "git-sha1"),
        "blake3 (hash_file, all cores)": lambda: hash_file(p, "blake3"),
        "sha256sum": lambda: subprocess.run(["sha256sum", p], check=True, stdout=subprocess.DEVNULL),
        "2 x sha256, 1 worker": lambda: hash_many(two, workers=1),
        "2 x sha256, 2 workers": lambda: hash_many(two, workers=2),
    }
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(runs):
        for name, fn in steps.items():
            times[name].append(timed(fn))
    path.unlink()
    return {"bytes": size, "times": times}


def local_dir(root: Path) -> None:
    """Per file, the metadata ``hf download --local-dir`` writes (huggingface_hub's own writer)."""
    from huggingface_hub._local_folder import write_download_metadata

    from tests.support.hub_cache import default_lfs, etag_of, fake_commit

    commit = fake_commit("kurcontko/clef-flash-NVFP4-Hybrid@main")
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        write_download_metadata(root, rel, commit, etag_of(path, default_lfs(rel, path.stat().st_size)))


def gate(tmp: Path, runs: int) -> dict:
    from clef_format.compat import check_checkpoint
    from clef_format.vllm.content import forget_verified

    root = tmp / "full"
    subprocess.run([sys.executable, "-m", "clef_format", "example", str(root), "--full-size", "--build", "hybrid"],
                   check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    t = time.perf_counter()
    local_dir(root)
    setup = time.perf_counter() - t
    sizes = {p.relative_to(root).as_posix(): p.stat().st_size for p in root.rglob("*")
             if p.is_file() and ".cache" not in p.parts}

    def hashed() -> None:
        forget_verified()
        check_checkpoint(root, "0.2.1")

    def unhashed() -> None:
        forget_verified()
        check_checkpoint(root, "0.2.1", check_references=False)

    times: dict[str, list[float]] = {"gate, hashing on": [], "gate, check_references=False": [],
                                     "gate again in the same process (files unchanged)": []}
    for _ in range(runs):
        times["gate, hashing on"].append(timed(hashed))
        times["gate again in the same process (files unchanged)"].append(
            timed(lambda: check_checkpoint(root, "0.2.1")))
        times["gate, check_references=False"].append(timed(unhashed))
    return {"bytes": sum(sizes.values()), "largest": max(sizes.values()), "files": len(sizes),
            "etag_setup_s": setup, "times": times}


def table(times: dict[str, list[float]], size: int | None) -> None:
    print("| step | median s | runs (s) | GB/s |\n|---|---|---|---|")
    for step, ts in times.items():
        med = statistics.median(ts)
        rate = "" if size is None else f"{size * (2 if step.startswith('2 x') else 1) / med / 1e9:.2f}"
        print(f"| {step} | {med:.3f} | {', '.join(f'{x:.3f}' for x in ts)} | {rate} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--gb", type=float, default=4.0)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--skip-gate", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out: dict = {"cpus": os.cpu_count(), "load_start": load()}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="clef-bench-gate-hash.") as tmp:
        out["rates"] = rates(Path(tmp), args.gb, args.runs)
        out["load_after_rates"] = load()
        if not args.skip_gate:
            out["gate"] = gate(Path(tmp), args.runs)
    out["load_end"] = load()
    if args.json:
        print(json.dumps(out))
        return
    r = out["rates"]
    print(f"{out['cpus']} CPUs; load average at start {out['load_start']}, after rates {out['load_after_rates']}, "
          f"at end {out['load_end']}")
    print(f"\nPart 1: one file of {r['bytes'] / 1e9:.2f} GB, warm page cache")
    table(r["times"], r["bytes"])
    one, two = (statistics.median(r["times"][k]) for k in ("2 x sha256, 1 worker", "2 x sha256, 2 workers"))
    print(f"thread scaling, 2 streams: {one / two:.2f}x with 2 workers")
    if "gate" in out:
        g = out["gate"]
        print(f"\nPart 2: full-size Hybrid as a --local-dir download: {g['files']} files, {g['bytes'] / 1e9:.2f} GB, "
              f"largest {g['largest'] / 1e9:.2f} GB (etags written in {g['etag_setup_s']:.1f} s)")
        table(g["times"], None)
        on, off = (statistics.median(g["times"][k]) for k in list(g["times"])[:2])
        print(f"hashing adds {on - off:.2f} s to the gate ({g['bytes'] / (on - off) / 1e9:.2f} GB/s over all files)")


if __name__ == "__main__":
    main()
