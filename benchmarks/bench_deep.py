"""Benchmark ``verify --deep`` on a full-size checkpoint of real random data (warm page cache, one run).

    python benchmarks/bench_deep.py [--dir /tmp/clef-bench-deep] [--build nvfp4] [--runs 3] [--keep]

Builds the 9B layout-2 checkpoint (nvfp4: model.safetensors 4.8 GB, tables 2.0 GB, head 0.24 GB:
dominated by one file, as the real ones are), fills every data buffer with random bytes (scales
set to valid values so verify is clean), and measures, each the median of ``--runs``:

(b) against clef-format's manifest (BLAKE3): ``clef-format verify --deep DIR`` vs hashing every
    file one after another with Python's hashlib.sha256 (what ``hf cache verify`` does); bound 0.5x.
(a) against Hugging Face etags: the files are moved into a real-format cache
    (``models--bench--clef/{blobs,snapshots,refs}``), then ``clef-format verify --deep bench/clef``
    vs sha256 of the largest file alone (bound 1.1x) and ``sha256sum`` over all files (must be slower).
    Also records the load average, since other work on the machine skews (a) most.

Every verify runs as a subprocess of the real CLI, start-up included. Deletes everything at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clef_format.read.hashing import hash_file  # noqa: E402
from clef_format.read.safetensors import read_header  # noqa: E402

CLI = [sys.executable, "-m", "clef_format.cli"]
ONE = {"F32": struct.pack("<f", 0.01), "BF16": b"\x80\x3f", "F16": b"\x00\x3c", "F8_E4M3": b"\x38",
       "F64": struct.pack("<d", 0.01)}


def fill_random(root: Path, seed: int = 0) -> None:
    """Overwrite every safetensors data buffer with random bytes, then give every scale a valid value."""
    import numpy as np

    rng = np.random.default_rng(seed)
    for path in sorted(root.rglob("*.safetensors")):
        h = read_header(path)
        with open(path, "r+b") as fh:
            fh.seek(h.data_start)
            left = h.file_size - h.data_start
            while left:
                n = min(left, 64 << 20)
                fh.write(rng.bytes(n))
                left -= n
            for name, t in h.tensors.items():
                if name.endswith("_scale") and t.dtype in ONE:
                    fh.seek(h.data_start + t.begin)
                    fh.write(ONE[t.dtype] * (t.nbytes // len(ONE[t.dtype])))
        os.fsync(os.open(path, os.O_RDONLY))


def all_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and ".cache" not in p.parts)


def warm(paths: list[Path]) -> None:
    for p in paths:
        with open(p, "rb", buffering=0) as fh:
            while fh.read(64 << 20):
                pass


def timed(fn: Callable[[], object], runs: int) -> float:
    """Best of ``runs``: the machine is shared, and the minimum is the least disturbed measurement."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def interleaved(fns: dict[str, Callable[[], object]], runs: int) -> dict[str, float]:
    """Best of ``runs`` each, alternating the contenders so background load hits them alike."""
    best = {k: float("inf") for k in fns}
    for _ in range(runs):
        for k, fn in fns.items():
            best[k] = min(best[k], timed(fn, 1))
    return best


def file_digest_sha256(paths: list[Path]) -> None:
    """Sequential hashlib.sha256, the stdlib way (hashlib.file_digest): what `hf cache verify` amounts to."""
    for p in paths:
        with open(p, "rb") as fh:
            hashlib.file_digest(fh, "sha256")


def chunked_sha256(paths: list[Path]) -> None:
    for p in paths:
        hash_file(str(p), "sha256")


