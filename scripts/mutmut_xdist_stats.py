"""pytest plugin: mutmut's stats pass (which tests reach which mutated function) under pytest-xdist.

mutmut 3.8 records the functions each test reaches in one pytest process; on a 16-core machine the
same record is taken with ``-n 16`` by loading this plugin (``-p mutmut_xdist_stats`` with mutants/
on PYTHONPATH and ``MUTANT_UNDER_TEST=stats``): every worker writes its part into
``CLEF_MUTMUT_SUBSTATS`` and ``scripts/mutation_substats.py --build`` joins the parts (and the
records of clef-format subprocesses, see scripts/mutmut_sitecustomize.py) into mutmut-stats.json.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

from mutmut.state import state

_tests: dict[str, set[str]] = defaultdict(set)
_durations: dict[str, float] = {}
_failed: set[str] = set()


def pytest_runtest_logstart(nodeid, location):  # noqa: ARG001
    _durations[nodeid] = 0.0
    state()._stats.clear()


def pytest_runtest_teardown(item, nextitem):  # noqa: ARG001
    for function in state()._stats:
        _tests[function].add(item.nodeid)
    state()._stats.clear()


def pytest_runtest_makereport(item, call):
    if call.when == "call":
        _durations[item.nodeid] = _durations.get(item.nodeid, 0.0) + call.duration
    if call.excinfo is not None and not call.excinfo.errisinstance(
            __import__("_pytest.outcomes", fromlist=["Skipped"]).Skipped):
        _failed.add(item.nodeid)


def pytest_sessionfinish(session):  # noqa: ARG001
    out = os.environ["CLEF_MUTMUT_SUBSTATS"]
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.path.join(out, f"worker-{worker}.stats"), "w") as fh:
        json.dump({"tests": {k: sorted(v) for k, v in _tests.items()}, "durations": _durations,
                   "failed": sorted(_failed)}, fh)
