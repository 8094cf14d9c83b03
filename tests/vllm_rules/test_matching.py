"""The resolver's rules, on real compressed-tensors configs (presets serialized to dicts).

Each test pins one documented vLLM rule (vllm-integration.md); tests/tier_vllm proves the same
resolver equal to the real vLLM on these and generated configs.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Callable

import pytest
from hypothesis import given, settings

from clef_format.fixtures.configs import tiny_config
from clef_format.spec import schemes
from clef_format.spec.model_spec import parse_config
from clef_format.vllm_rules import matching as R
from clef_format.vllm_rules import names as vllm_names
from tests.support.pattern_cases import fixture_configs, quant_dict, quantized_configs, with_quant

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


def test_a_regex_matches_from_the_start_of_the_name() -> None:
    """vLLM tests ``re:`` patterns with ``re.match``: a pattern for the middle of a name needs ``.*``."""
    name = "language_model.model.layers.0.mlp.down_proj"
    assert not R.equal_or_regex(name, r"re:model\.layers\.0\.mlp\.down_proj")  # re.search would find it
    assert R.equal_or_regex(name, r"re:.*model\.layers\.0\.mlp\.down_proj")
    assert R.equal_or_regex(name, r"re:language_model\.model\.layers\.0")  # a prefix: no $ needed
    d = decide(TEXT, [("NVFP4", [r"re:layers\.0\.mlp\.down_proj$"])])
    assert d["model.layers.0.mlp.down_proj"].scheme == schemes.UNQUANTIZED


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


# ----------------------------------------------------------------------------- the version table
# Each row of vllm_names.VERSION_TABLE pinned on both proven versions; tests/vllm proves the same
# rows against the real vLLM 0.28 and 0.33.

from tests.support.pattern_cases import qargs, scheme_config, scheme_group, scheme_model_configs  # noqa: E402

OLD, NEW = vllm_names.PROVEN


def test_version_table_rows_name_their_vllm_source() -> None:
    names = [r.name for r in vllm_names.VERSION_TABLE]
    assert len(set(names)) == len(names) == len(vllm_names.VersionRules._fields) - 1  # one row per rule, + proven
    for r in vllm_names.VERSION_TABLE:
        assert ".py" in r.source and r.before and r.after
    assert not any(vllm_names.rules_for(OLD)[:-1]) and all(vllm_names.rules_for(NEW)[:-1])
    assert vllm_names.rules_for("0.28.0").proven and vllm_names.rules_for("0.33.0").proven
    assert not vllm_names.rules_for("0.31").proven
    assert [r.name for r in vllm_names.differing_rules("0.29", "0.31")] == [
        "fused_name_ignore", "actorder_group_refused", "w4a8_int_needs_int"]
    with pytest.raises(ValueError):
        vllm_names.rules_for("0.27")
    with pytest.raises(ValueError):
        vllm_names.rules_for("latest")


def _one(config: dict, layer: str, version: str) -> R.Decision:
    return {d.layer: d for d in R.resolve_vllm(config, version)}[layer]


def test_prefix_regex_ignore_on_one_shard_by_version() -> None:
    """``re:.*in_proj_qkv`` (no $) meant for one shard: 0.28 raises, 0.30+ leaves the fused layer BF16."""
    config = with_quant(MM, quant_dict([("NVFP4", ["Linear"], None)], [r"re:.*in_proj_qkv"], "nvfp4-pack-quantized"))
    name = "language_model.model.layers.0.linear_attn.in_proj_qkvz"
    old, new = _one(config, name, OLD), _one(config, name, NEW)
    assert old.error_kind == "ValueError" and "different quantization schemes" in (old.error or "")
    assert (new.scheme, new.ignored, new.error) == (schemes.UNQUANTIZED, True, None)


def test_group_activation_ordering_refused_from_0_30() -> None:
    for order in ("group", "dynamic", True):
        quant = scheme_config([scheme_group(["Linear"], qargs(("int", 4), "group", 128, actorder=order))], [],
                              "pack-quantized")
        config = with_quant(TEXT, quant)
        assert _one(config, "model.layers.0.mlp.down_proj", OLD).scheme == R.WNA16
        with pytest.raises(R.QuantConfigError, match="activation ordering"):
            R.resolve_vllm(config, NEW)
    for order in ("weight", "static", None, False):  # accepted by both
        quant = scheme_config([scheme_group(["Linear"], qargs(("int", 4), "group", 128, actorder=order))], [],
                              "pack-quantized")
        assert _one(with_quant(TEXT, quant), "model.layers.0.mlp.down_proj", NEW).scheme == R.WNA16


def test_w4a8_int_needs_int_types_from_0_31() -> None:
    fp8_token = qargs(("float", 8), "token", dynamic=True)
    quant = scheme_config([scheme_group(["Linear"], qargs(("float", 4), "group", 128), fp8_token)], [], "float-quantized")
    config = with_quant(TEXT, quant)
    assert _one(config, "model.layers.0.mlp.down_proj", OLD).scheme == R.INT_W4A8
    assert _one(config, "model.layers.0.mlp.down_proj", NEW).error_kind == "NotImplementedError"
    int_quant = scheme_config([scheme_group(["Linear"], qargs(("int", 4), "group", 128),
                                            qargs(("int", 8), "token", dynamic=True))], [], "int-quantized")
    for version in (OLD, NEW):
        assert _one(with_quant(TEXT, int_quant), "model.layers.0.mlp.down_proj", version).scheme == R.INT_W4A8


def test_mxfp4_with_fp8_input_from_0_32() -> None:
    quant = scheme_config([scheme_group(["Linear"], qargs(("float", 4), "group", 32),
                                        qargs(("float", 8), "token", dynamic=True))], [], "mxfp4-pack-quantized")
    config = with_quant(TEXT, quant)
    assert _one(config, "model.layers.0.mlp.down_proj", OLD).scheme == R.MXFP4
    assert _one(config, "model.layers.0.mlp.down_proj", NEW).scheme == R.MXFP4_W4A8


def test_mtp_targets_pass_the_mapper_unchanged() -> None:
    """0.29+ maps ``mtp.`` to None for weights, but the config is mapped with the rename mapper, which drops None."""
    quant = quant_dict([("FP8_DYNAMIC", ["mtp.layers.0.mlp.down_proj", "Linear"], None)], [], "float-quantized")
    for version in (OLD, NEW):
        model = vllm_names.build(parse_config(MM), version)
        vq = R.vllm_view(R.parse_quant_config(quant, version), model)
        assert "mtp.layers.0.mlp.down_proj" in vq.targets


def test_weight_only_float_weights_vllm_cannot_select() -> None:
    """Dynamic FP8 weights without input activations: vLLM's _is_static_tensor_w8a8 reads None.num_bits."""
    quant = scheme_config([scheme_group(["Linear"], qargs(("float", 8), "tensor", dynamic=True))], [], "float-quantized")
    for version in (OLD, NEW):
        assert _one(with_quant(TEXT, quant), "model.layers.0.mlp.down_proj", version).error_kind == "AttributeError"


