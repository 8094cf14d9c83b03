"""The resolver against the real vLLM: every layer's decision must equal vLLM's own, per vLLM version.

Runs in the env of the vLLM under test (``scripts/test-vllm.sh``; ``CLEF_VLLM_VERSION`` picks 0.28
or 0.33) and resolves with that version's rules (``oracle.VERSION``).

(a) vLLM's matching functions (``CompressedTensorsConfig.from_config`` -> ``configure_quant_config`` ->
``get_scheme_dict`` -> ``_get_scheme_from_parts``) on every layer name the resolver lists: the four
published builds, the exhaustive scheme grid (``pattern_cases.scheme_grid``) and hypothesis-generated
configs (patterns and schemes);
(b) the strongest oracle: vLLM constructs the tiny model on the meta device and records every layer
it asks the quantization config about; the set of layers, their classes and decisions must match.
A config vLLM refuses as a whole (``oracle.REFUSALS``) must be refused by the resolver too; any other
exception out of vLLM fails the test.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

import oracle
import vllm
from clef_format import resolve as R
from clef_format import schemes, vllm_names
from clef_format.model_spec import parse_config
from fixtures.configs import tiny_config
from pattern_cases import fixture_configs, quantized_configs, scheme_grid, scheme_model_configs, with_quant

VERSION = oracle.VERSION
SCHEME_CLASS = {v: k for k, v in R.VLLM_SCHEME_CLASSES.items()} | {R.NVFP4_W4A16: "CompressedTensorsW4A4Fp4+a16"}
FIXTURES = fixture_configs()
#: configs compared through vLLM's functions / through construction (refused by both included),
#: of which vLLM accepted; layer decisions compared.
TOTALS = {"functions": 0, "functions_accepted": 0, "construction": 0, "construction_accepted": 0, "layers": 0,
          "grid": 0}
#: The minimum a full run of this file must reach (issue 12): checked by test_report_totals.
MIN_FUNCTIONS, MIN_CONSTRUCTION = 3000, 200


def _decision(d: R.Decision) -> oracle.VllmDecision:
    cls = None if d.scheme in (None, schemes.UNQUANTIZED) else SCHEME_CLASS[d.scheme]
    return oracle.VllmDecision(cls, None if d.ignored else d.target, d.error_kind)


def ours(config: dict[str, Any]) -> tuple[dict[str, oracle.VllmDecision] | None, dict[str, str]]:
    """The resolver's decisions in the oracle's terms, plus each layer's class (None: config refused)."""
    model = vllm_names.build(parse_config(config), VERSION)
    classes = {l.name: l.cls for l in model.layers}
    try:
        decisions = R.resolve_vllm(config, VERSION)
    except R.QuantConfigError:
        return None, classes
    return {d.layer: _decision(d) for d in decisions}, classes


def theirs_direct(config: dict[str, Any], classes: dict[str, str]) -> dict[str, oracle.VllmDecision] | None:
    if oracle.refusal(config) is not None:  # only vLLM's own refusals; anything else propagates
        return None
    return oracle.direct(config, list(classes.items()))


def assert_same(config: dict[str, Any], mine: dict[str, oracle.VllmDecision] | None,
                real: dict[str, oracle.VllmDecision] | None, kind: str = "functions") -> None:
    qc = config.get("quantization_config")
    assert (mine is None) == (real is None), (f"vLLM {VERSION}: config acceptance differs: resolver refuses "
                                              f"{mine is None}, vLLM refuses {real is None}\n{qc}")
    TOTALS[kind] += 1
    if mine is None or real is None:
        return
    assert set(mine) == set(real)
    diffs = {n: (mine[n], real[n]) for n in mine if mine[n] != oracle.VllmDecision(real[n].scheme_class, real[n].target, real[n].error_kind)}
    assert not diffs, f"vLLM {VERSION}: {len(diffs)} layers differ, e.g. {next(iter(diffs.items()))}\nconfig: {qc}"
    TOTALS[kind + "_accepted"] += 1
    TOTALS["layers"] += len(mine)


def test_env_runs_the_vllm_version_asked_for() -> None:
    """scripts/test-vllm.sh --vllm V (CLEF_VLLM_VERSION) must run vLLM V, and the resolver knows it as proven."""
    import os

    asked = os.environ.get("CLEF_VLLM_VERSION")
    if asked:
        assert VERSION == asked
    assert vllm_names.rules_for(VERSION).proven


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
    assert_same(config, mine, real, "construction")


