"""The resolver against the real vLLM on every scheme compressed-tensors can express (per vLLM version).

(a) The exhaustive scheme grid (``pattern_cases.scheme_grid``, about 26,500 configs: every weight
kind x shape x symmetry x dynamic against every input activation, under every format class, plus
output activations, every activation ordering, scale dtypes, invalid arguments and 2:4 sparsity)
through vLLM's matching functions, on one layer of each matching kind; (b) the scheme grammar
(``pattern_cases.scheme_model_configs``: 1-3 such groups with the pattern grammar's targets and
ignores, fused names included) through vLLM's functions and through meta-device construction.
Collected after test_oracle.py, whose counters it extends; its last test checks the run's minimums.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

import pytest
import vllm
from hypothesis import HealthCheck, given, settings

from clef_format.fixtures.configs import tiny_config
from clef_format.spec import schemes
from clef_format.spec.model_spec import parse_config
from clef_format.vllm_rules import matching as R
from clef_format.vllm_rules import names as vllm_names
from tests.tier_vllm import oracle
from tests.tier_vllm import test_oracle as T
from tests.support.pattern_cases import scheme_grid, scheme_model_configs, with_quant

VERSION = oracle.VERSION
#: The minimum a full run of the tier must reach (issue 12): checked by test_report_totals.
MIN_FUNCTIONS, MIN_CONSTRUCTION = 3000, 200
GRID = {"configs": 0}


def test_env_runs_the_vllm_version_asked_for() -> None:
    """scripts/test-vllm.sh --vllm V (CLEF_VLLM_VERSION) must run vLLM V, and the resolver knows it as proven."""
    asked = os.environ.get("CLEF_VLLM_VERSION")
    if asked:
        assert VERSION == asked
    assert T.VERSION == VERSION and vllm_names.rules_for(VERSION).proven


#: The grid asks about one layer of each kind vLLM matches differently (a fused MergedColumn layer,
#: the fused QKV layer, a RowParallel layer, the ParallelLMHead) of a 4-layer text-only model.
GRID_BASE = tiny_config(4, multimodal=False)
GRID_LAYERS = ("model.layers.0.linear_attn.in_proj_qkvz", "model.layers.3.self_attn.qkv_proj",
               "model.layers.0.mlp.down_proj", "lm_head")


def _decision(d: R.Decision) -> oracle.VllmDecision:
    """A resolver decision in the oracle's terms (as test_oracle.ours converts them)."""
    cls = None if d.scheme in (None, schemes.UNQUANTIZED) else T.SCHEME_CLASS[d.scheme]
    return oracle.VllmDecision(cls, None if d.ignored else d.target, d.error_kind)


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
    """Every grid config decided alike by vLLM and the resolver (all compared, failures listed together)."""
    classes = {l.name: l.cls for l in _grid_model().layers if l.name in GRID_LAYERS}
    assert set(classes) == set(GRID_LAYERS)
    failures: list[str] = []
    seen: set[str] = set()
    grid = scheme_grid()
    for quant in grid:
        config = with_quant(GRID_BASE, quant)
        real = T.theirs_direct(config, classes)
        try:
            T.assert_same(config, _grid_ours(quant), real)
        except AssertionError as e:
            failures.append(str(e).splitlines()[0] + "\n  " + str(quant))
            continue
        seen |= {d.scheme_class or d.error_kind or "unquantized" for d in (real or {}).values()}
        GRID["configs"] += 1
    print(f"\nvLLM {VERSION}: scheme grid {len(grid)} configs; outcomes seen: {sorted(seen)}")
    assert not failures, f"{len(failures)} of {len(grid)} grid configs differ; first ones:\n" + "\n".join(failures[:5])


@pytest.mark.vllm
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheme_model_configs())
def test_generated_scheme_configs_match_vllm_functions(config: dict[str, Any]) -> None:
    mine, classes = T.ours(config)
    T.assert_same(config, mine, T.theirs_direct(config, classes))


@pytest.mark.vllm
@settings(max_examples=220, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheme_model_configs())
def test_generated_scheme_configs_match_vllm_construction(config: dict[str, Any]) -> None:
    mine, classes = T.ours(config)
    if mine is None:
        assert T.theirs_direct(config, classes) is None
        T.TOTALS["refused"] += 1
        return
    real = oracle.construct(config)
    assert {n: d.module_class for n, d in real.items()} == classes
    T.assert_same(config, mine, real, "constructed")


def test_report_totals() -> None:
    """Prints the run's counts (run with -s); collected last. When the whole tier ran (the grid and
    the generated construction tests counted), it must have compared at least MIN_FUNCTIONS accepted
    configs through vLLM's functions and built MIN_CONSTRUCTION through construction."""
    t = T.TOTALS
    print(f"\nvLLM {vllm.__version__}: 0 disagreements; {t['configs']} accepted configs through vLLM's functions "
          f"({GRID['configs']} grid configs compared, accepted or refused by both), {t['constructed']} built through "
          f"meta-device construction, {t['refused']} configs refused by both, {t['layers']} layer decisions")
    if GRID["configs"] and t["constructed"] > len(T.FIXTURES):
        assert t["configs"] >= MIN_FUNCTIONS
        assert t["constructed"] >= MIN_CONSTRUCTION