def test_invalid_arguments_refused_like_compressed_tensors() -> None:
    from tests.support.pattern_cases import INVALID_ARGS

    for w in INVALID_ARGS:
        quant = scheme_config([scheme_group(["Linear"], w)], [], "pack-quantized")
        with pytest.raises(R.QuantConfigError):
            R.parse_quant_config(quant)


@settings(max_examples=150, deadline=None)
@given(scheme_model_configs())
def test_generated_scheme_configs_resolve_totally_on_every_proven_version(config: dict) -> None:
    for version in vllm_names.PROVEN:
        try:
            decisions = R.resolve_vllm(config, version)
        except R.QuantConfigError:
            continue
        assert all((d.scheme is None) == (d.error is not None) for d in decisions)


def test_scheme_grid_resolves_totally() -> None:
    """The exhaustive grid tests/vllm compares with vLLM: every config refused or decided, on both versions."""
    from tests.support.pattern_cases import scheme_grid

    base = tiny_config(4, multimodal=False)
    grid = scheme_grid()
    assert len(grid) > 25000
    for quant in grid[::50]:
        for version in vllm_names.PROVEN:
            try:
                decisions = R.resolve_vllm(with_quant(base, quant), version)
            except R.QuantConfigError:
                continue
            assert all((d.scheme is None) == (d.error is not None) for d in decisions)


