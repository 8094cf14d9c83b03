"""The gather as callers use it: the default backend, and every refusal's own words (what a plugin
author reads when a call is wrong). Survivors of the hooks' unsampled mutmut run."""

from __future__ import annotations

import re

import pytest
import torch

from clef_format.vllm.int8_gather import gather_rows, gather_rows_shard, resolve_backend
from tests.support.torch_int8 import dequantize_rows, quantize_rows


def _table(vocab: int = 6, hidden: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_rows(torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(3)))


def test_the_default_backend_serves_both_gathers_on_the_cpu() -> None:
    q, scale = _table()
    ids = torch.tensor([0, 5, 2])
    whole = dequantize_rows(q, scale, torch.bfloat16)
    assert torch.equal(gather_rows(q, scale, ids), whole[ids])
    part = gather_rows_shard(q[2:4], scale[2:4], ids, 2, 4)
    assert torch.equal(part[2], whole[2]) and not part[:2].any()


def test_a_backend_outside_the_list_is_named_with_the_list() -> None:
    with pytest.raises(ValueError, match=re.escape("backend must be one of ('auto', 'triton', 'torch'), not 'gpu'")):
        resolve_backend("gpu", torch.device("cpu"))  # type: ignore[arg-type]


def test_triton_without_cuda_or_its_interpreter_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    import clef_format.vllm.int8_gather as G

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    importable = G._triton() is not None
    with pytest.raises(RuntimeError) as exc:
        resolve_backend("triton", torch.device("cpu"))
    assert str(exc.value) == ("backend='triton' needs CUDA tensors and an importable triton "
                              f"(device=cpu, triton importable={importable})")


def test_each_wrong_argument_is_named_with_what_was_given() -> None:
    q, scale = _table()
    ids = torch.tensor([1])
    cases = [
        (lambda: gather_rows(q.float(), scale, ids), TypeError, "q must be int8 [vocab, hidden], got torch.float32 (6, 4)"),
        (lambda: gather_rows(q, scale[:5], ids), TypeError, "scale must be float32 [6, 1], got torch.float32 (5, 1)"),
        (lambda: gather_rows(q, scale, torch.tensor([True])), TypeError, "ids must be an integer tensor, got torch.bool"),
        (lambda: gather_rows(q, scale, ids.float()), TypeError, "ids must be an integer tensor, got torch.float32"),
        (lambda: gather_rows(q, scale, ids, torch.int8), TypeError, "out_dtype must be a floating dtype, got torch.int8"),
        (lambda: gather_rows(q, scale, ids.to("meta")), ValueError,
         "q, scale and ids must share a device: cpu, cpu, meta"),
        (lambda: gather_rows_shard(q[:2], scale[:2], ids, 0, 3), ValueError,
         "shard range [0, 3) does not fit a shard of 2 rows"),
    ]
    for call, kind, words in cases:
        with pytest.raises(kind) as exc:
            call()
        assert str(exc.value) == words
