"""verify on a full-size layout-2 Hybrid checkpoint vs ``python -c "import json"``, whole processes.

Usage: .venv/bin/python benchmarks/bench_verify.py [--runs 30]

Builds the 9B names and shapes with real headers and sparse data in a temp dir, then times whole
processes interleaved (json, verify --json, verify human) and reports medians and ratios.
The goal (issue 2): verify at most 3x the time of `python -c "import json"`.
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def timed(cmd: list[str], env: dict[str, str] | None = None) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
    return time.perf_counter() - t


def print_table(times: dict[str, list[float]], base: str = "python -c 'import json'") -> None:
    """Medians and their ratios to ``base``, as the RESULTS.md table."""
    ref = statistics.median(times[base])
    print(f"| command | median ms | ratio to `{base}` |")
    print("|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"| `{name}` | {med * 1000:.1f} | {med / ref:.2f}x |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    from clef_format.fixtures.builders import build_checkpoint

    # pip byte-compiles an installed package; a source tree under PYTHONDONTWRITEBYTECODE=1 would
    # otherwise recompile every changed module in every timed process (measured: 5.8x instead of 2.x)
    compileall.compile_dir(str(ROOT / "clef_format"), quiet=1)

    exe = os.path.join(os.path.dirname(sys.executable), "clef-format")
    with tempfile.TemporaryDirectory() as tmp:
        ck = build_checkpoint(Path(tmp) / "full", layout="layout-2", build="hybrid", full_size=True)
        imports = ("import clef_format.cli.main, clef_format.cli.commands.verify_cmd, clef_format.verify.run, "
                   "clef_format.read.hf_cache, clef_format.cli.render")
        cmds = {
            "python -c 'import json'": [sys.executable, "-c", "import json"],
            "clef-format verify --json": [exe, "verify", str(ck), "--json"],
            "clef-format verify": [exe, "verify", str(ck)],
            # where the time goes: the imports alone, and the one library the path cannot avoid
            "(imports of the verify path only)": [sys.executable, "-c", imports],
            "(python -c 'import argparse')": [sys.executable, "-c", "import argparse"],
        }
        rc = subprocess.run(cmds["clef-format verify --json"], capture_output=True).returncode
        assert rc == 0, "the full-size checkpoint must verify clean"
        times: dict[str, list[float]] = {k: [] for k in cmds}
        for _ in range(3):
            for cmd in cmds.values():
                timed(cmd)
        for _ in range(args.runs):
            for name, cmd in cmds.items():
                times[name].append(timed(cmd))
    print_table(times)


if __name__ == "__main__":
    main()
