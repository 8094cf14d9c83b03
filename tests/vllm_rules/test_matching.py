"""The resolver's rules, on real compressed-tensors configs (presets serialized to dicts).

Each test pins one documented vLLM rule (vllm-integration.md); tests/tier_vllm proves the same
resolver equal to the real vLLM on these and generated configs.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings

from clef_format.fixtures.configs import tiny_config
from clef_format.spec import schemes
from clef_format.spec.model_spec import parse_config
from clef_format.vllm_rules import matching as R
from clef_format.vllm_rules import names as vllm_names
from tests.vllm_rules.pattern_cases import fixture_configs, quant_dict, quantized_configs, with_quant

MM = tiny_config(4)
TEXT = tiny_config(4, multimodal=False)
FP8, NVFP4 = schemes.FP8_W8A8, schemes.NVFP4_W4A4


def decide(config: dict, groups: list, ignore: list | None = None, top: str | None = "mixed-precision") -> dict[str, R.Decision]:
    groups = [(p, t, {"FP8_DYNAMIC": "float-quantized", "NVFP4": "nvfp4-pack-quantized"}.get(p)) for p, t in groups]
    return {d.layer: d for d in R.resolve_vllm(with_quant(config, quant_dict(groups, ignore or [], top)))}


def test_layer_names_cover_every_hf_linear_once() -> None:
    for config in (MM, TEXT):
        cfg = parse_config(config)
        model = vllm_names.build(cfg)
        shards = [s.name for l in model.layers for s in l.shards]
        assert sorted(shards) == sorted([s.name for s in vllm_names.linear_modules(cfg)] + ["lm_head"])
        assert len({l.name for l in model.layers}) == len(model.layers)


def test_multimodal_and_text_names() -> None:
    mm = {l.name for l in vllm_names.build(parse_config(MM)).layers}
    text = {l.name for l in vllm_names.build(parse_config(TEXT)).layers}
    assert {"language_model.model.layers.3.self_attn.qkv_proj", "language_model.model.layers.0.linear_attn.in_proj_qkvz",
            "language_model.model.layers.0.linear_attn.in_proj_ba", "visual.blocks.0.attn.qkv", "language_model.lm_head"} <= mm
    assert {"model.layers.3.self_attn.qkv_proj", "model.layers.0.mlp.gate_up_proj", "lm_head"} <= text


def test_regex_is_anchored_at_start_only() -> None:
    d = decide(MM, [("NVFP4", [r"re:model\.language_model.*"])])
    assert all(x.scheme == schemes.UNQUANTIZED for x in d.values())  # HF-anchored: never matches vLLM names
    d = decide(MM, [("NVFP4", [r"re:.*in_proj_qkv"])])  # no $: matches the fused in_proj_qkvz by name
    assert d["language_model.model.layers.0.linear_attn.in_proj_qkvz"].scheme == NVFP4


def test_fused_rule_needs_all_shards_and_first_shard_target_wins() -> None:
    d = decide(MM, [("NVFP4", [r"re:.*in_proj_qkv$"])])
    assert d["language_model.model.layers.0.linear_attn.in_proj_qkvz"].scheme == schemes.UNQUANTIZED
    d = decide(MM, [("FP8_DYNAMIC", [r"re:.*in_proj_qkv$"]), ("NVFP4", [r"re:.*in_proj_z$"])])
    x = d["language_model.model.layers.0.linear_attn.in_proj_qkvz"]
    assert (x.scheme, x.target) == (FP8, r"re:.*in_proj_qkv$")  # different groups are not rejected


def test_name_match_in_config_order_before_class_name() -> None:
    d = decide(MM, [("FP8_DYNAMIC", ["Linear"]), ("NVFP4", [r"re:.*mlp\.down_proj$"])])
    assert d["language_model.model.layers.0.mlp.down_proj"].scheme == NVFP4
    assert d["language_model.model.layers.0.mlp.gate_up_proj"].scheme == FP8
    assert d["language_model.lm_head"].scheme == schemes.UNQUANTIZED  # "Linear" is no substring of ParallelLMHead
    d = decide(MM, [("FP8_DYNAMIC", ["LMHead"])])
    assert d["language_model.lm_head"].scheme == FP8  # case-insensitive substring of the class name


def test_mapper_rewrites_plain_dotted_paths_only() -> None:
    d = decide(MM, [("NVFP4", ["model.language_model.layers.0.mlp.down_proj", "lm_head"])])
    assert d["language_model.model.layers.0.mlp.down_proj"].scheme == NVFP4
    assert d["language_model.lm_head"].scheme == schemes.UNQUANTIZED  # "lm_head" has no dot: not mapped
    d = decide(TEXT, [("NVFP4", ["lm_head"])])
    assert d["lm_head"].scheme == NVFP4


def test_half_ignored_fused_layer_is_vllms_value_error() -> None:
    d = decide(MM, [("NVFP4", ["Linear"])], ignore=[r"re:.*in_proj_qkv$"])
    x = d["language_model.model.layers.0.linear_attn.in_proj_qkvz"]
    assert x.error_kind == "ValueError" and "different quantization schemes" in (x.error or "")
    d = decide(MM, [("NVFP4", ["Linear"])], ignore=["language_model.model.layers.0.mlp.gate_up_proj"])
    assert d["language_model.model.layers.0.mlp.gate_up_proj"].ignored  # exact fused name ignores it whole


def test_fused_name_regex_ignore_differs_by_version() -> None:
    config = with_quant(MM, quant_dict([("NVFP4", ["Linear"], None)], [r"re:.*gate_up_proj$"], "nvfp4-pack-quantized"))
    old = {d.layer: d for d in R.resolve_vllm(config, "0.28")}["language_model.model.layers.0.mlp.gate_up_proj"]
    new = {d.layer: d for d in R.resolve_vllm(config, "0.30")}["language_model.model.layers.0.mlp.gate_up_proj"]
    assert (old.scheme, old.ignored) == (NVFP4, False)
    assert (new.scheme, new.ignored) == (schemes.UNQUANTIZED, True)


def test_group_format_falls_back_to_top_level() -> None:
    ok = with_quant(MM, quant_dict([("FP8_DYNAMIC", ["Linear"], None)], [], "float-quantized"))
    assert {d.scheme for d in R.resolve_vllm(ok) if "mlp" in d.layer} == {FP8}
    bad = with_quant(MM, quant_dict([("FP8_DYNAMIC", ["Linear"], None)], [], "mixed-precision"))
    assert {d.error_kind for d in R.resolve_vllm(bad) if "mlp" in d.layer} == {"NotImplementedError"}


def test_invalid_config_is_refused() -> None:
    config = with_quant(MM, quant_dict([("NVFP4", ["Linear"], None)], [], "nvfp4-pack-quantized"))
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["bogus"] = 1
    with pytest.raises(R.QuantConfigError):
        R.resolve_vllm(config)


@pytest.mark.parametrize("name", sorted(fixture_configs()))
def test_published_builds_resolve_without_error(name: str) -> None:
    decisions = R.resolve_vllm(fixture_configs()[name])
    assert not [d for d in decisions if d.error]
    assert any(d.scheme != schemes.UNQUANTIZED for d in decisions)


@settings(max_examples=200, deadline=None)
@given(quantized_configs())
def test_generated_configs_resolve_totally(config: dict) -> None:
    """Every layer gets a scheme or an error, never an exception out of the resolver."""
    try:
        decisions = R.resolve_vllm(config)
    except R.QuantConfigError:
        return
    assert all((d.scheme is None) == (d.error is not None) for d in decisions)


def test_resolve_imports_no_heavy_library() -> None:
    code = ("import sys, clef_format.vllm_rules.matching, clef_format.verify.checks.patterns, clef_format.verify.layers; "
            "print([m for m in ('torch', 'compressed_tensors', 'vllm', 'transformers') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
