"""Every scheme compressed-tensors can express and vLLM builds, on real-format fixture checkpoints.

The builds (``fixtures.quant.SCHEME_BUILDS``) carry quantization_config blocks made by compressed-tensors'
own preset schemes and the tensors llm-compressor writes for them (``fixtures.tensors.group_entries``):
weight-only NVFP4A16, int4 W4A16 (symmetric and asymmetric), int8 W8A16, int8 W8A8, FP8 W8A16, FP8_BLOCK
and FP8 with a static FP8 KV cache. Then the three defects of stored schemes, block shapes and fused
NVFP4 global scales, each on a file changed the way the real outputs differ.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from clef_format.fixtures.configs import full_config
from clef_format.fixtures.quant import SCHEME_BUILDS, build_quant_config
from clef_format.fixtures.tensors import Tensor, bf16_of, load_file, save_file
from clef_format.read.checkpoint import read_checkpoint
from clef_format.read.safetensors import read_header, read_scalars, tensor_nbytes
from clef_format.spec import schemes
from clef_format.spec.findings import Finding
from clef_format.spec.model_spec import parse_config
from clef_format.verify.checks.patterns import check_patterns
from clef_format.verify.layers import layers_view
from clef_format.verify.run import verify
from clef_format.vllm_rules import matching as R
from clef_format.vllm_rules import names as vllm_names

LOADABLE = [b for b in SCHEME_BUILDS if b != "fp8_block"]  # vLLM loads every tensor of these
BACKBONE = "model.safetensors"
LA0 = "model.language_model.layers.0.linear_attn"
SA3 = "model.language_model.layers.3.self_attn"


def _errors(root: Path) -> list[Finding]:
    return [f for f in verify(str(root)).findings if f.severity == "error"]


def _edit_tensors(root: Path, change: Callable[[dict[str, Tensor]], None]) -> None:
    tensors = load_file(root / BACKBONE)
    change(tensors)
    save_file(tensors, root / BACKBONE)


def _edit_quant(root: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = root / "config.json"
    config = json.loads(path.read_text())
    change(config["quantization_config"])
    path.write_text(json.dumps(config))


# ----------------------------------------------------------------------------- stored schemes


@pytest.mark.parametrize("build", LOADABLE)
def test_every_loadable_scheme_verifies_ok(built: Callable[..., Path], build: str) -> None:
    assert _errors(built("layout-2", build)) == []


@pytest.mark.parametrize(("build", "layout", "scheme"), [
    ("nvfp4a16", schemes.LAYOUT_NVFP4_A16, R.NVFP4_W4A16),
    ("w4a16", schemes.LAYOUT_INT_PACKED, R.WNA16),
    ("w4a16_asym", schemes.LAYOUT_INT_PACKED, R.WNA16),
    ("w8a16", schemes.LAYOUT_INT_PACKED, R.WNA16),
    ("int8", schemes.LAYOUT_INT8, R.INT8_W8A8),
    ("fp8_w8a16", schemes.LAYOUT_FP8, R.FP8_W8A16),
    ("fp8_kv", schemes.LAYOUT_FP8, schemes.FP8_W8A8),
    ("nvfp4", schemes.LAYOUT_NVFP4, schemes.NVFP4_W4A4),
])
def test_the_stored_layout_fits_the_scheme_vllm_builds(built: Callable[..., Path], build: str, layout: str,
                                                       scheme: str) -> None:
    ck = read_checkpoint(built("layout-2", build))
    name = f"{LA0}.in_proj_qkv"
    assert schemes.stored_layout({k.rsplit(".", 1)[1]: v for k, v in ck.backbone.items()
                                  if k.rsplit(".", 1)[0] == name}) == layout
    decisions = {d.layer: d for d in R.resolve_vllm(ck.config)}
    assert decisions["language_model.model.layers.0.linear_attn.in_proj_qkvz"].scheme == scheme
    assert R.layout_fits(layout, scheme)


def test_int_packed_tensors_under_an_nvfp4a16_config_mismatch(fresh: Callable[..., Path]) -> None:
    root = fresh("layout-2", "w4a16")
    _edit_quant(root, lambda q: q.update(build_quant_config("nvfp4a16", 8)))
    (f,) = [f for f in check_patterns(read_checkpoint(root)) if f.code == "scheme-tensor-mismatch"
            and "in_proj_qkvz" in f.message]
    assert "vLLM builds nvfp4-w4a16" in f.message and "int weights packed in I32 weight_packed" in f.message


def test_nvfp4_w4a4_tensors_under_a_weight_only_config_mismatch(fresh: Callable[..., Path]) -> None:
    root = fresh("layout-2", "nvfp4")
    _edit_quant(root, lambda q: q.update(build_quant_config("nvfp4a16", 8)))
    codes = {f.code for f in _errors(root)}
    assert {"scheme-tensor-mismatch", "tensor-unexpected"} <= codes  # input_global_scale has no parameter


def test_fp8_weight_only_tensors_under_a_static_fp8_config_miss_the_input_scale(fresh: Callable[..., Path]) -> None:
    root = fresh("layout-2", "fp8_w8a16")
    _edit_quant(root, lambda q: q["config_groups"]["group_0"].update(input_activations={
        "num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor", "dynamic": False}))
    missing = [f for f in _errors(root) if f.code == "tensor-missing"]
    assert missing and all(f.tensor.endswith(".input_scale") for f in missing if f.tensor)  # not the "... and N more"


def test_int4_packed_tensors_under_an_int8_config_have_the_wrong_width(fresh: Callable[..., Path]) -> None:
    """The layout says int packed; the group's num_bits say how wide weight_packed is (in * bits / 32)."""
    root = fresh("layout-2", "w4a16")
    _edit_quant(root, lambda q: q.update(build_quant_config("w8a16", 8)))
    shapes = [f for f in _errors(root) if f.code == "tensor-shape"]
    assert shapes and all(f.tensor.endswith(".weight_packed") for f in shapes if f.tensor)  # not the "... and N more"
    assert any("weight_packed is I32[64, 8], expected I32 [64, 16]" in f.message for f in shapes)


