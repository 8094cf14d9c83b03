"""The number rules of config.json (``config_rules.NUMBERS``, ``mrope_rule``, ``mrope_forward_rule``) against
the computation they protect, run with torch: every value the rule refuses makes vLLM's RMSNorm or RoPE formula
(in float32, as vLLM computes them) produce a non-finite (or all-zero) result or torch refuse it, and every value
it accepts in the working range a finite, non-degenerate one."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from clef_format.fixtures.configs import tiny_config
from clef_format.spec.model_spec import parse_config
from clef_format.vllm_rules.config_rules import config_problems, mrope_forward_rule, mrope_rule

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


#: float32's largest value, and the Python float halfway to the next power of two: from there a cast to
#: float32 (as ``tensor + eps`` and ``theta ** tensor`` do) gives infinity (ties to even: up).
F32_MAX = float(torch.finfo(torch.float32).max)
F32_TIE = F32_MAX + (F32_MAX - float(torch.nextafter(torch.tensor(F32_MAX), torch.tensor(0.0)))) / 2
BIG = [1e37, 1e38, F32_MAX, math.nextafter(F32_TIE, 0), F32_TIE, 1e39, 1e300]

EPS = st.one_of(st.sampled_from([math.nan, math.inf, -math.inf, -1e-6, -1.0, 0.0, 1e-6, 1e-5, *BIG]),
                st.floats(-1.0, 1.0, allow_nan=False), st.floats(1e37, 1e40))


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


THETA = st.one_of(st.sampled_from([math.nan, math.inf, -math.inf, -1.0, -10000.0, 0.0, 1.0, 10000.0, 1e7, *BIG,
                                   1e-50, 1e-45, 1e-40, 3e-39, 1e-38, 1e-30]),
                  st.floats(-1e9, 1e9, allow_nan=False), st.floats(1e-46, 1e-36), st.floats(1e37, 1e40))
#: Rotary widths: RoPE's exponents 2i/d lie in [0, 1), approaching 1 as d grows.
ROTARY_DIMS = (4, 64, 256, 512, 4096)


def _frequencies_fine(theta: float, rotary_dim: int) -> bool:
    freq = _inv_freq(theta, rotary_dim)
    return bool(torch.isfinite(freq).all() and (freq > 0).all())


def _cos_sin_cache(theta: float, rotary_dim: int = 512, positions: int = 16) -> torch.Tensor:
    """vLLM's RotaryEmbedding._compute_cos_sin_cache (rotary_embedding/base.py), over a few positions."""
    freqs = torch.einsum("i,j -> ij", torch.arange(positions, dtype=torch.float), _inv_freq(theta, rotary_dim))
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def _rope_broken(theta: float) -> bool:
    """vLLM's RoPE fails: a NaN, infinite or zero frequency at some rotary width, or a non-finite cos/sin cache."""
    return not all(_frequencies_fine(theta, d) for d in ROTARY_DIMS) or \
        not bool(torch.isfinite(_cos_sin_cache(theta)).all())


def _theta_refused(theta: float) -> bool:
    return "text_config.rope_parameters.rope_theta" in _problem_keys({"rope_parameters.rope_theta": theta})


@settings(max_examples=200, deadline=None)
@given(THETA)
def test_refused_rope_theta_makes_the_frequencies_non_finite(theta: float) -> None:
    if _theta_refused(theta):
        assert _rope_broken(theta), theta
    else:  # every frequency finite and nonzero at every width; a theta below 1 may still overflow the
        # cos/sin cache (position x frequency), which the rule leaves to max_position_embeddings
        assert all(_frequencies_fine(theta, d) for d in ROTARY_DIMS), theta
        assert theta < 1 or not _rope_broken(theta), theta


def _f32_neighbours(x: float) -> tuple[float, float]:
    """The float32 values either side of float32 ``x`` (torch.nextafter in float32)."""
    t = torch.tensor(x, dtype=torch.float32)
    return (float(torch.nextafter(t, torch.tensor(-math.inf))), float(torch.nextafter(t, torch.tensor(math.inf))))


#: Around the ends of rope_theta's float32 range, from torch: the largest float32 and the tie above it; the
#: float32 1/F32_MAX rounds to (whose reciprocal overflows), the next float32 up (whose does not) and the tie
#: between them; the smallest subnormal and half of it (which rounds to 0).
_LOW = float(torch.tensor(1.0) / torch.tensor(F32_MAX))
_LOW_UP = _f32_neighbours(_LOW)[1]
_LOW_TIE = _LOW + (_LOW_UP - _LOW) / 2
_TINY = float(torch.nextafter(torch.tensor(0.0), torch.tensor(1.0)))
THETA_EDGES = [F32_MAX, math.nextafter(F32_TIE, 0), F32_TIE, 1e39, _LOW, _LOW_UP, _LOW_TIE, math.nextafter(_LOW_TIE, 1),
               math.nextafter(_LOW_TIE, 0), _TINY, _TINY / 2, math.nextafter(_TINY / 2, 1), 1e-50, 1e-38, 1.0, 1e7]


