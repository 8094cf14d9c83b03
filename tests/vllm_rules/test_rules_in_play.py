"""``rules_in_play``: verify checks a second vLLM version only where a version-table row can change a
decision. The claim is exact or the skip would hide a difference, so it is tested against the brute
force: resolve the config on both sides of each row and compare every decision."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings

from clef_format.spec.model_spec import parse_config
from clef_format.vllm_rules import matching as R
from clef_format.vllm_rules import names as vllm_names
from tests.support.pattern_cases import fixture_configs, scheme_grid, scheme_model_configs, with_quant
from clef_format.fixtures.configs import tiny_config

#: Each version step the table knows: the last minor version before a row and the first with it,
#: with the rows (one or more) on which the two differ.
PAIRS = sorted({(f"{r.since[0]}.{r.since[1] - 1}", f"{r.since[0]}.{r.since[1]}") for r in vllm_names.VERSION_TABLE})
PAIRS = [(a, b, frozenset(r.name for r in vllm_names.differing_rules(a, b))) for a, b in PAIRS]


def _outcome(config: dict[str, Any], version: str) -> Any:
    try:
        return [tuple(d) for d in R.resolve_vllm(config, version)]
    except R.QuantConfigError as e:
        return ("refused", str(e).replace(version, "V"))


def _in_play(config: dict[str, Any], version: str) -> frozenset[str] | None:
    cfg = parse_config(dict(config))
    model = vllm_names.build(cfg, version)
    if cfg.quantization is None:
        return frozenset()
    try:
        qc = R.parse_quant_config(cfg.quantization, version)
    except R.QuantConfigError:
        return None
    return R.rules_in_play(qc, R.vllm_view(qc, model), model)


def _check(config: dict[str, Any]) -> None:
    for before, after, rows in PAIRS:
        for version in (before, after):
            play = _in_play(config, version)
            if play is not None and not rows & play:
                assert _outcome(config, before) == _outcome(config, after), (
                    f"rows {sorted(rows)} said not in play on vLLM {version}, yet {before} and {after} resolve differently")


def test_published_builds_put_no_row_in_play() -> None:
    for name, config in fixture_configs().items():
        for version in ("0.28", "0.33"):
            assert _in_play(config, version) == frozenset(), name
        _check(config)


def test_each_row_is_in_play_where_it_changes_a_decision() -> None:
    """The version-table cases the resolver tests name, each put its own row in play."""
    base = tiny_config(4, multimodal=True)
    grid = scheme_grid()
    seen: set[str] = set()
    for qc in grid[::7]:
        config = with_quant(base, qc)
        _check(config)
        for before, after, rows in PAIRS:
            if _outcome(config, before) != _outcome(config, after):
                seen |= rows & _in_play(config, before) if _in_play(config, before) is not None else rows
    assert seen >= {"actorder_group_refused", "w4a8_int_needs_int", "mxfp4_w4a8_fp8"}, seen


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheme_model_configs())
def test_no_row_outside_play_changes_a_decision(config: dict[str, Any]) -> None:
    _check(config)


def test_a_group_overwritten_by_a_later_one_still_counts() -> None:
    """vLLM refuses a group's actorder at parse time even when a later group takes over its targets."""
    from tests.support.pattern_cases import qargs, scheme_config, scheme_group

    ordered = {**qargs(("int", 4), "group", 32), "actorder": "group"}
    fp8 = scheme_group(["Linear"], qargs(("float", 8), "channel"), qargs(("float", 8), "token", dynamic=True),
                       None, "float-quantized")
    qc = scheme_config([scheme_group(["Linear"], ordered, None, None, "pack-quantized"), fp8], [], "mixed-precision")
    config = with_quant(tiny_config(4, multimodal=False), qc)
    assert "actorder_group_refused" in (_in_play(config, "0.29") or ())
    assert _outcome(config, "0.29") != _outcome(config, "0.30")
    _check(config)


def test_a_regex_ignore_on_a_fused_name_counts() -> None:
    """``re:.*gate_up`` names vLLM's fused gate_up_proj: 0.30 ignores the layer whole, 0.29 tests its shards."""
    from tests.support.pattern_cases import qargs, scheme_config, scheme_group

    fp8 = scheme_group(["Linear"], qargs(("float", 8), "channel"), qargs(("float", 8), "token", dynamic=True),
                       None, "float-quantized")
    config = with_quant(tiny_config(4, multimodal=False), scheme_config([fp8], ["re:.*gate_up"], "float-quantized"))
    assert "fused_name_ignore" in (_in_play(config, "0.29") or ())
    assert _outcome(config, "0.29") != _outcome(config, "0.30")
    plain = with_quant(tiny_config(4, multimodal=False), scheme_config([fp8], ["re:.*down_proj$"], "float-quantized"))
    assert _in_play(plain, "0.29") == frozenset()
