"""The resolver against the real vLLM: every layer's decision must equal vLLM's own.

(a) vLLM's matching functions (``CompressedTensorsConfig.from_config`` -> ``apply_vllm_mapper`` ->
``get_scheme_dict`` -> ``_get_scheme_from_parts``) on every layer name the resolver lists, and
(b) the strongest oracle: vLLM constructs the tiny model on the meta device and records every layer
it asks the quantization config about; the set of layers, their classes and decisions must match.
Runs against the vLLM of the env (``scripts/test-vllm.sh --vllm 0.28|0.33``) with that version's
rules. A config vLLM refuses as a whole (``oracle.REFUSALS``) must be refused by the resolver too;
any other exception out of vLLM fails the test. The scheme grid and grammar: test_scheme_grid.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import vllm
from hypothesis import HealthCheck, given, settings

from clef_format.spec import schemes
from clef_format.spec.model_spec import parse_config
from clef_format.vllm_rules import matching as R
from clef_format.vllm_rules import names as vllm_names
from tests.tier_vllm import oracle
from tests.support.pattern_cases import fixture_configs, quantized_configs

VERSION = ".".join(vllm.__version__.split(".")[:2])
SCHEME_CLASS = {v: k for k, v in R.VLLM_SCHEME_CLASSES.items()} | {R.NVFP4_W4A16: "CompressedTensorsW4A4Fp4+a16"}
FIXTURES = fixture_configs()
TOTALS = {"configs": 0, "constructed": 0, "refused": 0, "layers": 0}  # accepted / built / refused by both


def ours(config: dict[str, Any]) -> tuple[dict[str, oracle.VllmDecision] | None, dict[str, str]]:
    """The resolver's decisions in the oracle's terms, plus each layer's class (None: config refused)."""
    model = vllm_names.build(parse_config(config), VERSION)
    classes = {l.name: l.cls for l in model.layers}
    try:
        decisions = R.resolve_vllm(config, VERSION)
    except R.QuantConfigError:
        return None, classes
    out = {}
    for d in decisions:
        cls = None if d.scheme in (None, schemes.UNQUANTIZED) else SCHEME_CLASS[d.scheme]
        out[d.layer] = oracle.VllmDecision(cls, None if d.ignored else d.target, d.error_kind)
    return out, classes


def theirs_direct(config: dict[str, Any], classes: dict[str, str]) -> dict[str, oracle.VllmDecision] | None:
    if oracle.refusal(config) is not None:  # only vLLM's own refusals; anything else propagates
        return None
    return oracle.direct(config, list(classes.items()))


def assert_same(config: dict[str, Any], mine: dict[str, oracle.VllmDecision] | None,
                real: dict[str, oracle.VllmDecision] | None, kind: str = "configs") -> None:
    qc = config.get("quantization_config")
    assert (mine is None) == (real is None), (
        f"vLLM {VERSION}: config acceptance differs: resolver {mine is None}, vLLM {real is None}\n{qc}")
    if mine is None or real is None:
        TOTALS["refused"] += 1
        return
    assert set(mine) == set(real)
    diffs = {n: (mine[n], real[n]) for n in mine
             if mine[n] != oracle.VllmDecision(real[n].scheme_class, real[n].target, real[n].error_kind)}
    assert not diffs, f"vLLM {VERSION}: {len(diffs)} layers differ, e.g. {next(iter(diffs.items()))}\nconfig: {qc}"
    TOTALS[kind] += 1
    TOTALS["layers"] += len(mine)


@pytest.mark.vllm
@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_configs_match_vllm_functions(name: str) -> None:
    config = FIXTURES[name]
    mine, classes = ours(config)
    assert_same(config, mine, theirs_direct(config, classes))


@pytest.mark.vllm
@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_configs_match_vllm_construction(name: str) -> None:
    config = FIXTURES[name]
    mine, classes = ours(config)
    real = oracle.construct(config)
    assert {n: d.module_class for n, d in real.items()} == classes, "vLLM's layer names/classes differ from vllm_names"
    assert_same(config, mine, real, "constructed")


@pytest.mark.vllm
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(quantized_configs())
def test_generated_configs_match_vllm_functions(config: dict[str, Any]) -> None:
    mine, classes = ours(config)
    assert_same(config, mine, theirs_direct(config, classes))


@pytest.mark.vllm
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(quantized_configs())
def test_generated_configs_match_vllm_construction(config: dict[str, Any]) -> None:
    mine, classes = ours(config)
    if mine is None:
        assert theirs_direct(config, classes) is None
        return
    real = oracle.construct(config)
    assert {n: d.module_class for n, d in real.items()} == classes
    assert_same(config, mine, real, "constructed")


def test_report_totals() -> None:
    """Prints how many configs and layers agreed (run with -s); collected last in this file."""
    print(f"\nvLLM {vllm.__version__}: resolver agreed on {TOTALS['configs']} configs, {TOTALS['layers']} layer decisions"
          " (so far; test_scheme_grid.py adds the grid and the scheme grammar)")