def test_asymmetric_int4_without_its_zero_points(fresh: Callable[..., Path]) -> None:
    root = fresh("layout-2", "w4a16_asym")
    _edit_tensors(root, lambda t: t.pop(f"{LA0}.in_proj_z.weight_zero_point"))
    assert [(f.code, f.tensor) for f in _errors(root)] == [("tensor-missing", f"{LA0}.in_proj_z.weight_zero_point")]


# ----------------------------------------------------------------------------- KV-cache scales


def test_kv_cache_scales_sit_on_the_full_attention_layers(built: Callable[..., Path]) -> None:
    ck = read_checkpoint(built("layout-2", "fp8_kv"))
    assert {n for n in ck.backbone if n.endswith(("k_scale", "v_scale"))} == {
        f"model.language_model.layers.{i}.self_attn.{s}" for i in (3, 7) for s in ("k_scale", "v_scale")}
    assert not [f for f in verify(str(built("layout-2", "fp8_kv"))).findings if f.code.startswith("tensor-")]


@pytest.mark.parametrize("name", [f"{LA0}.k_scale", "model.language_model.layers.0.self_attn.k_scale"])
def test_a_kv_scale_on_a_linear_attention_layer_is_unexpected(fresh: Callable[..., Path], name: str) -> None:
    root = fresh("layout-2", "fp8_kv")
    _edit_tensors(root, lambda t: t.update({name: t[f"{SA3}.k_scale"]}))
    assert [(f.code, f.tensor) for f in _errors(root)] == [("tensor-unexpected", name)]


def test_kv_scales_without_a_kv_cache_scheme_load_and_are_a_warning(fresh: Callable[..., Path]) -> None:
    """vLLM (0.28, 0.33) gives every Attention compressed-tensors' KV-cache method whatever kv_cache_scheme
    says: the scales load (and go unused with an unquantized cache). Not an error; a zero point still is."""
    root = fresh("layout-2", "fp8_kv")
    _edit_quant(root, lambda q: q.pop("kv_cache_scheme"))
    assert not _errors(root)
    (f,) = [f for f in verify(str(root)).findings if f.code == "tensor-unexpected"]
    assert f.severity == "warning" and "4 KV-cache scale(s)" in f.message
    _edit_tensors(root, lambda t: t.update({f"{SA3}.k_zero_point": t[f"{SA3}.k_scale"]}))
    assert [(f.code, f.tensor) for f in _errors(root)] == [("tensor-unexpected", f"{SA3}.k_zero_point")]


