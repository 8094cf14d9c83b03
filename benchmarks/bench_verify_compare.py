"""verify of two trees in one run: a change's effect, measured where the machine's speed cannot drift
between the two (on the 2-core dev VM `python -c "import json"` moves from 28 to 41 ms within minutes).

    git worktree add /tmp/before <commit>
    .venv/bin/python benchmarks/bench_verify_compare.py --before /tmp/before --runs 20

Runs ``python -c "import json"`` and ``clef-format verify --json`` of the full-size layout-2
checkpoint with each tree first on ``PYTHONPATH``, interleaved, after byte-compiling both (as pip
would); prints the medians and their ratios to ``import json``.
"""

from __future__ import annotations

import argparse
import compileall
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_verify import print_table, timed  # noqa: E402  (one timer and one table for both benchmarks)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="a checkout of the tree to compare against (e.g. a git worktree)")
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    from clef_format.fixtures.builders import build_checkpoint

    trees = {"before": str(Path(args.before).resolve()), "after": str(ROOT)}
    for tree in trees.values():
        compileall.compile_dir(os.path.join(tree, "clef_format"), quiet=1)
    exe = os.path.join(os.path.dirname(sys.executable), "clef-format")
    with tempfile.TemporaryDirectory() as tmp:
        ck = build_checkpoint(Path(tmp) / "full", layout="layout-2", build="hybrid", full_size=True)
        cmds = {"python -c 'import json'": (None, [sys.executable, "-c", "import json"])}
        cmds.update({f"{name}: verify --json": (tree, [exe, "verify", str(ck), "--json"]) for name, tree in trees.items()})
        times: dict[str, list[float]] = {k: [] for k in cmds}
        for i in range(args.runs + 3):
            for key, (tree, cmd) in cmds.items():
                took = timed(cmd, dict(os.environ, **({"PYTHONPATH": tree} if tree else {})))
                if i >= 3:  # three warm-ups
                    times[key].append(took)
    print_table(times)


if __name__ == "__main__":
    main()