def run_cli(args: list[str], env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run(CLI + args, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{args}: exit {proc.returncode}\n{proc.stderr}")
    return json.loads(proc.stdout) if "--json" in args else {}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/clef-bench-deep")
    ap.add_argument("--build", default="nvfp4")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    base = Path(a.dir)
    if base.exists():
        shutil.rmtree(base)
    base.mkdir(parents=True)
    free = shutil.disk_usage(base).free
    if free < 12e9:
        raise SystemExit(f"needs ~8 GB free on {base}, has {free / 1e9:.1f} GB")
    results: dict[str, float | str] = {"cpus": os.cpu_count() or 0, "loadavg_start": os.getloadavg()[0]}
    try:
        from clef_format.fixtures.builders import build_checkpoint

        src = base / "ck"
        build_checkpoint(src, "layout-2", a.build, full_size=True)
        fill_random(src)
        files = all_files(src)
        sizes = {p.relative_to(src).as_posix(): p.stat().st_size for p in files}
        results["total_gb"] = sum(sizes.values()) / 1e9
        largest = max(files, key=lambda p: p.stat().st_size)
        results["largest"] = f"{largest.relative_to(src).as_posix()} {largest.stat().st_size / 1e9:.2f} GB"
        warm(files)
        check = run_cli(["verify", str(src), "--json"])
        assert check["ok"], check["findings"]

        # (b) clef-format's own manifest
        t0 = time.perf_counter()
        run_cli(["manifest", str(src)])
        results["manifest_write_s"] = time.perf_counter() - t0
        warm(files)
        rep: dict = {}
        b = interleaved({"seq": lambda: file_digest_sha256(files),
                         "deep": lambda: rep.update(run_cli(["verify", str(src), "--deep", "--json"]))}, a.runs)
        results["b_seq_hashlib_all_s"], results["b_deep_manifest_s"] = b["seq"], b["deep"]
        assert rep["ok"] and "deep-verified" in {f["code"] for f in rep["findings"]}, rep["findings"]
        results["b_ratio"] = results["b_deep_manifest_s"] / results["b_seq_hashlib_all_s"]  # type: ignore[operator]

        # (a) Hugging Face etags: move the files into a real-format cache
        from tests.support.hub_cache import build_hub_cache

        (src / "clef_manifest.json").unlink()
        cache = base / "hub"
        snapshot = build_hub_cache(cache, "bench/clef", src, move=True)
        blobs = sorted(Path(os.path.realpath(snapshot / rel)) for rel in sizes)
        big_blob = Path(os.path.realpath(snapshot / largest.relative_to(src)))
        env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
        warm(blobs)
        at = interleaved({"stdlib": lambda: file_digest_sha256([big_blob]),
                          "chunked": lambda: chunked_sha256([big_blob]),
                          "deep": lambda: rep.update(run_cli(["verify", "bench/clef", "--deep", "--json"], env))},
                         a.runs)
        results["a_largest_alone_file_digest_s"] = at["stdlib"]
        results["a_largest_alone_chunked_s"] = at["chunked"]
        results["a_largest_alone_s"] = min(at["stdlib"], at["chunked"])
        results["a_deep_etag_s"] = at["deep"]
        codes = {f["code"] for f in rep["findings"]}
        assert rep["ok"] and "deep-verified" in codes and "manifest-missing" not in codes, rep["findings"]
        results["a_sha256sum_all_s"] = timed(
            lambda: subprocess.run(["sha256sum", *map(str, blobs)], check=True, capture_output=True), 1)
        results["a_ratio_vs_largest"] = results["a_deep_etag_s"] / results["a_largest_alone_s"]  # type: ignore[operator]
        results["a_ratio_vs_sha256sum"] = results["a_deep_etag_s"] / results["a_sha256sum_all_s"]  # type: ignore[operator]
        results["b_seq_hashlib_GBps"] = results["total_gb"] / results["b_seq_hashlib_all_s"]  # type: ignore[operator]
        results["loadavg_end"] = os.getloadavg()[0]
    finally:
        if not a.keep:
            shutil.rmtree(base, ignore_errors=True)
    for k, v in results.items():
        print(f"{k:32} {v:.3f}" if isinstance(v, float) else f"{k:32} {v}")
    ok_a = results["a_ratio_vs_largest"] <= 1.1 and results["a_ratio_vs_sha256sum"] < 1  # type: ignore[operator]
    ok_b = results["b_ratio"] <= 0.5  # type: ignore[operator]
    print(f"(a) {'PASS' if ok_a else 'FAIL'}   (b) {'PASS' if ok_b else 'FAIL'}")
    print(json.dumps(results))
    return 0 if ok_a and ok_b else 1


if __name__ == "__main__":
    sys.exit(main())
