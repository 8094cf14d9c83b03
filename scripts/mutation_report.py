"""Per-module kill rates of the last mutmut run (make mutation), read from mutants/**/*.py.meta.

Prints one row per mutated module: killed / checked, survivors, timeouts, mutants no selected test
reaches, and mutants not run yet; then the names of the survivors (``mutmut show NAME`` prints the
diff of one). With ``--markdown`` the table is printed as the docs/TESTING.md table.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

# mutmut's exit-code classes (mutmut/stats.py): 1 and 3 are kills, 0 a survivor.
KILLED = {1, 3}
SURVIVED = {0}
NO_TESTS = {5, 33}
TIMEOUT = {36, -24, 24, 152, 255}


def rows(root: Path) -> list[tuple[str, Counter, list[str]]]:
    out = []
    for meta in sorted(root.glob("**/*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        if not codes:
            continue
        c: Counter = Counter()
        survivors = []
        for name, code in codes.items():
            if code is None:
                c["not run"] += 1
            elif code in KILLED:
                c["killed"] += 1
            elif code in SURVIVED:
                c["survived"] += 1
                survivors.append(name)
            elif code in NO_TESTS:
                c["no tests"] += 1
                survivors.append(name)
            elif code in TIMEOUT:
                c["timeout"] += 1
            else:
                c["other"] += 1
                survivors.append(name)
        c["total"] = len(codes)
        out.append((str(meta.relative_to(root))[: -len(".meta")], c, survivors))
    return out


def main(argv: list[str]) -> int:
    root = Path("mutants")
    if not root.is_dir():
        print("no mutants/ here: run make mutation first", file=sys.stderr)
        return 2
    table = rows(root)
    md = "--markdown" in argv
    head = ("module", "killed / run", "survived", "no tests", "timeout", "not run", "total")
    if md:
        print("| " + " | ".join(head) + " |")
        print("|" + " --- |" * len(head))
    else:
        print(f"{head[0]:44} {head[1]:>14} {head[2]:>9} {head[3]:>9} {head[4]:>8} {head[5]:>8} {head[6]:>6}")
    for path, c, _ in table:
        run = c["total"] - c["not run"]
        # a timeout is a kill (the mutant made the tests hang): counted with the killed
        killed = c["killed"] + c["timeout"]
        cells = (path, f"{killed} / {run}", c["survived"], c["no tests"], c["timeout"], c["not run"], c["total"])
        if md:
            print("| " + " | ".join(str(x) for x in cells) + " |")
        else:
            print(f"{cells[0]:44} {cells[1]:>14} {cells[2]:>9} {cells[3]:>9} {cells[4]:>8} {cells[5]:>8} {cells[6]:>6}")
    if "--survivors" in argv:
        for path, _, survivors in table:
            for name in survivors:
                print(name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