def _row_cases() -> dict[str, Callable[[str], object]]:
    """For each version-table row, one config whose outcome that row alone decides (a layer's
    decision, or the refusal of the whole config), as a function of the vLLM version."""
    def outcome(config: dict, layer: str) -> Callable[[str], object]:
        def at(version: str) -> object:
            try:
                d = _one(config, layer, version)
            except R.QuantConfigError:
                return "config refused"
            return (d.scheme, d.ignored, d.error_kind)
        return at

    fp8_token = qargs(("float", 8), "token", dynamic=True)
    return {
        "fused_name_ignore": outcome(with_quant(MM, quant_dict([("NVFP4", ["Linear"], None)], [r"re:.*in_proj_qkv"],
                                                               "nvfp4-pack-quantized")),
                                     "language_model.model.layers.0.linear_attn.in_proj_qkvz"),
        "actorder_group_refused": outcome(with_quant(TEXT, scheme_config(
            [scheme_group(["Linear"], qargs(("int", 4), "group", 128, actorder="group"))], [], "pack-quantized")),
            "model.layers.0.mlp.down_proj"),
        "w4a8_int_needs_int": outcome(with_quant(TEXT, scheme_config(
            [scheme_group(["Linear"], qargs(("float", 4), "group", 128), fp8_token)], [], "float-quantized")),
            "model.layers.0.mlp.down_proj"),
        "mxfp4_w4a8_fp8": outcome(with_quant(TEXT, scheme_config(
            [scheme_group(["Linear"], qargs(("float", 4), "group", 32), fp8_token)], [], "mxfp4-pack-quantized")),
            "model.layers.0.mlp.down_proj"),
    }


#: The first vLLM version of each row, read from each release's source (docs/VLLM.md), written here
#: independently of VERSION_TABLE so that a row moved in the table fails the test below.
ROW_FIRST_VERSION = {"fused_name_ignore": 30, "actorder_group_refused": 30, "w4a8_int_needs_int": 31,
                     "mxfp4_w4a8_fp8": 32}


def test_every_version_row_has_a_boundary_case() -> None:
    assert {r.name for r in vllm_names.VERSION_TABLE} == set(ROW_FIRST_VERSION) == set(_row_cases())


@pytest.mark.parametrize("row", sorted(ROW_FIRST_VERSION))
def test_each_version_row_turns_exactly_at_its_version(row: str) -> None:
    """Every version from 0.28 to 0.33 gives the old outcome before the row's first version and the
    new one from it on, so a row moved by one minor version either way fails here."""
    at = _row_cases()[row]
    old, new = at(OLD), at(NEW)
    assert old != new, f"the case for {row} does not tell the versions apart"
    for minor in range(28, 34):
        assert at(f"0.{minor}") == (old if minor < ROW_FIRST_VERSION[row] else new), f"{row} on vLLM 0.{minor}"


def test_fp8_with_static_per_tensor_input_is_w8a8_and_other_static_inputs_are_not() -> None:
    """vLLM's ``_is_fp8_w8a8``: a dynamic input, or a static symmetric per-tensor one (the FP8 preset);
    a static per-channel input is not W8A8 and leaves the static FP8 weights to W8A16."""
    d = decide(MM, [("FP8", ["Linear"])], top="float-quantized")
    assert d["language_model.model.layers.0.mlp.down_proj"].scheme == FP8
    qc = R.parse_quant_config(quant_dict([("FP8", ["Linear"], None)], [], "float-quantized"))
    e = qc.targets["Linear"]
    assert e.input is not None and (e.input.strategy, e.input.dynamic, e.input.symmetric) == ("tensor", False, True)
    assert R.classify(e, qc.format) == FP8
    channel_in = e.input._replace(strategy="channel")
    assert R.classify(e._replace(input=channel_in), qc.format) == R.FP8_W8A16
    asym_in = e.input._replace(symmetric=False)
    assert R.classify(e._replace(input=asym_in), qc.format) == R.FP8_W8A16


