"""The unsampled mutmut run over what users see (docs/TESTING.md, "The unsampled run where users look").

mutmut 3.8 reads its config from pyproject.toml's [tool.mutmut], which is the config of make mutation;
this script runs mutmut with scripts/mutmut-unsampled.toml instead (or with the config file named by
the environment variable CLEF_MUTMUT_CONFIG, relative to the repository root or absolute, e.g.
scripts/mutmut-hooks.toml: the serving hooks against tests/hooks alone), from the repository root:

    python scripts/mutmut_unsampled.py generate             # mutants/ only, no test run
    # the stats pass under xdist, in mutants/ (see docs/TESTING.md), then:
    python scripts/mutmut_unsampled.py build DIR [--max-duration S]
    python scripts/mutmut_unsampled.py run [--max-children N] [--deadline UNIX_TIME] [NAME ...]
    python scripts/mutmut_unsampled.py reset-interrupted    # results of killed workers back to "not run"
    python scripts/mutmut_unsampled.py show NAME ...        # the diff of each mutant (mutmut show)

``build`` joins the xdist workers' parts and the clef-format subprocesses' records into
mutants/mutmut-stats.json (scripts/mutation_substats.py); ``--max-duration`` leaves out of the record
the tests slower than S seconds in that pass (their kills are not counted).

``run`` is ``mutmut run`` without its single-process passes: the clean run of every selected test,
the forced-fail run and the stats of tests missing from the record (the xdist pass stands for them:
a test that failed there is not in the record). It takes the modules in PRIORITY first (the modules
the last run left unrun), in mutmut's own order (fastest tests first), and submits no new
mutant after ``--deadline`` (the mutants in flight finish; the others stay "not run").
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG: Path = ROOT / (os.environ.get("CLEF_MUTMUT_CONFIG") or "scripts/mutmut-unsampled.toml")

PRIORITY = [
    "clef_format.migrate.session.",
    "clef_format.vllm.gate.",
    "clef_format.cli.commands.",
    "clef_format.cli.main.",
    "clef_format.cli.output.",
    "clef_format.cli.render.",
    "clef_format.migrate.manifest_writer.",
    "clef_format.read.safetensors.",
    "clef_format.vllm.int8_gather.",
]


def rank(mutant_name: str) -> int:
    """0 for the modules in PRIORITY, all together in mutmut's own order (fastest tests first), then
    the others. (The first device run took them one module after the other, session.py first: its
    mutants need minutes of tests each, and 34 ran in 265 s.)"""
    return 0 if mutant_name.startswith(tuple(PRIORITY)) else 1


def use_config() -> None:
    import tomllib

    import mutmut.configuration as configuration

    data = tomllib.loads(CONFIG.read_text())["tool"]["mutmut"]
    configuration._config_reader = lambda: (lambda key, default: data.get(key, default))  # type: ignore[assignment]
    configuration.reset_config()


def generate(max_children: int) -> None:
    from mutmut.__main__ import create_mutants
    from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir, setup_source_paths

    Path("mutants").mkdir(exist_ok=True)
    copy_src_dir()
    copy_also_copy_files()
    setup_source_paths()
    stats = create_mutants(max_children)
    shutil.copy(ROOT / "scripts" / "mutmut_sitecustomize.py", "mutants/sitecustomize.py")
    shutil.copy(ROOT / "scripts" / "mutmut_xdist_stats.py", "mutants/mutmut_xdist_stats.py")
    print(f"{stats.mutated} files mutated, {stats.unmodified} unmodified")


def build(substats: str, max_duration: float | None) -> None:
    import json

    sys.path.insert(0, str(ROOT / "scripts"))
    import mutation_substats

    stats_path = Path("mutants/mutmut-stats.json")
    failed = mutation_substats.build(stats_path, Path(substats))
    n, added = mutation_substats.merge(stats_path, Path(substats), failed)
    print(f"{n} subprocess records, {added} (function, test) pairs added")
    if max_duration is not None:
        stats = json.loads(stats_path.read_text())
        slow = {t for t, d in stats["duration_by_test"].items() if d > max_duration}
        for name, tests in stats["tests_by_mangled_function_name"].items():
            stats["tests_by_mangled_function_name"][name] = [t for t in tests if t not in slow]
        stats_path.write_text(json.dumps(stats, indent=4))
        print(f"left out of the record, slower than {max_duration} s: {len(slow)} tests: {sorted(slow)}")


def run(mutant_names: list[str], max_children: int, deadline: float | None) -> None:
    import mutmut.__main__ as main
    from mutmut.runners.harness import ListAllTestsResult, collected_test_names
    from mutmut.state import state
    from mutmut.workers.isolation import ForkRunner, ForkServerRunner

    def no_clean_run(self: object, tests: object) -> int:
        return 0

    def recorded_tests(self: object) -> ListAllTestsResult:
        return ListAllTestsResult(ids=set(collected_test_names()))

    for cls in (ForkServerRunner, ForkRunner):
        cls.run_clean_tests = no_clean_run  # type: ignore[method-assign]
        cls.list_all_tests = recorded_tests  # type: ignore[method-assign]
    main.run_forced_fail_test = lambda runner: None

    estimate = main.estimated_worst_case_time
    main.estimated_worst_case_time = lambda name: (rank(name), estimate(name))  # type: ignore[assignment,return-value]

    for cls in (ForkServerRunner, ForkRunner):
        submit = cls.submit

        # Each mutant's tests fastest first (pytest runs them in the order given, and stops at the first
        # failure); no new mutant after the deadline.
        def ordered_submit(self, mutant_name, tests, cpu_time_limit, estimated_time, _submit=submit):  # type: ignore[no-untyped-def]
            if deadline is None or time.time() < deadline:
                tests = sorted(tests, key=lambda t: (state().duration_by_test.get(t, 0.0), t))
                _submit(self, mutant_name, tests, cpu_time_limit, estimated_time)

        cls.submit = ordered_submit  # type: ignore[method-assign]
        if deadline is not None:
            cls.has_capacity = (lambda has: lambda self: time.time() >= deadline or has(self))(cls.has_capacity)  # type: ignore[method-assign]
    assert state() is not None
    main._run(mutant_names, max_children)


def reset_interrupted() -> None:
    """A worker stopped from outside (SIGINT to the group) records exit code 2; those mutants were not run."""
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.utils.file_utils import walk_mutatable_files

    n = 0
    for path in walk_mutatable_files():
        m = SourceFileMutationData(path=path)
        m.load()
        bad = [k for k, v in m.exit_code_by_key.items() if v in (2, -2, -15)]
        for k in bad:
            m.exit_code_by_key[k] = None
        if bad:
            m.save()
            n += len(bad)
    print(f"{n} interrupted results reset to not run")


def main(argv: list[str]) -> int:
    use_config()
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    cmd, rest = argv[0], argv[1:]
    max_children = 16
    deadline = None
    max_duration = None
    names = []
    it = iter(rest)
    for a in it:
        if a == "--max-children":
            max_children = int(next(it))
        elif a == "--deadline":
            deadline = float(next(it))
        elif a == "--max-duration":
            max_duration = float(next(it))
        else:
            names.append(a)
    if cmd == "generate":
        generate(max_children)
    elif cmd == "build" and len(names) == 1:
        build(names[0], max_duration)
    elif cmd == "run":
        run(names, max_children, deadline)
    elif cmd == "reset-interrupted":
        reset_interrupted()
    elif cmd == "show" and names:
        from mutmut.__main__ import show

        for name in names:
            show.callback(name)  # type: ignore[misc]
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
