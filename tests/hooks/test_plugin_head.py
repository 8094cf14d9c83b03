"""The serving gate against the plugin's own head (clef_format.vllm.head.check_plugin_head): the head
file must hold exactly the names and shapes the plugin's JointSchemaHead builds (torch's meta device)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from clef_format.errors import IncompatibleError
from clef_format.fixtures.builders import HEAD_REFERENCES
from clef_format.read.safetensors import read_header
from clef_format.spec import layouts as L
from clef_format.vllm import check_plugin_head, plugin_head_shapes

NEW = "0.2.0"


def _head_class(name: str) -> type:
    spec = importlib.util.spec_from_file_location(f"plugin_{name}", HEAD_REFERENCES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.JointSchemaHead


@pytest.mark.parametrize("name", ["inferred", "release", "rms_blocks", "subclassed", "helpers"])
def test_the_plugins_own_head_class_module_or_state_dict_passes(fresh: Any, name: str) -> None:
    root = fresh("layout-2", "bf16", head_reference=name)
    cls = _head_class(name)
    cfg = {k: v for k, v in json.loads((root / L.HEAD_CONFIG).read_text()).items() if k != L.MARKER_KEY}
    with torch.device("meta"):
        module = cls(**cfg)
    for head in (cls, module, module.state_dict(), {k: tuple(v.shape) for k, v in module.state_dict().items()}):
        assert check_plugin_head(root, NEW, head).layout == "layout-2"
    assert plugin_head_shapes(cls, cfg) == {k: i.shape for k, i in read_header(root / L.HEAD_WEIGHTS).tensors.items()}


def test_a_head_file_of_another_plugins_head_is_refused(fresh: Any) -> None:
    """The checkpoint ships (and verifies with) the inferred head; a plugin whose head is the
    release-sized one cannot load it: refused, naming what its head lacks."""
    root = fresh("layout-2", "bf16", head_reference="inferred")
    with pytest.raises(IncompatibleError) as exc:
        check_plugin_head(root, NEW, _head_class("release"))
    assert exc.value.code == "head-incomplete"
    assert "the plugin's JointSchemaHead builds" in exc.value.reason


def _transpose(h: dict) -> None:
    h["layers.0.linear1.weight"] = h["layers.0.linear1.weight"][::-1]


@pytest.mark.parametrize("edit, code", [
    (lambda h: h.pop("residual_gate"), "head-unexpected"),       # the file holds what the plugin's head lacks
    (lambda h: h.update({"extra_scale": ()}), "head-incomplete"),  # the plugin's head needs what the file lacks
    (_transpose, "head-incomplete"),                              # load_state_dict refuses the shape
])
def test_a_head_file_the_plugins_head_cannot_load_is_refused(fresh: Any, edit: Any, code: str) -> None:
    """The checkpoint verifies (its own reference file matches it); the plugin's head differs by one tensor."""
    root = fresh("layout-2", "bf16", head_reference="inferred")
    cfg = {k: v for k, v in json.loads((root / L.HEAD_CONFIG).read_text()).items() if k != L.MARKER_KEY}
    plugin = plugin_head_shapes(_head_class("inferred"), cfg)
    edit(plugin)
    with pytest.raises(IncompatibleError) as exc:
        check_plugin_head(root, NEW, plugin)
    assert exc.value.code == code


def test_the_gate_refuses_a_reference_file_the_plugin_cannot_import(fresh: Any, tmp_path: Path) -> None:
    """The plugin imports joint_schema_model.py at start: a syntax error there is refused first, and the
    gate never runs the file (it would create the marker)."""
    from clef_format.vllm import check_checkpoint

    root = fresh("layout-2", "bf16")
    marker = tmp_path / "ran"
    (root / L.HEAD_CODE).write_text(f"open({str(marker)!r}, 'w')\nclass JointSchemaHead(nn.Module:\n")
    with pytest.raises(IncompatibleError) as exc:
        check_checkpoint(root, NEW)
    assert exc.value.code == "head-code-invalid" and not marker.exists()
