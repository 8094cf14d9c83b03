"""What must never be served stops the engine at start-up, in vLLM's worker, with the finding code
and the fix in the error the user sees (the server's log), before any weight is loaded."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from engines import NEW, OLD, engine_kwargs

from clef_format.spec import layouts as L

CASES = [
    # (checkpoint, plugin version, finding code, part of the fix)
    ("layout-2-unmarked", NEW, "marker-missing", "--to layout-2"),
    ("layout-2-unmarked", OLD, "marker-missing", "--to layout-2"),
    ("layout-1", NEW, "plugin-incompatible", "--to layout-2"),
    ("layout-2", OLD, "plugin-incompatible", "pip install 'clef-vllm>=0.2.0'"),
    ("layout-2-no-tables-file", NEW, "tables-missing", f"download {L.TABLES}"),
]


@pytest.mark.parametrize("name, plugin, code, fix", CASES, ids=[f"{c[0]}-plugin-{c[1]}" for c in CASES])
def test_refused_at_startup_with_code_and_fix(engines: Any, checkpoint: Callable, name: str, plugin: str,
                                              code: str, fix: str) -> None:
    root = checkpoint(name)
    engine = engines.get(f"{name} [{plugin}] generate", root, plugin, **engine_kwargs(root))
    assert not engine.ok
    assert engine.error  # LLM() raised
    log = engine.log
    assert "IncompatibleError" in log
    line = next(ln for ln in log.splitlines() if f"[{code}]" in ln)  # the reason, with its finding code
    assert str(root) in log or code == "tables-missing", line
    assert "fix: " in log and fix in log
    assert "clef_vllm/model.py" in log  # raised by the plugin's gate in the model's constructor ...
    assert "Loading weights took" not in log  # ... before vLLM loaded any weight
