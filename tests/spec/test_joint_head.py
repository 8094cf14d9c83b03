"""The joint head's tensor set: the names the reference states, torch's layer names, and what
head_problems / config_problems report for a head that departs from its config."""

from __future__ import annotations

import pytest

from clef_format.spec.joint_head import (
    HEAD_DTYPE, PROJECTIONS, SCALARS, SCORER, all_tensors, config_problems, exact_tensors, head_problems,
    layer_tensors, parse_head_config,
)

RAW = {"hidden_size": 16, "width": 8, "routing_layers": 2, "layers": 2, "heads": 2, "feedforward": 12}
CFG, _ = parse_head_config(RAW)


def _head(**changes) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The full inferred head (BF16), with ``name=(dtype, shape)`` changes (``None`` drops it)."""
    out = {k: (HEAD_DTYPE, v) for k, v in all_tensors(CFG).items()}
    for name, info in changes.items():
        name = name.replace("__", ".")
        if info is None:
            out.pop(name)
        else:
            out[name] = info
    return out


def _problems(tensors) -> set[tuple[str, str, str]]:
    return {(p.kind, p.tensor, p.message) for p in head_problems(CFG, tensors)}


def test_the_inferred_head_has_no_problem() -> None:
    assert head_problems(CFG, _head()) == []
    assert config_problems(CFG, _head()) == []


def test_the_top_level_names_are_those_the_reference_states() -> None:
    assert exact_tensors(CFG) == {
        "hidden_norm.weight": (16,), "hidden_norm.bias": (16,), "type_embedding.weight": (3, 8),
        "field_norm.weight": (8,), "option_norm.weight": (8,),
        **{f"{p}_projection.weight": (8, 16) for p in PROJECTIONS}, **{s: () for s in SCALARS},
    }


@pytest.mark.parametrize("cross", [False, True])
def test_layer_tensors_are_torchs_own_layer(cross: bool) -> None:
    """Names and shapes equal torch's nn.TransformerEncoderLayer / DecoderLayer state_dict."""
    nn = pytest.importorskip("torch.nn")
    layer = (nn.TransformerDecoderLayer if cross else nn.TransformerEncoderLayer)(8, 2, 12)
    torch_tensors = {k: tuple(v.shape) for k, v in layer.state_dict().items()}
    assert layer_tensors(8, 12, cross=cross) == torch_tensors


def test_a_top_level_tensor_of_the_wrong_shape_is_reported() -> None:
    assert _problems(_head(hidden_norm__weight=(HEAD_DTYPE, (15,)))) == {
        ("shape", "hidden_norm.weight", "hidden_norm.weight is BF16[15], expected BF16[16]")}


def test_a_norm_bias_of_the_wrong_width_is_reported() -> None:
    """field_norm.bias is not stated by the reference, but a norm's parameters have the width."""
    both = _head(field_norm__bias=(HEAD_DTYPE, (5,)), option_norm__bias=(HEAD_DTYPE, (5,)))
    assert ("shape", "field_norm.bias", "field_norm.bias is BF16[5], expected [8]") in _problems(both)
    assert ("shape", "option_norm.bias", "option_norm.bias is BF16[5], expected [8]") in _problems(both)


def test_a_head_tensor_in_another_dtype_is_reported() -> None:
    assert _problems(_head(residual_gate=("F32", ()))) == {
        ("shape", "residual_gate", "residual_gate is F32; every head tensor of the release is BF16")}


def test_a_scorer_weight_that_is_no_multiple_of_the_width_is_reported() -> None:
    problems = _problems(_head(residual_scorer__0__weight=(HEAD_DTYPE, (8, 12))))
    assert ("shape", SCORER[0], "residual_scorer.0.weight is [8, 12]: expected [n, k x width 8]") in problems
    assert {p[1] for p in problems} == {SCORER[0]}


def test_a_scorer_bias_that_does_not_match_its_weight_is_reported() -> None:
    assert _problems(_head(residual_scorer__0__bias=(HEAD_DTYPE, (7,)))) == {
        ("shape", SCORER[1], "residual_scorer.0.bias is [7], its weight has 8 rows")}


def test_a_second_scorer_weight_that_does_not_chain_is_reported() -> None:
    assert _problems(_head(residual_scorer__3__weight=(HEAD_DTYPE, (1, 9)))) == {
        ("shape", SCORER[2], "residual_scorer.3.weight is [1, 9]: expected [m, 8] (the output of residual_scorer.0)")}


def test_a_tensor_held_by_half_the_layers_outside_the_inferred_set_is_unexpected() -> None:
    """A tie (one layer of two) is broken by the inferred layer: an extra name is the odd one out."""
    problems = _problems(_head(layers__0__extra__weight=(HEAD_DTYPE, (8,))))
    assert problems == {("unexpected", "layers.0.extra.weight", "layers.0 holds extra.weight, which its sibling "
                         "layers do not")}


def test_a_feedforward_the_layers_do_not_have_is_a_config_problem() -> None:
    cfg, _ = parse_head_config({**RAW, "feedforward": 20})
    problems = config_problems(cfg, _head())
    assert [(p.kind, p.tensor) for p in problems] == [("config", "feedforward")]
