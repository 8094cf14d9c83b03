"""pytest plugin: mutmut's stats pass (which tests reach which mutated function) under pytest-xdist.

mutmut 3.8 records the functions each test reaches in one pytest process; on a 16-core machine the
same record is taken with ``-n 16`` by loading this plugin (``-p mutmut_xdist_stats`` with mutants/
on PYTHONPATH and ``MUTANT_UNDER_TEST=stats``): every worker appends one line per finished test to
``CLEF_MUTMUT_SUBSTATS/worker-ID.jsonl`` (so a pass stopped at a time limit keeps every test that
finished) and ``scripts/mutation_substats.py --build`` joins the parts (and the records of
clef-format subprocesses, see scripts/mutmut_sitecustomize.py) into mutmut-stats.json.
"""

from __future__ import annotations

import json
import os

import pytest
from mutmut.state import state

_durations: dict[str, float] = {}
_failed: set[str] = set()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):  # noqa: ARG001
    """Wraps a test where it runs (an xdist worker, or the one process without -n), teardown included;
    the controller of an xdist run, which also sees the workers' log events, writes nothing."""
    state()._stats.clear()
    _durations[item.nodeid] = 0.0
    yield
    reached = sorted(state()._stats)
    state()._stats.clear()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    folder = os.environ["CLEF_MUTMUT_SUBSTATS"]
    os.makedirs(folder, exist_ok=True)  # absent, every test's write failed and xdist lost its workers
    path = os.path.join(folder, f"worker-{worker}.jsonl")
    with open(path, "a") as fh:
        fh.write(json.dumps({"test": item.nodeid, "names": reached, "duration": _durations[item.nodeid],
                             "failed": item.nodeid in _failed}) + "\n")


def pytest_runtest_makereport(item, call):
    if call.when == "call":
        _durations[item.nodeid] = _durations.get(item.nodeid, 0.0) + call.duration
    if call.excinfo is not None and not call.excinfo.errisinstance(
            __import__("_pytest.outcomes", fromlist=["Skipped"]).Skipped):
        _failed.add(item.nodeid)
