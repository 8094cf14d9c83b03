"""The serving gate's backbone scale decode, on the full-size Hybrid checkpoint, against ``sha256sum``.

Usage: .venv/bin/python benchmarks/bench_gate_scales.py [--runs 3] [--dir DIR]

Builds ``clef-format example DIR --full-size --build hybrid`` (real headers; the data a sparse hole
but for the one-element scales, 1.0), then times, interleaved:

* ``backbone scale decode``: ``verify.deep.backbone_scale_findings`` (what ``check_checkpoint`` adds:
  every ``*_scale`` tensor of the backbone decoded in 4 MiB chunks, bounded memory);
* ``sha256sum``: coreutils over the whole backbone file (what checking it against a Hub etag costs).

Prints medians and the ratio of the decode to ``sha256sum``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    from clef_format.read.checkpoint import read_checkpoint
    from clef_format.verify.deep import backbone_scale_findings, scale_tensors

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp) / "full"
        subprocess.run([sys.executable, "-m", "clef_format", "example", str(root), "--full-size", "--build", "hybrid"],
                       check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
        ck = read_checkpoint(root)
        backbone = root / "model.safetensors"
        scale_bytes = sum(ck.headers[rel].tensors[n].nbytes for rel, names in scale_tensors(ck).items()
                          if rel != "clef_head/tables_int8.safetensors" for n in names)
        times: dict[str, list[float]] = {"backbone scale decode": [], "sha256sum": []}
        for _ in range(args.runs):
            t = time.perf_counter()
            errors = [f for f in backbone_scale_findings(ck) if f.severity == "error"]
            times["backbone scale decode"].append(time.perf_counter() - t)
            assert not errors, errors
            t = time.perf_counter()
            subprocess.run(["sha256sum", str(backbone)], check=True, stdout=subprocess.DEVNULL)
            times["sha256sum"].append(time.perf_counter() - t)
        base = statistics.median(times["sha256sum"])
        print(f"backbone {backbone.stat().st_size / 1e9:.2f} GB, scale tensors {scale_bytes / 1e6:.1f} MB")
        print("| step | median s | runs (s) | ratio to `sha256sum` |\n|---|---|---|---|")
        for step, ts in times.items():
            med = statistics.median(ts)
            print(f"| {step} | {med:.3f} | {', '.join(f'{x:.3f}' for x in ts)} | {med / base:.3f}x |")


if __name__ == "__main__":
    main()