@pytest.mark.parametrize("theta", THETA_EDGES)
def test_rope_theta_float32_range_agrees_with_torch(theta: float) -> None:
    """vLLM casts theta to float32 (``theta ** exponents``; exponent 1 shows the cast) and each inv_freq lies
    between 1 and 1/theta: the rule accepts exactly where torch's float32 theta and 1/theta are finite and
    nonzero, and then every width's frequencies are; a refused theta breaks the frequencies or the cache."""
    cast = theta ** torch.ones(1)
    torch_ok = bool(torch.isfinite(cast).all() and (cast > 0).all() and torch.isfinite(1.0 / cast).all())
    assert (not _theta_refused(theta)) == torch_ok, theta
    if torch_ok:
        assert all(_frequencies_fine(theta, d) for d in ROTARY_DIMS), theta
    else:
        assert _rope_broken(theta), theta


def test_rope_theta_documented_bounds_are_the_float32_ends() -> None:
    """docs/FORMAT.md: rope_theta within (2.938736577704951e-39, 3.4028235677973366e+38), both ends excluded."""
    low, high = 2.938736577704951e-39, 3.4028235677973366e+38
    assert low == _LOW_TIE and high == F32_TIE
    assert _theta_refused(low) and not _theta_refused(math.nextafter(low, 1))
    assert _theta_refused(high) and not _theta_refused(math.nextafter(high, 0))


@pytest.mark.parametrize("eps", [F32_MAX, math.nextafter(F32_TIE, 0), F32_TIE, 1e39, 1e-6])
def test_rms_norm_eps_float32_range_agrees_with_torch(eps: float) -> None:
    """RMSNorm adds eps to a float32 tensor: refused exactly where that sum is infinite (output all 0)."""
    refused = "text_config.rms_norm_eps" in _problem_keys({"rms_norm_eps": eps})
    assert refused == (not bool(torch.isfinite(X.pow(2).mean(-1, keepdim=True) + eps).all())), eps
    out = _rms_norm(eps)
    assert refused == (not out[1:].abs().sum() > 0), eps


def _mrope_forward_native(section: list) -> torch.Tensor:
    """vLLM's MRotaryEmbedding.forward_native with 3-row positions, mrope_interleaved off (mrope.py, 0.28 and
    0.33): the cos/sin cache split by the section, row i of part i."""
    cos = torch.randn(3, 5, sum(int(v) for v in section))
    return torch.cat([m[i] for i, m in enumerate(cos.split(section, dim=-1))], dim=-1)


def _mrope_refused(section: list) -> bool:
    return "text_config.rope_parameters.mrope_section" in _problem_keys({"rope_parameters.mrope_section": section})


#: Sections summing to the tiny config's rotary_dim // 2 = 2 (head_dim 16 x 0.25 = 4), so get_rope builds them.
SECTIONS = [[1, 1, 0], [2, 0, 0], [0, 2, 0], [0, 0, 2], [1.0, 1, 0], [2.0, 0, 0], [1, 0.5, 0.5], [True, 1, 0],
            [True, True, False], [0, True, 1], [3, -1, 0], [4, -1, -1], [-1, 3, 0]]


def _splits(section: list) -> bool:
    try:
        _mrope_forward_native(section)
    except (TypeError, RuntimeError):
        return False
    return True


def _agrees_with_split(refused: bool, section: list) -> bool:
    """Refused exactly where torch.split fails, and wherever a boolean stands for a count: torch's argument
    parser refuses a bool only as the first entry ([True, 1, 0]: TypeError; [0, True, 1] splits)."""
    return refused == (not _splits(section) or any(isinstance(v, bool) for v in section))


@pytest.mark.parametrize("section", SECTIONS, ids=[str(s) for s in SECTIONS])
def test_mrope_section_entries_are_refused_exactly_where_torch_split_fails(section: list) -> None:
    assert mrope_rule({"rope_theta": 1e4, "partial_rotary_factor": 0.25, "mrope_section": section}, 16) is None
    assert _agrees_with_split(_mrope_refused(section), section), section


ENTRY = st.one_of(st.integers(-4, 6), st.sampled_from([0.0, 1.0, 2.0, 0.5, True, False]))


