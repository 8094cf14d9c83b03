"""``mrope_section`` under the real vLLM: verify's rule (``config_rules.mrope_rule``) refuses exactly the
RoPE parameters vLLM's own ``get_rope`` refuses to build, over generated sections, head sizes, partial
rotary factors, the RoPE types Qwen3.5 uses and ``mrope_interleaved`` (built on the CPU, as the attention layers build it)."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clef_format.vllm_rules.config_rules import mrope_rule
from tests.tier_vllm.oracle import _tolerate_missing_c_ops

#: Sections of every JSON type: lists of counts (the real ones among them), of mixed values, and non-lists.
_ELEMENT = st.one_of(st.integers(-3, 40), st.sampled_from([1.5, 16.0, "1", None, True, False, [1]]))
SECTIONS = st.one_of(st.lists(st.integers(0, 40), min_size=0, max_size=4), st.lists(_ELEMENT, max_size=4),
                     st.sampled_from([[11, 11, 10], [16, 24, 24], [8, 12, 12], [1, 1, 0], [2, 1, 1], [24, 20, 20],
                                      [11, 11.0, 10], None, 0, 32, "", "11,11,10", {}, {"a": 1}, True, False]))


def _built(head: int, rope: dict[str, Any]) -> bool:
    """Whether vLLM's get_rope builds the embedding (any exception: it refuses)."""
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import _ROPE_DICT, get_rope

    _ROPE_DICT.clear()
    try:
        with set_current_vllm_config(VllmConfig()), _tolerate_missing_c_ops():
            get_rope(head_size=head, max_position=16, rope_parameters=dict(rope), dtype=torch.float32)
    except (AssertionError, ValueError, TypeError, KeyError):
        return False
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(section=SECTIONS, head=st.sampled_from([16, 64, 128, 256]), factor=st.sampled_from([0.25, 0.5, 1.0]),
       rope_type=st.sampled_from(["default", "yarn"]), interleaved=st.sampled_from([None, True, False]))
def test_mrope_section_rule_equals_get_rope(section, head, factor, rope_type, interleaved) -> None:
    rope: dict[str, Any] = {"rope_theta": 10000.0, "partial_rotary_factor": factor, "rope_type": rope_type,
                            "mrope_section": section}
    if interleaved is not None:
        rope["mrope_interleaved"] = interleaved
    if rope_type == "yarn":
        rope.update(factor=2.0, original_max_position_embeddings=16)
    assert (mrope_rule(rope, head) is None) == _built(head, rope), (rope, head, mrope_rule(rope, head))


def test_qwen3_5_sections_build() -> None:
    """The real Qwen3.5 config: head_dim 256, partial_rotary_factor 0.25, [11, 11, 10], interleaved."""
    rope = {"rope_theta": 10000000.0, "partial_rotary_factor": 0.25, "rope_type": "default",
            "mrope_section": [11, 11, 10], "mrope_interleaved": True}
    assert mrope_rule(rope, 256) is None and _built(256, rope)
    bad = {**rope, "mrope_section": [11, 11, 11]}
    assert mrope_rule(bad, 256) is not None and not _built(256, bad)