def test_hf_module_matched_by_class_only_takes_the_class_target() -> None:
    """compressed-tensors' ``match_targets``: when no name or regex matches the module, the class target
    decides, never another group's target that only sorts before it."""
    qc = R.parse_quant_config(quant_dict([("NVFP4", ["Linear"], "nvfp4-pack-quantized"),
                                          ("FP8_DYNAMIC", ["Embedding", "re:.*lm_head$"], "float-quantized")],
                                         [], "mixed-precision"))
    d = R.resolve_hf_module("model.language_model.layers.0.mlp.down_proj", qc)
    assert (d.scheme, d.target, d.group) == (NVFP4, "Linear", "group_0")
    d = R.resolve_hf_module("lm_head", qc)
    assert (d.scheme, d.target, d.group) == (FP8, "re:.*lm_head$", "group_1")  # a regex on the name wins over a class


# ----------------------------------------------------------------------------- integer schemes and argument rules
# vLLM's _get_scheme_from_parts predicates (compressed_tensors.py: _is_wNa8o8_int, _is_wNaM_int,
# _is_static_tensor_w8a8) and compressed-tensors' QuantizationArgs validators, one rule per test.

INT8_STATIC_TENSOR = qargs(("int", 8), "tensor")
DOWN = "model.layers.0.mlp.down_proj"


def _text_outcome(groups: list[dict], top: str | None, version: str = OLD) -> tuple[str | None, str | None]:
    d = _one(with_quant(TEXT, scheme_config(groups, [], top)), DOWN, version)
    return d.scheme, d.error_kind


def test_int_weights_with_static_int8_input_and_output_are_wna8o8() -> None:
    """_is_wNa8o8_int: the output activations are read from the config and must be static INT8 per tensor."""
    w4 = qargs(("int", 4), "channel")
    for version in (OLD, NEW):
        assert _text_outcome([scheme_group(["Linear"], w4, INT8_STATIC_TENSOR, INT8_STATIC_TENSOR)],
                             "pack-quantized", version) == (R.WNA8O8_INT, None)
    per_channel_out = qargs(("int", 8), "channel")
    assert _text_outcome([scheme_group(["Linear"], w4, INT8_STATIC_TENSOR, per_channel_out)],
                         "pack-quantized") == (None, "NotImplementedError")
    no_out = _text_outcome([scheme_group(["Linear"], w4, INT8_STATIC_TENSOR)], "pack-quantized")
    assert no_out == (None, "NotImplementedError")
    qc = R.parse_quant_config(scheme_config([scheme_group(["Linear"], w4, INT8_STATIC_TENSOR, INT8_STATIC_TENSOR)],
                                            [], "pack-quantized"))
    out = qc.targets["Linear"].output
    assert out is not None and (out.type, out.num_bits, out.strategy, out.dynamic) == ("int", 8, "tensor", False)


def test_int_weights_with_dynamic_int_input_pick_wna8_or_wna4_by_input_bits() -> None:
    """_is_wNaM_int: pack-quantized static INT weights, symmetric dynamic per-token INT input; 8 or 4 input bits."""
    w4 = qargs(("int", 4), "group", 128)
    a8 = qargs(("int", 8), "token", dynamic=True)
    a4 = qargs(("int", 4), "token", dynamic=True)
    assert _text_outcome([scheme_group(["Linear"], w4, a8)], "pack-quantized") == (R.WNA8_INT, None)
    assert _text_outcome([scheme_group(["Linear"], w4, a4)], "pack-quantized") == (R.WNA4_INT, None)
    a6 = qargs(("int", 6), "token", dynamic=True)
    assert _text_outcome([scheme_group(["Linear"], w4, a6)], "pack-quantized") == (None, "NotImplementedError")