@settings(max_examples=200, deadline=None)
@given(ENTRY, ENTRY)
def test_mrope_section_entry_rule_matches_torch_split(a, b) -> None:
    section = [a, b, 2 - a - b]  # the sum get_rope asserts: only the entries' form is left to decide
    assert _agrees_with_split(mrope_forward_rule({"mrope_section": section}) is not None, section), section
    assert _agrees_with_split(_mrope_refused(section), section), section


def test_qwen3_5_real_mrope_section_is_accepted_and_a_wrong_sum_refused() -> None:
    """The real exports: head_dim 256, partial_rotary_factor 0.25, mrope_section [11, 11, 10] (sum 32 = 64 / 2)."""
    rope = {"rope_theta": 10000000.0, "partial_rotary_factor": 0.25, "rope_type": "default",
            "mrope_section": [11, 11, 10], "mrope_interleaved": True}
    assert mrope_rule(rope, 256) is None and mrope_forward_rule(rope) is None
    assert "sum 33" in (mrope_rule({**rope, "mrope_section": [11, 11, 11]}, 256) or "")
    assert mrope_rule({**rope, "mrope_section": []}, 256) is None  # vLLM checks only a non-empty section
    assert mrope_rule({**rope, "rope_dim": 66}, 256) is not None  # rope_dim replaces head_dim x factor


def test_an_integer_beyond_float_range_is_a_finding_or_accepted_never_a_crash() -> None:
    """JSON integers have no range: 10**400 is a valid max_position_embeddings to json.loads, compared as written
    (past the longest torch.arange torch makes: a finding), and a rope_theta past float32's range."""
    assert "text_config.max_position_embeddings" in _problem_keys({"max_position_embeddings": 10**400})
    assert "text_config.max_position_embeddings" not in _problem_keys({"max_position_embeddings": 2**60 - 1})
    assert "text_config.max_position_embeddings" in _problem_keys({"max_position_embeddings": -10**400})
    assert _theta_refused(10**400)


@pytest.mark.parametrize("key", ["rms_norm_eps", "rope_theta", "max_position_embeddings", "rope_parameters"])
def test_verify_of_a_json_integer_beyond_float_range_is_a_report_never_a_traceback(tmp_path, key: str) -> None:
    """The whole command, where the type rule also sees the value (it converted it to float and raised
    OverflowError: a traceback instead of a report)."""
    import subprocess
    import sys

    from clef_format.fixtures.builders import build_checkpoint

    root = build_checkpoint(tmp_path / "ck", layout="layout-2", build="bf16")
    path = root / "config.json"
    config = json.loads(path.read_text())
    text = config.get("text_config", config)
    if key == "rope_parameters":
        text.setdefault("rope_parameters", {})["rope_theta"] = 10**400
    else:
        text[key] = 10**400
    path.write_text(json.dumps(config))
    proc = subprocess.run([sys.executable, "-m", "clef_format", "verify", str(root), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert proc.returncode == (0 if report["ok"] else 1)
    if key in ("rms_norm_eps", "rope_parameters"):  # a top-level rope_theta beside rope_parameters' own is dropped
        assert not report["ok"]


@pytest.mark.parametrize("theta", ["10000", None, [10000], {"v": 1}])
def test_a_nested_rope_theta_that_is_not_a_number_is_refused(theta: object) -> None:
    """rope_parameters is a plain dict to transformers (its values kept as written), and vLLM computes
    ``base ** arange(...)`` with it: a string or null raises TypeError at start (checked here with torch)."""
    assert _theta_refused(theta)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        1.0 / (theta ** (torch.arange(0, 8, 2, dtype=torch.float) / 8))  # type: ignore[operator]



@pytest.mark.parametrize("legacy", [0, 1e39, "abc"])
def test_a_legacy_rope_theta_beside_rope_parameters_own_is_not_judged(tmp_path, legacy: object) -> None:
    """transformers (AutoConfig) keeps rope_parameters.rope_theta and drops the legacy key: what vLLM
    serves with is 10000, so the legacy value is no error. Without rope_parameters' own, the legacy one is
    what transformers uses, and 0 is refused."""
    from transformers import AutoConfig

    raw = copy.deepcopy(tiny_config())
    raw["text_config"]["rope_theta"] = legacy
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert AutoConfig.from_pretrained(tmp_path).text_config.rope_parameters["rope_theta"] == 10000.0
    assert "text_config.rope_theta" not in {p.key for p in config_problems(raw, parse_config(raw))}
    raw["text_config"]["rope_parameters"].pop("rope_theta")
    raw["text_config"]["rope_theta"] = 0
    assert "text_config.rope_theta" in {p.key for p in config_problems(raw, parse_config(raw))}