def test_a_missing_or_misshapen_kv_scale(fresh: Callable[..., Path]) -> None:
    root = fresh("layout-2", "fp8_kv")

    def change(t: dict[str, Tensor]) -> None:
        del t[f"{SA3}.v_scale"]
        t[f"{SA3}.k_scale"] = Tensor("F32", np.ones((4,), np.float32))

    _edit_tensors(root, change)
    found = {(f.code, f.severity, f.tensor) for f in verify(str(root)).findings}
    assert ("tensor-missing", "warning", f"{SA3}.v_scale") in found
    assert ("tensor-shape", "error", f"{SA3}.k_scale") in found
    (msg,) = [f.message for f in verify(str(root)).findings if f.code == "tensor-shape"]
    assert "expected F32/BF16 [1] or [] (one scale per tensor" in msg  # vLLM loads either


# ----------------------------------------------------------------------------- FP8 block shapes


def test_fp8_block_with_32_row_shards_is_refused(built: Callable[..., Path]) -> None:
    errs = [f for f in _errors(built("layout-2", "fp8_block")) if f.code == "quant-config-invalid"]
    text = " ".join(f.message for f in errs)
    assert "Weight output_partition_size = 32 is not divisible by weight quantization block_n = 128." in text
    assert {f.module for f in errs} == {"language_model.model.layers.0.linear_attn.in_proj_qkvz",
                                        "language_model.model.layers.3.self_attn.qkv_proj"}


def test_a_block_that_divides_every_partition_is_built(fresh: Callable[..., Path]) -> None:
    root = fresh("layout-2", "fp8_block")
    _edit_quant(root, lambda q: q["config_groups"]["group_0"]["weights"].update(block_structure=[32, 32]))
    assert not [f for f in check_patterns(read_checkpoint(root)) if f.code == "quant-config-invalid"]


def test_the_last_partition_of_a_merged_layer_may_be_ragged() -> None:
    """in_proj_ba at full size: [32, 32] per head count; only the last may miss block_n."""
    cfg = full_config()
    model = vllm_names.build(parse_config(cfg))
    qkvz = next(l for l in model.layers if l.name.endswith("layers.0.linear_attn.in_proj_qkvz"))
    ba = next(l for l in model.layers if l.name.endswith("layers.0.linear_attn.in_proj_ba"))
    assert R.output_partitions(qkvz) == [2048, 2048, 4096, 4096]
    heads = cfg["text_config"]["linear_num_value_heads"]
    assert R.output_partitions(ba) == [heads, heads]
    entry = R.parse_quant_config(build_quant_config("fp8_block", 32)).targets["Linear"]
    assert R.block_problem(qkvz, entry, schemes.FP8_W8A8) is None
    assert R.block_problem(ba, entry, schemes.FP8_W8A8) == (
        f"Weight output_partition_size = {heads} is not divisible by weight quantization block_n = 128.")


# ----------------------------------------------------------------------------- memory per scheme


def _stored_bytes(root: Path) -> dict[int, int]:
    """Per decoder layer, the bytes of its stored Linear tensors (per-tensor scalars and weight_shape left out)."""
    header = read_header(root / BACKBONE)
    out: dict[int, int] = {}
    for name, info in header.tensors.items():
        parts = name.split(".")
        if "layers" not in parts or parts[-1] in ("weight_shape",) or info.numel == 1:
            continue
        if not any(p in parts for p in ("self_attn", "linear_attn", "mlp")) or "norm" in name:
            continue
        if parts[-2] in ("conv1d", "linear_attn", "self_attn"):  # conv1d, A_log, dt_bias, kv scales
            continue
        i = int(parts[parts.index("layers") + 1])
        out[i] = out.get(i, 0) + tensor_nbytes(info.dtype, info.shape)
    return out


