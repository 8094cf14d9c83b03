"""A seeded random sample of the mutants not yet run, the same number from each mutated module.

A full mutmut run of every rule module is ~10,000 mutants and hours of CPU (docs/TESTING.md); a
sample of N per module estimates each module's kill rate with a known error, and its survivors are
real gaps or equivalent mutants all the same. Reads the mutant names from mutants/**/*.py.meta
(written when mutmut generates mutants) and prints the chosen names, one per line, for
``mutmut run $(python scripts/mutation_sample.py -n 40)``.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def sample(root: Path, per_module: int, seed: int, include_run: bool = False,
           only: list[str] | None = None) -> list[str]:
    rng = random.Random(seed)
    out: list[str] = []
    for meta in sorted(root.glob("**/*.py.meta")):
        if only and not any(meta.as_posix().endswith(f"/{m}.meta") for m in only):
            continue
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        names = sorted(n for n, code in codes.items() if include_run or code is None)
        out += sorted(rng.sample(names, min(per_module, len(names))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--per-module", type=int, default=40)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--include-run", action="store_true", help="sample among the mutants already run too")
    ap.add_argument("--only", action="append", metavar="MODULE",
                    help="only this mutated module, as its path under clef_format/ (spec/model_spec.py); repeatable")
    args = ap.parse_args()
    only = [f"clef_format/{m}" for m in args.only or []]
    print("\n".join(sample(Path("mutants"), args.per_module, args.seed, args.include_run, only)))


if __name__ == "__main__":
    main()
