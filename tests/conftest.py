"""Shared fixtures: checkpoints are built once per session and copied for each test that changes them."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import pytest

from clef_format.fixtures.builders import build_checkpoint

try:  # the engine tier's env has no hypothesis (none of its tests uses it)
    from hypothesis import HealthCheck, settings
except ImportError:  # pragma: no cover - only in the engine env
    settings = None

# Hypothesis profiles (docs/TESTING.md). "ci", the default and what `make test` selects: the same
# examples on every run (derandomize) and no example database, so a run never fails on an example
# an earlier run stored in .hypothesis/. "explore" (`make test-explore`): random examples, remembered
# in .hypothesis/ so that a failure found is replayed until fixed. A test's own @settings (example
# counts, deadlines) apply under both. "ci" also drops the time-based checks (the deadline, too_slow):
# on a loaded machine they fail at random, which is what this profile is there to rule out.
if settings is not None:
    settings.register_profile("ci", derandomize=True, database=None, print_blob=True, deadline=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.register_profile("explore", derandomize=False)
    settings.load_profile("ci")

_CACHE: dict[tuple, Path] = {}


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``built(layout, build, **kw)`` -> a read-only-by-convention checkpoint shared by the session."""

    def make(layout: str = "layout-2", build: str = "hybrid", **kw: object) -> Path:
        key = (layout, build, tuple(sorted(kw.items())))
        # A later session in the same process (mutmut runs each mutant's tests in a fork of the one
        # that ran them all) finds the cache filled, but an earlier session's folders may be cleaned.
        if key not in _CACHE or not _CACHE[key].is_dir():
            root = tmp_path_factory.mktemp("ck") / f"{layout}-{build}"
            _CACHE[key] = build_checkpoint(root, layout=layout, build=build, **kw)
        return _CACHE[key]

    return make


@pytest.fixture
def fresh(built: Callable[..., Path], tmp_path: Path) -> Callable[..., Path]:
    """``fresh(layout, build, **kw)`` -> a private copy the test may change."""

    def make(layout: str = "layout-2", build: str = "hybrid", **kw: object) -> Path:
        dst = tmp_path / "ck"
        shutil.copytree(built(layout, build, **kw), dst, symlinks=True)
        return dst

    return make
