"""Adds to mutmut's record the tests that reach a mutated function only through a clef-format subprocess.

mutmut records which tests reach each function from inside the pytest process; a test that runs
``python -m clef_format`` reaches nothing in that record, so the mutants of the CLI would count as
"no tests" although tests/cli/test_contract.py and others run every command. During the stats pass,
``scripts/mutmut_sitecustomize.py`` (copied to ``mutants/sitecustomize.py``, with ``mutants/`` on
PYTHONPATH and ``CLEF_MUTMUT_SUBSTATS=DIR``) makes each such subprocess write the functions it reached
and the test that started it (``PYTEST_CURRENT_TEST``) into DIR; this script merges DIR into
``mutants/mutmut-stats.json``. The mutant runs need nothing more: the subprocess inherits
``MUTANT_UNDER_TEST`` and imports the mutated tree, so the mutant is switched on there too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def merge(stats_path: Path, substats: Path, exclude: frozenset[str] | set[str] = frozenset()) -> tuple[int, int]:
    stats = json.loads(stats_path.read_text())
    by_function = stats["tests_by_mangled_function_name"]
    known = set(stats["duration_by_test"])
    added = 0
    files = sorted(substats.glob("*.json"))
    for f in files:
        rec = json.loads(f.read_text())
        if rec["test"] not in known or rec["test"] in exclude:  # outside the selection, or failed in the pass
            continue
        for name in rec["names"]:
            tests = by_function.setdefault(name, [])
            if rec["test"] not in tests:
                tests.append(rec["test"])
                added += 1
    stats_path.write_text(json.dumps(stats, indent=4))
    return len(files), added


def build(stats_path: Path, substats: Path) -> set[str]:
    """mutmut-stats.json from the parts the xdist workers wrote (scripts/mutmut_xdist_stats.py); the
    tests that failed in that pass are left out of the record (they would count as kills)."""
    from mutmut.configuration import config

    tests: dict[str, set[str]] = {}
    durations: dict[str, float] = {}
    failed: set[str] = set()
    for f in sorted(substats.glob("worker-*.stats")):  # a worker's whole part, written at its end
        part = json.loads(f.read_text())
        for name, ids in part["tests"].items():
            tests.setdefault(name, set()).update(ids)
        durations.update(part["durations"])
        failed.update(part["failed"])
    for f in sorted(substats.glob("worker-*.jsonl")):  # one line per finished test
        for line in f.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut off when the pass was stopped
                continue
            for name in rec["names"]:
                tests.setdefault(name, set()).add(rec["test"])
            durations[rec["test"]] = rec["duration"]
            if rec["failed"]:
                failed.add(rec["test"])
    stats = {"tests_by_mangled_function_name": {k: sorted(v - failed) for k, v in tests.items()},
             "duration_by_test": durations, "stats_time": 0.0, "function_hashes": {}, "function_dependencies": {},
             "config_fingerprint": config().config_fingerprint(), "watched_file_hashes": {}, "git_commit": None}
    stats_path.write_text(json.dumps(stats, indent=4))
    print(f"{len(durations)} tests, {len(tests)} functions reached, failed in the stats pass: {sorted(failed)}")
    return failed


def main(argv: list[str]) -> int:
    failed: set[str] = set()
    if argv[:1] == ["--build"] and len(argv) == 2:
        failed = build(Path("mutants/mutmut-stats.json"), Path(argv[1]))
        argv = argv[1:]
    if len(argv) != 1:
        print("usage: mutation_substats.py [--build] DIR (run where mutants/ is)", file=sys.stderr)
        return 2
    n, added = merge(Path("mutants/mutmut-stats.json"), Path(argv[0]), failed)
    print(f"{n} subprocess records, {added} (function, test) pairs added")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
