"""Build the hostile inputs of docs/SECURITY.md's bound and time verify and the gate on each.

The inputs: a copy of the small layout-2 fixture whose ``model.safetensors`` is replaced by a valid
safetensors file with a header of about 95 MB (1.2 million one-element tensors, every offset right,
the data section sparse), an index of 350,000 phantom entries, and a folder nested 1,000 deep.
Each run is a fresh process under ``/usr/bin/time -v`` (max RSS), for ``verify --json`` and for the
serving gate (``check_checkpoint``).

    PYTHONPATH=. python benchmarks/bench_hostile.py [--workdir DIR] [--tensors N]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

from clef_format.fixtures.builders import build_checkpoint
from clef_format.spec import layouts as L

PY = sys.executable


def write_many_tensors(path: str, n: int, name_len: int = 0) -> int:
    """A valid safetensors file of ``n`` F32 scalars (offsets contiguous, data sparse), names padded to
    ``name_len`` characters; returns the header size."""
    parts = []
    for i in range(n):
        parts.append(f'"{f"m.{i:07d}.weight":x<{name_len}}":'
                     f'{{"dtype":"F32","shape":[1],"data_offsets":[{4 * i},{4 * i + 4}]}}')
    raw = ("{" + ",".join(parts) + "}").encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(len(raw).to_bytes(8, "little"))
        fh.write(raw)
        fh.truncate(8 + len(raw) + 4 * n)
    return len(raw)


def phantom_index(root: str, n: int) -> None:
    """An index (under the 16 MB JSON limit) mapping ``n`` tensors no file holds to the one real file."""
    weight_map = {f"m.{i:07d}.weight": L.BACKBONE_SINGLE for i in range(n)}
    with open(os.path.join(root, L.BACKBONE_INDEX), "w") as fh:
        json.dump({"metadata": {}, "weight_map": weight_map}, fh)


def deep_folder(root: str, depth: int) -> None:
    d = os.path.join(root, "deep")
    for _ in range(depth):  # not os.makedirs: it recurses
        os.mkdir(d)
        d = os.path.join(d, "d")


def measure(cmd: list[str]) -> tuple[float, int, int, int]:
    """(seconds, max RSS in MB, exit status, stdout bytes) of one process."""
    start = time.perf_counter()
    out = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, env={**os.environ})
    wall = time.perf_counter() - start
    rss = int(re.search(rb"Maximum resident set size \(kbytes\): (\d+)", out.stderr).group(1)) // 1024
    return wall, rss, out.returncode, len(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workdir", default="/tmp/clef-hostile")
    ap.add_argument("--tensors", type=int, default=1_200_000)
    ap.add_argument("--phantoms", type=int, default=350_000)
    ap.add_argument("--name-len", type=int, default=0, help="pad tensor names to this many characters")
    args = ap.parse_args()
    subprocess.run(["rm", "-rf", args.workdir], check=True)  # shutil.rmtree recurses: the deep folder breaks it
    os.makedirs(args.workdir)
    cases = {}
    big = str(build_checkpoint(os.path.join(args.workdir, "big-header")))
    size = write_many_tensors(os.path.join(big, L.BACKBONE_SINGLE), args.tensors, args.name_len)
    cases[f"header {size / 1e6:.0f} MB, {args.tensors:,} tensors"] = big
    idx = str(build_checkpoint(os.path.join(args.workdir, "phantom-index")))
    phantom_index(idx, args.phantoms)
    cases[f"index of {args.phantoms:,} phantom entries"] = idx
    deep = str(build_checkpoint(os.path.join(args.workdir, "deep")))
    deep_folder(deep, 1000)
    cases["folder nested 1,000 deep"] = deep
    gate = ("from clef_format.compat import check_checkpoint, IncompatibleError\n"
            "try:\n    check_checkpoint(__import__('sys').argv[1], '0.2.1')\n"
            "except IncompatibleError as e:\n    print(str(e)[:200])\n")
    print("| input | command | wall s | max RSS MB | exit | stdout bytes |\n|---|---|---|---|---|---|")
    for label, path in cases.items():
        for name, cmd in (("verify --json", [PY, "-m", "clef_format", "verify", path, "--json"]),
                          ("gate", [PY, "-c", gate, path])):
            wall, rss, rc, nout = measure(cmd)
            print(f"| {label} | {name} | {wall:.1f} | {rss} | {rc} | {nout:,} |", flush=True)


if __name__ == "__main__":
    main()