@pytest.mark.parametrize("build", ["bf16", "nvfp4", "fp8", "mixed", *LOADABLE])
def test_layer_bytes_are_the_stored_bytes_of_the_scheme(built: Callable[..., Path], build: str) -> None:
    root = built("layout-2", build)
    view = layers_view(json.loads((root / "config.json").read_text()))
    assert {r.index: r.weight_bytes for r in view.rows} == _stored_bytes(root)


@pytest.mark.parametrize(("build", "fits"), [("bf16", False), ("w4a16", True), ("w4a16_asym", True),
                                             ("nvfp4a16", True), ("int8", True), ("w8a16", True)])
def test_a_9b_build_fits_16gb_by_its_bits_per_weight(build: str, fits: bool) -> None:
    cfg = full_config()
    quant = build_quant_config(build, 32)
    if quant is not None:
        cfg["quantization_config"] = quant
    view = layers_view(cfg)
    assert view.fits_16gb is fits
    bf16 = layers_view(full_config()).weight_bytes
    if build.startswith(("w4a16", "nvfp4")):
        assert view.weight_bytes < bf16 * 0.45


# ----------------------------------------------------------------------------- fused NVFP4 global scales


def _set_scales(root: Path, scale: str, values: dict[str, float]) -> None:
    _edit_tensors(root, lambda t: t.update({f"{m}.{scale}": Tensor("F32", np.array([v], np.float32))
                                            for m, v in values.items()}))


@pytest.mark.parametrize("build", ["nvfp4", "nvfp4a16", "mixed"])
def test_fused_shards_with_different_global_scales(fresh: Callable[..., Path], build: str) -> None:
    root = fresh("layout-2", build)
    module = f"{LA0}.in_proj_z" if build != "mixed" else "model.language_model.layers.0.mlp.up_proj"
    other = f"{LA0}.in_proj_qkv" if build != "mixed" else "model.language_model.layers.0.mlp.gate_proj"
    _set_scales(root, "weight_global_scale", {other: 39680.0, module: 35840.0})
    report = verify(str(root))
    (f,) = [f for f in report.findings if f.code == "global-scale-mismatch"]
    assert f.severity == "error" and [e.code for e in report.findings if e.severity == "error"] == [f.code]
    short = module.rsplit(".", 1)[1]
    assert "ratio 0.903" in f.message and f"{short}'s weights are decoded scaled by 0.903" in f.message
    assert "keeps the largest" in f.message and f"{other.rsplit('.', 1)[1]} and {short}" in (f.fix or "")


def test_layers_of_one_kind_fold_into_one_error(fresh: Callable[..., Path]) -> None:
    root = fresh("layout-2", "nvfp4")
    la = "model.language_model.layers.{}.linear_attn"
    _set_scales(root, "weight_global_scale", {f"{la.format(0)}.in_proj_z": 35840.0, f"{la.format(1)}.in_proj_qkv": 30720.0,
                                              f"{la.format(1)}.in_proj_z": 37632.0})
    (f,) = [f for f in verify(str(root)).findings if f.code == "global-scale-mismatch"]
    assert f.message.startswith("language_model.model.layers.{0-1}.linear_attn.in_proj_qkvz: their shards have")
    assert "(ratio 0.816 to 0.938; the worst, language_model.model.layers.1.linear_attn.in_proj_qkvz: " \
           "in_proj_qkv 30720, in_proj_z 37632)" in f.message
    assert f.module == "language_model.model.layers.1.linear_attn.in_proj_qkvz"


def test_equal_global_scales_are_silent(built: Callable[..., Path]) -> None:
    assert not [f for f in verify(str(built("layout-2", "nvfp4"))).findings if f.code == "global-scale-mismatch"]


def test_different_input_global_scales(fresh: Callable[..., Path]) -> None:
    root = fresh("layout-2", "nvfp4")
    _set_scales(root, "input_global_scale", {f"{SA3}.q_proj": 600.0, f"{SA3}.k_proj": 600.0, f"{SA3}.v_proj": 540.0})
    (f,) = [f for f in verify(str(root)).findings if f.code == "global-scale-mismatch"]
    assert "input_global_scales" in f.message and "ratio 0.900" in f.message and "v_proj" in f.message


