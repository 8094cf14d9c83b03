"""Backbone and joint head exactness: every tensor the config implies with its dtype and shape, the
parameters each config group's scheme implies, and nothing else; the head exact where the reference
states names and shapes, structural (siblings agree) for the rest."""

from __future__ import annotations

import pytest

from clef_format.read.safetensors import TensorInfo
from clef_format.spec import layouts as L
from clef_format.spec.schemes import group_signature, signature_problems
from clef_format.verify.run import verify
from tests.support.header_edit import edit_file, edit_json, file_of, sparsify


def _errors(root) -> list:
    return [f for f in verify(str(root)).findings if f.severity == "error"]


def _names(root) -> set[str]:
    return {f.tensor or f.module or "" for f in _errors(root)}


@pytest.fixture
def ck(fresh):
    def make(build="hybrid", layout="layout-2"):
        root = fresh(layout, build, num_layers=4)
        sparsify(root)
        assert not _errors(root)
        return root
    return make


def _edit(root, tensor, change):
    edit_file(root, file_of(root, tensor), change)


def test_vision_linear_bias_is_required(ck):
    root = ck()
    name = "model.visual.blocks.0.attn.qkv.bias"
    _edit(root, name, lambda e: e.pop(name))
    assert name in _names(root)
    assert any(f.code == "tensor-missing" and f.tensor == name for f in _errors(root))


def test_text_linear_has_no_bias(ck):
    root = ck("bf16")
    w = "model.language_model.layers.0.mlp.down_proj.weight"
    _edit(root, w, lambda e: e.update({w.replace("weight", "bias"): ("BF16", (64,))}))
    assert any(f.code == "tensor-unexpected" and f.tensor == w.replace("weight", "bias") for f in _errors(root))


@pytest.mark.parametrize("name, dtype", [
    ("model.language_model.norm.weight", "I16"),
    ("model.language_model.norm.weight", "F16"),
    ("model.language_model.layers.0.linear_attn.conv1d.weight", "F32"),
    ("model.language_model.layers.0.linear_attn.A_log", "F32"),
    ("model.language_model.layers.0.linear_attn.dt_bias", "I16"),
    ("model.visual.pos_embed.weight", "F16"),
    ("model.visual.blocks.1.mlp.linear_fc1.bias", "F32"),
])
def test_non_linear_dtypes_are_checked(ck, name, dtype):
    """Another float dtype is cast on load by vLLM and transformers (a dtype-cast warning); any other an error."""
    root = ck()
    _edit(root, name, lambda e: e.update({name: (dtype, e[name][1])}))
    if dtype in ("BF16", "F16", "F32"):
        assert not _errors(root)
        assert any(f.code == "dtype-cast" and f.tensor == name for f in verify(str(root)).findings)
    else:
        assert any(f.code == "tensor-shape" and f.tensor == name for f in _errors(root))


def test_static_fp8_input_activations_need_input_scale(ck):
    root = ck("fp8")

    def static(cfg):
        for group in cfg["quantization_config"]["config_groups"].values():
            group["input_activations"].update(dynamic=False, strategy="tensor")
    edit_json(root, L.CONFIG, static)
    missing = {f.tensor for f in _errors(root) if f.code == "tensor-missing"}
    assert "model.language_model.layers.0.mlp.down_proj.input_scale" in missing


def test_stored_input_scale_with_dynamic_activations_is_unexpected(ck):
    root = ck("fp8")
    w = "model.language_model.layers.0.mlp.down_proj.weight"
    _edit(root, w, lambda e: e.update({"model.language_model.layers.0.mlp.down_proj.input_scale": ("F32", (1,))}))
    assert any(f.code == "tensor-unexpected" and f.tensor.endswith("down_proj.input_scale") for f in _errors(root))


def _info(dtype, shape):
    return TensorInfo(dtype, tuple(shape), 0, 0)


