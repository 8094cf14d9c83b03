"""Served answers against the transformers reference, with tolerances measured, not guessed.

bfloat16 tolerance: vLLM computes in bfloat16, so it cannot be closer to the float32 reference
than bfloat16 allows. How far bfloat16 alone moves these weights is measured on transformers
itself (its bfloat16 run against its float32 run, same weights); the served answer may deviate
from float32 by twice that, plus a small floor.

int8 error: how far the int8 tables move the answer is the float32 reference on the decoded
tables against the float32 reference on the BF16 originals. The served answer may deviate from
the originals by that much plus the bfloat16 tolerance.
"""

from __future__ import annotations

import torch

from reference import Reference, logprob_gap, reference_gap, rel_err, served_logprobs

HIDDEN_FLOOR = 0.005  # relative
LOGPROB_FLOOR = 0.01  # nats


def hidden_tolerance(ref: Reference, i: int) -> float:
    return 2 * rel_err(ref.bf16.hidden[i], ref.fp32.hidden[i]) + HIDDEN_FLOOR


def logprob_tolerance(ref: Reference, entries: list, i: int) -> float:
    return 2 * reference_gap(ref.bf16, ref.fp32, entries, i) + LOGPROB_FLOOR


def check_hidden(hidden: list[torch.Tensor], ref: Reference) -> list[dict]:
    """Per prompt: served vs float32 reference, and the bfloat16 tolerance (asserted by the caller)."""
    return [{"err": rel_err(h, ref.fp32.hidden[i]), "tol": hidden_tolerance(ref, i),
             "cos_min": float(torch.nn.functional.cosine_similarity(h.float(), ref.fp32.hidden[i], dim=-1).min())}
            for i, h in enumerate(hidden)]


def check_logprobs(generated: list[dict], ref: Reference) -> list[dict]:
    out = []
    for i, result in enumerate(generated):
        entries = served_logprobs(result)
        out.append({"err": logprob_gap(entries, ref.fp32, i), "tol": logprob_tolerance(ref, entries, i),
                    "n": len(entries)})
    return out


def check_hidden_int8(hidden: list[torch.Tensor], decoded: Reference, original: Reference) -> list[dict]:
    out = []
    for i, h in enumerate(hidden):
        int8 = rel_err(decoded.fp32.hidden[i], original.fp32.hidden[i])
        out.append({"err": rel_err(h, original.fp32.hidden[i]), "int8": int8,
                    "tol": int8 + hidden_tolerance(decoded, i)})
    return out


def check_logprobs_int8(generated: list[dict], decoded: Reference, original: Reference) -> list[dict]:
    out = []
    for i, result in enumerate(generated):
        entries = served_logprobs(result)
        int8 = reference_gap(decoded.fp32, original.fp32, entries, i)
        out.append({"err": logprob_gap(entries, original.fp32, i), "int8": int8,
                    "tol": int8 + logprob_tolerance(decoded, entries, i)})
    return out


def greedy_agrees(generated: list[dict], ref: Reference) -> list[tuple[int, int, float]]:
    """(served first token, reference argmax, reference top-1 margin) per prompt."""
    out = []
    for i, result in enumerate(generated):
        last = ref.fp32.logprobs[i][-1]
        top = torch.topk(last, 2)
        out.append((result["tokens"][0], int(top.indices[0]), float(top.values[0] - top.values[1])))
    return out
