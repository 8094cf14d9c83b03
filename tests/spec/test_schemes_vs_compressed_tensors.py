"""The resolver's matching against compressed-tensors' own (``match_name``, ``is_match``, ``match_targets``).

Where the two libraries agree (plain names and regexes on unfused names; the quantizer's view of HF
modules) the resolver must give compressed-tensors' answer. Where they disagree, on vLLM's fused
names, the tests document it: compressed-tensors counts a fused name as matched if ANY shard
matches, vLLM (and so the resolver) needs ALL shards.
"""

from __future__ import annotations

import torch
from compressed_tensors.utils.match import is_match, match_name, match_targets
from hypothesis import given, settings
from hypothesis import strategies as st

from clef_format.fixtures.configs import tiny_config
from clef_format.spec.model_spec import parse_config
from clef_format.vllm_rules import matching as R
from clef_format.vllm_rules import names as vllm_names
from tests.support.pattern_cases import IGNORES, TARGETS, quant_configs

CFG = parse_config(tiny_config(4))
MODEL = vllm_names.build(CFG)
HF_NAMES = [s.name for s in vllm_names.linear_modules(CFG)] + ["lm_head"]
LINEAR = torch.nn.Linear(1, 1)
PATTERNS = sorted(set(TARGETS) | set(IGNORES))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(HF_NAMES), st.sampled_from(PATTERNS))
def test_hf_module_match_equals_is_match(name: str, pattern: str) -> None:
    assert R.ct_match(name, pattern, vllm_names.HF_LINEAR_CLASSES) == is_match(name, LINEAR, pattern)


@settings(max_examples=60, deadline=None)
@given(quant_configs())
def test_quantizer_view_equals_match_targets(quant: dict) -> None:
    try:
        qc = R.parse_quant_config(quant)
    except R.QuantConfigError:
        return
    for name in HF_NAMES:
        d = R.resolve_hf_module(name, qc)
        matched = match_targets(name, LINEAR, qc.hf_targets)
        ignored = is_match(name, LINEAR, list(qc.ignore)) if qc.ignore else False
        if not matched or ignored:
            assert d.scheme is None
        else:
            assert d.target == matched[0]


UNFUSED = [l.name for l in MODEL.layers if l.fused is None]
FUSED = [l.name for l in MODEL.layers if l.fused is not None]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(UNFUSED), st.sampled_from(PATTERNS))
def test_unfused_vllm_names_agree(name: str, pattern: str) -> None:
    assert R.equal_or_regex(name, pattern) == match_name(name, pattern)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(FUSED), st.sampled_from([p for p in PATTERNS if p.startswith("re:") or "." in p]))
def test_fused_names_any_versus_all_shards(name: str, pattern: str) -> None:
    """compressed-tensors: any shard; vLLM: the name itself, else all shards. They differ exactly there."""
    packed = {k: list(v) for k, v in MODEL.packed.items()}
    shards = R.fused_shards(name, MODEL.packed)[1]
    ct = match_name(name, pattern, fused=packed)
    ours = R.find_matched_target(name, "", [pattern], MODEL.packed) is not None
    assert ct == any(R.equal_or_regex(s, pattern) for s in shards)
    assert ours == (R.equal_or_regex(name, pattern) or all(R.equal_or_regex(s, pattern) for s in shards))


def test_documented_disagreement_half_matched_fused_layer() -> None:
    name = "language_model.model.layers.0.linear_attn.in_proj_qkvz"
    target = r"re:.*in_proj_z$"
    assert match_name(name, target, fused={k: list(v) for k, v in MODEL.packed.items()})  # ct: matched
    assert R.find_matched_target(name, "MergedColumnParallelLinear", [target], MODEL.packed) is None  # vLLM: not