def test_signatures_follow_each_strategy():
    fp8_channel = {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}
    sig = group_signature(fp8_channel, {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}, None,
                          "float-quantized", 32, 64)
    assert set(sig) == {"weight", "weight_scale"} and sig["weight_scale"].shapes == ((32, 1),)
    sig = group_signature({**fp8_channel, "strategy": "block", "block_structure": [16, 16]}, None, None,
                          "float-quantized", 40, 64)
    assert sig["weight_scale"].shapes == ((3, 4),)
    asym = group_signature({"num_bits": 8, "type": "int", "strategy": "group", "group_size": 16, "symmetric": False,
                            "actorder": "group"}, None, None, "int-quantized", 32, 64)
    assert set(asym) == {"weight", "weight_scale", "weight_zero_point", "weight_g_idx"}
    assert asym["weight_g_idx"].shapes == ((64,),) and asym["weight_scale"].shapes == ((32, 4),)
    w4 = group_signature({"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": False},
                         None, None, "pack-quantized", 32, 64)
    assert set(w4) == {"weight_packed", "weight_shape", "weight_scale", "weight_zero_point"}
    assert w4["weight_packed"].shapes == ((32, 8),) and w4["weight_zero_point"].shapes == ((4, 2),)
    nv = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True}
    sig = group_signature(nv, {**nv, "dynamic": "local"}, None, "nvfp4-pack-quantized", 32, 64)
    assert set(sig) == {"weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"}
    static = group_signature(fp8_channel, {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                                           "symmetric": False}, None, "float-quantized", 32, 64)
    assert {"input_scale", "input_zero_point"} <= set(static)
    problems = signature_problems(sig, {"weight_packed": _info("U8", (32, 32)), "weight_scale": _info("F8_E4M3", (32, 4)),
                                        "weight_global_scale": _info("F32", (1,)), "bias": _info("BF16", (32,))}, None)
    assert {(k, s) for k, s, _ in problems} == {("missing", "input_global_scale"), ("unexpected", "bias")}


# ----------------------------------------------------------------------------- the joint head

def _head(root, change):
    edit_file(root, L.HEAD_WEIGHTS, change)
    return [f for f in _errors(root) if f.code in ("head-incomplete", "head-unexpected")]


@pytest.mark.parametrize("name", ["residual_scorer.3.weight", "field_norm.bias", "option_norm.weight",
                                  "layers.2.norm3.bias", "evidence_layers.1.linear2.weight", "prior_logit_scale"])
def test_dropped_head_tensor_is_reported_by_name(ck, name):
    root = ck()
    found = _head(root, lambda e: e.pop(name))
    assert any(f.tensor == name and f.code == "head-incomplete" for f in found), found


def test_extra_top_level_head_tensor(ck):
    root = ck()
    found = _head(root, lambda e: e.update({"gate_projection.weight": ("BF16", (32, 64))}))
    assert [(f.code, f.tensor) for f in found] == [("head-unexpected", "gate_projection.weight")]


@pytest.mark.parametrize("name", ["layers.1.linear1.weight", "evidence_layers.0.self_attn.in_proj_bias"])
def test_misshapen_tensor_inside_a_stack(ck, name):
    root = ck()
    found = _head(root, lambda e: e.update({name: (e[name][0], (*e[name][1][:-1], e[name][1][-1] + 1))}))
    assert [(f.code, f.tensor) for f in found] == [("head-incomplete", name)]


def test_wrong_dtype_in_the_head(ck):
    root = ck()
    found = _head(root, lambda e: e.update({"layers.0.norm1.weight": ("F16", e["layers.0.norm1.weight"][1])}))
    assert [f.tensor for f in found] == ["layers.0.norm1.weight"]


def test_inferred_layer_names_are_never_required(ck):
    """A head whose stack layers are named differently from the inferred torch layers, consistently across
    siblings (and whose norms carry no bias, alike), is valid where no reference file says otherwise: its
    joint_schema_model.py builds the head in a helper the static reader cannot see into, so only facts
    (stack symmetry, counts, torch's shapes where torch's names appear) can make an error."""
    root = ck()
    (root / L.HEAD_CODE).write_text("from torch import nn\n\nclass JointSchemaHead(nn.Module):\n"
                                    "    def __init__(self, **config):\n        super().__init__()\n"
                                    "        build_from(self, config)\n")

    def rename(e):
        for name in [n for n in e if n.startswith(("layers.", "evidence_layers."))]:
            e[name.replace("linear1", "ff.in").replace("norm2.", "ln_b.")] = e.pop(name)
        e.pop("field_norm.bias"), e.pop("option_norm.bias")
    assert _head(root, rename) == []


def test_layer_count_equals_the_config(ck):
    root = ck()
    found = _head(root, lambda e: [e.pop(n) for n in [n for n in e if n.startswith("layers.3.")]])
    assert any(f.tensor == "layers.3" for f in found)
