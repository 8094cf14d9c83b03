"""The number rules of config.json (``config_rules.NUMBERS``, ``mrope_rule``) against the computation they
protect, run with torch: every value the rule refuses makes vLLM's RMSNorm or RoPE formula produce a
non-finite (or all-zero) result, and every value it accepts in the working range a finite, non-degenerate one."""

from __future__ import annotations

import copy
import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from clef_format.fixtures.configs import tiny_config
from clef_format.spec.model_spec import parse_config
from clef_format.vllm_rules.config_rules import config_problems, mrope_rule

X = torch.randn(4, 64, dtype=torch.float32, generator=torch.Generator().manual_seed(0))
X[0] = 0.0  # a zero row: the one a negative eps turns NaN first


def _problem_keys(text_edit: dict) -> set[str]:
    raw = copy.deepcopy(tiny_config())
    for key, value in text_edit.items():
        node = raw["text_config"]
        *parents, leaf = key.split(".")
        for k in parents:
            node = node[k]
        node[leaf] = value
    return {p.key for p in config_problems(raw, parse_config(raw))}


def _rms_norm(eps: float) -> torch.Tensor:
    """vLLM's RMSNorm.forward_native (layers/layernorm.py): x * rsqrt(mean(x^2) + eps), weight 1."""
    return X * torch.rsqrt(X.pow(2).mean(-1, keepdim=True) + eps)


def _inv_freq(theta: float, rotary_dim: int = 64) -> torch.Tensor:
    """vLLM's RotaryEmbedding._compute_inv_freq (rotary_embedding/base.py)."""
    return 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))


EPS = st.one_of(st.sampled_from([math.nan, math.inf, -math.inf, -1e-6, -1.0, 0.0, 1e-6, 1e-5]),
                st.floats(-1.0, 1.0, allow_nan=False))


@settings(max_examples=200, deadline=None)
@given(EPS)
def test_refused_rms_norm_eps_is_exactly_where_the_norm_breaks(eps: float) -> None:
    refused = "text_config.rms_norm_eps" in _problem_keys({"rms_norm_eps": eps})
    out = _rms_norm(eps)
    broken = not torch.isfinite(out).all() or not out[1:].abs().sum() > 0
    if refused:
        assert broken, eps
    elif eps >= 1e-37:  # 0 (or one float32 rounds to 0) breaks only a zero row: accepted, no loader refuses it
        assert not broken, eps


THETA = st.one_of(st.sampled_from([math.nan, math.inf, -math.inf, -1.0, -10000.0, 0.0, 1.0, 10000.0, 1e7]),
                  st.floats(-1e9, 1e9, allow_nan=False))


@settings(max_examples=200, deadline=None)
@given(THETA)
def test_refused_rope_theta_makes_the_frequencies_non_finite(theta: float) -> None:
    refused = "text_config.rope_parameters.rope_theta" in _problem_keys({"rope_parameters.rope_theta": theta})
    freq = _inv_freq(theta)
    broken = not torch.isfinite(freq).all() or not (freq[1:] > 0).all()  # NaN/inf, or no position encoded
    assert refused == broken or (not refused and 0 < theta < 1), theta  # tiny thetas: float32 overflow


def test_qwen3_5_real_mrope_section_is_accepted_and_a_wrong_sum_refused() -> None:
    """The real exports: head_dim 256, partial_rotary_factor 0.25, mrope_section [11, 11, 10] (sum 32 = 64 / 2)."""
    rope = {"rope_theta": 10000000.0, "partial_rotary_factor": 0.25, "rope_type": "default",
            "mrope_section": [11, 11, 10], "mrope_interleaved": True}
    assert mrope_rule(rope, 256) is None
    assert "sum 33" in (mrope_rule({**rope, "mrope_section": [11, 11, 11]}, 256) or "")
    assert mrope_rule({**rope, "mrope_section": []}, 256) is None  # vLLM checks only a non-empty section
    assert mrope_rule({**rope, "rope_dim": 66}, 256) is not None  # rope_dim replaces head_dim x factor