def test_int8_weights_with_int8_input_are_int8_w8a8_and_other_weight_bits_are_not() -> None:
    """_is_static_tensor_w8a8 / _is_dynamic_token_w8a8: weights and input both 8 bits."""
    w8 = qargs(("int", 8), "channel")
    assert _text_outcome([scheme_group(["Linear"], w8, INT8_STATIC_TENSOR)], "int-quantized") == (R.INT8_W8A8, None)
    token = qargs(("int", 8), "token", dynamic=True)
    assert _text_outcome([scheme_group(["Linear"], w8, token)], "int-quantized") == (R.INT8_W8A8, None)
    w4 = qargs(("int", 4), "channel")
    assert _text_outcome([scheme_group(["Linear"], w4, INT8_STATIC_TENSOR)],
                         "int-quantized") == (None, "NotImplementedError")


def test_block_weights_with_a_valid_block_structure_are_accepted() -> None:
    block = qargs(("float", 8), "block", block=[128, 128])
    assert R.parse_args(block, "w").strategy == "block"
    assert R.parse_args(dict(block, block_structure="128x128"), "w").strategy == "block"
    assert _text_outcome([scheme_group(["Linear"], block, qargs(("float", 8), "group", 128, dynamic=True))],
                         "float-quantized") == (FP8, None)
    for bad in ([128], [128, "x"], "128xa", [True, 1]):
        with pytest.raises(R.QuantConfigError, match="block_structure"):
            R.parse_args(dict(block, block_structure=bad), "w")


def test_group_activation_ordering_is_accepted_with_strategy_tensor_group() -> None:
    """QuantizationArgs: group activation ordering needs strategy group or tensor_group (the NVFP4 weights)."""
    for strategy in ("group", "tensor_group"):
        a = R.parse_args(qargs(("float", 4), strategy, 16, actorder="group"), "w")
        assert (a.strategy, a.actorder) == (strategy, "group")
    with pytest.raises(R.QuantConfigError, match="activation ordering"):
        R.parse_args(qargs(("float", 8), "channel", actorder="group"), "w")
    nvfp4_ordered = qargs(("float", 4), "tensor_group", 16, actorder="group")
    nvfp4_in = qargs(("float", 4), "tensor_group", 16, dynamic="local")
    assert _text_outcome([scheme_group(["Linear"], nvfp4_ordered, nvfp4_in)],
                         "nvfp4-pack-quantized") == (NVFP4, None)


def test_float_arguments_of_other_widths_need_an_explicit_zero_point_dtype() -> None:
    """compressed-tensors infers zp_dtype only for 4- and 8-bit floats; a written zp_dtype skips the inference."""
    with pytest.raises(R.QuantConfigError, match="num_bits 4 or 8"):
        R.parse_args(qargs(("float", 6), "channel"), "w")
    a = R.parse_args(qargs(("float", 6), "channel", zp_dtype="float8_e4m3fn"), "w")
    assert (a.type, a.num_bits) == ("float", 6)


def test_a_null_ignore_list_is_refused_as_vllm_fails_on_it() -> None:
    """vLLM maps the ignore list through the model's name mapper (``apply_vllm_mapper``: Qwen3.5 has a
    ``hf_to_vllm_mapper``, 0.28 and 0.33), iterating it: null is a TypeError at load."""
    quant = quant_dict([("FP8_DYNAMIC", ["Linear"], None)], [], "float-quantized")
    quant["ignore"] = None
    with pytest.raises(R.QuantConfigError, match="ignore is null"):
        R.parse_quant_config(quant)
    quant["ignore"] = "lm_head"
    with pytest.raises(R.QuantConfigError, match="ignore must be a list"):
        R.parse_quant_config(quant)


def test_lm_head_that_vllm_cannot_quantize_is_served_unquantized() -> None:
    """ParallelLMHead catches get_scheme's ValueError (NVFP4 weights with an FP8 input); other layers raise it."""
    nvfp4_w = qargs(("float", 4), "tensor_group", 16)
    fp8_in = qargs(("float", 8), "token", dynamic=True)
    config = with_quant(TEXT, scheme_config([scheme_group(["lm_head", DOWN], nvfp4_w, fp8_in)], [],
                                            "nvfp4-pack-quantized"))
    head, down = _one(config, "lm_head", OLD), _one(config, DOWN, OLD)
    assert (head.scheme, head.error, head.target) == (schemes.UNQUANTIZED, None, "lm_head")
    assert down.error_kind == "ValueError" and "input quantization must also be NVFP4" in (down.error or "")