#: The grid asks about one layer of each kind vLLM matches differently (a fused MergedColumn layer,
#: the fused QKV layer, a RowParallel layer, the ParallelLMHead) of a 4-layer text-only model.
GRID_BASE = tiny_config(4, multimodal=False)
GRID_LAYERS = ("model.layers.0.linear_attn.in_proj_qkvz", "model.layers.3.self_attn.qkv_proj",
               "model.layers.0.mlp.down_proj", "lm_head")


@lru_cache(maxsize=1)
def _grid_model() -> vllm_names.VllmModel:
    return vllm_names.build(parse_config(GRID_BASE), VERSION)


def _grid_ours(quant: dict[str, Any]) -> dict[str, oracle.VllmDecision] | None:
    model = _grid_model()
    try:
        vq = R.vllm_view(R.parse_quant_config(quant, VERSION), model)
    except R.QuantConfigError:
        return None
    layers = {l.name: l for l in model.layers}
    return {n: _decision(R.resolve_layer(layers[n], vq, model)) for n in GRID_LAYERS}


@pytest.mark.vllm
def test_scheme_grid_matches_vllm_functions() -> None:
    """Every grid config (about 26,000; see pattern_cases.scheme_grid) decided alike by vLLM and the resolver."""
    classes = {l.name: l.cls for l in _grid_model().layers if l.name in GRID_LAYERS}
    assert set(classes) == set(GRID_LAYERS)
    failures: list[str] = []
    seen: dict[str, set[str]] = {}
    grid = scheme_grid()
    for quant in grid:
        config = with_quant(GRID_BASE, quant)
        mine = _grid_ours(quant)
        real = theirs_direct(config, classes)
        try:
            assert_same(config, mine, real)
        except AssertionError as e:
            failures.append(str(e).splitlines()[0] + "\n  " + str(quant))
            continue
        for d in (real or {}).values():
            seen.setdefault(d.scheme_class or d.error_kind or "unquantized", set())
        TOTALS["grid"] += 1
    print(f"\nvLLM {VERSION}: scheme grid {len(grid)} configs; outcomes seen: {sorted(seen)}")
    assert not failures, f"{len(failures)} of {len(grid)} grid configs differ; first ones:\n" + "\n".join(failures[:5])


@pytest.mark.vllm
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(quantized_configs())
def test_generated_configs_match_vllm_functions(config: dict[str, Any]) -> None:
    mine, classes = ours(config)
    assert_same(config, mine, theirs_direct(config, classes))


@pytest.mark.vllm
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheme_model_configs())
def test_generated_scheme_configs_match_vllm_functions(config: dict[str, Any]) -> None:
    mine, classes = ours(config)
    assert_same(config, mine, theirs_direct(config, classes))


def _construct_and_compare(config: dict[str, Any]) -> None:
    mine, classes = ours(config)
    if mine is None:
        assert theirs_direct(config, classes) is None
        TOTALS["construction"] += 1
        return
    real = oracle.construct(config)
    assert {n: d.module_class for n, d in real.items()} == classes
    assert_same(config, mine, real, "construction")


@pytest.mark.vllm
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(quantized_configs())
def test_generated_configs_match_vllm_construction(config: dict[str, Any]) -> None:
    _construct_and_compare(config)


@pytest.mark.vllm
@settings(max_examples=220, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheme_model_configs())
def test_generated_scheme_configs_match_vllm_construction(config: dict[str, Any]) -> None:
    _construct_and_compare(config)


def test_report_totals() -> None:
    """Prints how many configs and layers agreed (run with -s); collected last in this file.

    When the whole file ran (the grid and the construction tests both counted), the run must have
    compared at least MIN_FUNCTIONS accepted configs through vLLM's functions and MIN_CONSTRUCTION
    configs through construction."""
    t = TOTALS
    print(f"\nvLLM {vllm.__version__}: 0 disagreements; through vLLM's functions {t['functions']} configs "
          f"({t['functions_accepted']} accepted, {t['grid']} of them from the scheme grid), through meta-device "
          f"construction {t['construction']} configs ({t['construction_accepted']} built), "
          f"{t['layers']} layer decisions")
    if t["grid"] and t["construction"] > len(FIXTURES):
        assert t["functions_accepted"] >= MIN_FUNCTIONS
        assert t["construction_accepted"] >= MIN_CONSTRUCTION