def test_scalars_are_read_at_their_header_offsets(fresh: Callable[..., Path]) -> None:
    root = fresh("layout-2", "nvfp4")
    _set_scales(root, "weight_global_scale", {f"{LA0}.in_proj_z": 35840.0})
    header = read_header(root / BACKBONE)
    names = [f"{LA0}.in_proj_z.weight_global_scale", f"{LA0}.in_proj_qkv.weight_global_scale",
             f"{LA0}.in_proj_z.weight_packed"]  # not a scalar: left out
    assert read_scalars(root / BACKBONE, header, names) == {names[0]: 35840.0, names[1]: 33600.0}


def test_only_merged_layers_but_their_last_partition_are_held_to_the_block() -> None:
    """At tensor parallel 1 vLLM checks a merged layer's partitions but the last, and nothing of a single one."""
    from clef_format.spec.model_spec import LinearSpec
    from clef_format.vllm_rules.names import VllmLayer

    entry = R.parse_quant_config(build_quant_config("fp8_block", 8)).targets["Linear"]
    p = "language_model.model.layers.3.self_attn"
    ragged_last = VllmLayer(f"{p}.qkv_proj", "QKVParallelLinear", (
        LinearSpec(f"{p}.q_proj", 256, 64), LinearSpec(f"{p}.k_proj", 128, 64), LinearSpec(f"{p}.v_proj", 32, 64)), 3,
        "self_attn")
    single = VllmLayer(f"{p}.o_proj", "RowParallelLinear", (LinearSpec(f"{p}.o_proj", 32, 64),), 3, "self_attn")
    assert R.block_problem(ragged_last, entry, schemes.FP8_W8A8) is None
    assert R.block_problem(single, entry, R.FP8_W8A16) is None
    assert R.block_problem(ragged_last, entry, R.WNA16) is None  # only the FP8 schemes validate blocks
    ragged_first = ragged_last._replace(shards=(ragged_last.shards[2], *ragged_last.shards[:2]))
    assert R.block_problem(ragged_first, entry, R.FP8_W8A16) is not None


# ----------------------------------------------------------------------------- one-element scales, structure path


@pytest.mark.parametrize("build,scale,value,code", [
    ("nvfp4", "weight_global_scale", float("nan"), "nonfinite-scale"),
    ("nvfp4", "weight_global_scale", 0.0, "scale-range"),
    ("nvfp4", "weight_global_scale", -33600.0, "scale-range"),
    ("nvfp4", "input_global_scale", float("inf"), "nonfinite-scale"),
    ("fp8_kv", "k_scale", float("nan"), "nonfinite-scale"),
])
def test_a_bad_one_element_scale_is_an_error_without_deep(fresh: Callable[..., Path], build: str, scale: str,
                                                          value: float, code: str) -> None:
    """vLLM's dequantization divides or multiplies by these as stored: NaN/inf/sign-flipped output."""
    root = fresh("layout-2", build)
    ck = read_checkpoint(root)
    name = next(n for n, i in sorted(ck.backbone.items()) if n.endswith(f".{scale}") and i.numel == 1)
    data = np.full(ck.backbone[name].shape, value, np.float32)
    stored = bf16_of(data) if ck.backbone[name].dtype == "BF16" else Tensor("F32", data)
    _edit_tensors(root, lambda t: t.update({name: stored}))
    errors = _errors(root)
    assert [(f.code, f.tensor) for f in errors] == [(code, name)]
    assert repr(value) in errors[0].message


def test_a_negative_scale_of_a_fused_pair_is_a_scale_error_not_a_ratio(fresh: Callable[..., Path]) -> None:
    root = fresh("layout-2", "nvfp4")
    _set_scales(root, "weight_global_scale", {f"{LA0}.in_proj_z": -33600.0})
    assert [(f.code, f.tensor) for f in _errors(root)] == [("scale-range", f"{LA0}.in_proj_z.weight_global_scale")]
