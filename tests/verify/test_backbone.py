"""The backbone check (verify/checks/backbone.py) when the quantization config cannot be resolved:
each Linear module is then held to the scheme its stored tensors imply."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from clef_format.read.checkpoint import read_checkpoint
from clef_format.read.safetensors import read_header
from clef_format.spec import layouts as L
from clef_format.verify.checks.backbone import check_backbone

BF16_LINEAR = "model.visual.blocks.0.attn.qkv"  # unquantized in every build (vision is ignored)
FP8_LINEAR = "model.language_model.layers.0.mlp.down_proj"  # hybrid: layers 0-3 FP8


def _unresolvable(root: Path) -> None:
    """A quantization_config compressed-tensors refuses (an unknown key in a weights scheme)."""
    path = root / "config.json"
    config = json.loads(path.read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["bogus"] = 1
    path.write_text(json.dumps(config))


def _rewrite(root: Path, change) -> None:
    path = root / L.BACKBONE_SINGLE
    tensors = load_file(str(path))
    meta = read_header(path).metadata
    change(tensors)
    save_file(tensors, str(path), metadata=meta)


def _findings(root: Path) -> list[tuple[str, str | None, str]]:
    return [(f.code, f.tensor, f.message) for f in check_backbone(read_checkpoint(root))]


def test_stored_tensors_of_every_scheme_pass_when_the_config_is_unresolvable(fresh) -> None:
    root = fresh("layout-2", "hybrid")
    _unresolvable(root)
    assert _findings(root) == []


def test_an_unquantized_weight_is_held_to_the_model_dtype(fresh) -> None:
    root = fresh("layout-2", "hybrid")
    _unresolvable(root)
    _rewrite(root, lambda t: t.update({f"{BF16_LINEAR}.weight": t[f"{BF16_LINEAR}.weight"].to(torch.float32)}))
    ((code, tensor, message),) = _findings(root)
    assert (code, tensor) == ("tensor-shape", f"{BF16_LINEAR}.weight")
    assert "F32" in message and "BF16" in message


def test_a_quantized_weight_is_held_to_its_scheme_s_shapes(fresh) -> None:
    root = fresh("layout-2", "hybrid")
    _unresolvable(root)
    scale = f"{FP8_LINEAR}.weight_scale"
    _rewrite(root, lambda t: t.update({scale: torch.cat([t[scale], t[scale][:1]])}))
    ((code, tensor, _),) = _findings(root)
    assert (code, tensor) == ("tensor-shape", scale)


def test_a_module_without_a_weight_is_named(fresh) -> None:
    root = fresh("layout-2", "hybrid")
    _unresolvable(root)
    _rewrite(root, lambda t: [t.pop(n) for n in list(t) if n.startswith(f"{BF16_LINEAR}.")])
    assert _findings(root) == [("tensor-missing", f"{BF16_LINEAR}.weight",
                                f"{BF16_LINEAR}: no weight stored (neither weight nor weight_packed)")]
