"""Where vLLM finds the quantization config, and how it reads quant_method (vLLM 0.28 and 0.33,
``weight_utils.get_quant_config`` and ``ModelConfig``'s normalization): ``quantization_config``, else
``text_config.quantization_config``, else ``compression_config``; ``quant_method`` lower-cased with
``compressed_tensors`` read as ``compressed-tensors``. A checkpoint that vLLM loads so is OK; an ``ignore``
of null, which vLLM iterates, is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from clef_format.verify.run import verify


def _edit(root: Path, change: Callable[[dict], None]) -> None:
    path = root / "config.json"
    config = json.loads(path.read_text())
    change(config)
    path.write_text(json.dumps(config))


def _errors(root: Path) -> list:
    return [f for f in verify(str(root)).findings if f.severity == "error"]


@pytest.mark.parametrize("method", ["Compressed-Tensors", "compressed_tensors", "COMPRESSED_TENSORS"])
def test_quant_method_is_read_as_vllm_normalizes_it(fresh: Any, method: str) -> None:
    root = fresh("layout-2", "fp8")
    _edit(root, lambda c: c["quantization_config"].update(quant_method=method))
    assert _errors(root) == []


def test_a_quant_method_vllm_does_not_normalize_is_still_refused(fresh: Any) -> None:
    root = fresh("layout-2", "fp8")
    _edit(root, lambda c: c["quantization_config"].update(quant_method=" compressed-tensors"))
    assert [f.code for f in _errors(root)] == ["quant-config-invalid"]


def test_the_config_under_compression_config_is_read(fresh: Any) -> None:
    root = fresh("layout-2", "fp8")
    _edit(root, lambda c: c.__setitem__("compression_config", c.pop("quantization_config")))
    assert _errors(root) == []


def test_the_config_inside_text_config_is_read(fresh: Any) -> None:
    root = fresh("layout-2", "fp8")
    _edit(root, lambda c: c["text_config"].__setitem__("quantization_config", c.pop("quantization_config")))
    assert _errors(root) == []


def test_an_ignore_of_null_is_refused_with_what_to_write(fresh: Any) -> None:
    root = fresh("layout-2", "fp8")
    _edit(root, lambda c: c["quantization_config"].update(ignore=None))
    (f,) = [f for f in _errors(root) if f.code == "quant-config-invalid"]
    assert "ignore is null" in f.message and "give a list" in f.message
