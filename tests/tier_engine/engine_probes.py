"""Functions run inside vLLM's worker process on the served model (``LLM.apply_model``).

They report what the worker holds, as plain lists and dicts: no assertion happens here.
"""

from __future__ import annotations

import os
from typing import Any

import torch


def _language_model(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "language_model", model)


def _describe(module: torch.nn.Module) -> dict[str, Any]:
    return {
        "type": type(module).__name__,
        "params": {n: [str(p.dtype), list(p.shape)] for n, p in module.named_parameters(recurse=False)},
        "buffers": {n: [str(b.dtype), list(b.shape)] for n, b in module.named_buffers(recurse=False)},
    }


def tables_report(model: torch.nn.Module, token_ids: list[int]) -> dict[str, Any]:
    """The two tables as the worker holds them, and what the plugin gives back for ``token_ids``."""
    import clef_vllm
    from clef_vllm.head import lexical_rows

    report = _tables(model, token_ids, lexical_rows)
    report["plugin_version"] = clef_vllm.PLUGIN_VERSION
    return report


def tables_report_plain(model: torch.nn.Module, token_ids: list[int]) -> dict[str, Any]:
    """The same report for an engine without the plugin (lexical rows: vLLM's ``lm_head.weight``)."""
    return _tables(model, token_ids, lambda m, ids: _language_model(m).lm_head.weight[ids])


def _tables(model: torch.nn.Module, token_ids: list[int], lexical_rows: Any) -> dict[str, Any]:
    lm = _language_model(model)
    embed, lm_head = lm.model.embed_tokens, lm.lm_head
    vocab, hidden = int(embed.num_embeddings), int(embed.embedding_dim)
    ids = torch.tensor(token_ids)
    # every floating [vocab (padded), hidden] tensor anywhere in the model: a BF16 table left behind
    vocab_float = [
        [name, str(t.dtype), list(t.shape)]
        for name, t in [*model.named_parameters(), *model.named_buffers()]
        if t.dim() == 2 and vocab <= t.shape[0] < vocab + 64 and t.shape[1] == hidden and t.is_floating_point()
    ]
    head = getattr(model, "clef_head", None)
    with torch.no_grad():
        embedded = model.embed_input_ids(ids)
        lexical = lexical_rows(model, ids)
    return {
        "pid": os.getpid(),
        "model_class": type(model).__name__,
        "model_mro": [c.__name__ for c in type(model).__mro__],
        "embed": _describe(embed),
        "lm_head": _describe(lm_head),
        "vocab_float_tensors": vocab_float,
        "embedded": embedded.float().tolist(),
        "embedded_dtype": str(embedded.dtype),
        "lexical": lexical.float().tolist(),
        "lexical_dtype": str(lexical.dtype),
        "head": None if head is None else {"class": type(head).__name__,
                                            "config": dict(getattr(head, "clef_config", None) or vars(head))},
        "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
        "quant_methods": sorted({type(getattr(m, "quant_method", None)).__name__ for m in model.modules()
                                 if getattr(m, "quant_method", None) is not None}),
    }


def parameter(model: torch.nn.Module, name: str) -> dict[str, Any]:
    """One parameter's dtype, shape and values (float), by vLLM name."""
    p = dict(model.named_parameters())[name]
    return {"dtype": str(p.dtype), "shape": list(p.shape), "values": p.detach().float().flatten().tolist(),
            "nan": int(torch.isnan(p.detach().float()).sum())}


def check_costs(model: torch.nn.Module, root: str, plugin_version: str, repeat: int = 5) -> dict[str, Any]:
    """Seconds the plugin's checks take in the worker, on this model's real parameters.

    ``gate``: ``check_checkpoint`` (what the model's constructor runs), hashing every file against its
    download reference with nothing remembered from the call before; ``gate_unhashed``: the same with
    ``check_references=False`` (the opt-out), nothing remembered either; ``gate_again``: a later call in
    the same process with nothing changed (what the plugin's later calls in one start cost). ``arm`` / ``check``:
    ``WriteTracker`` over copies of every parameter (arming is destructive, so it runs on copies
    held by a plain module; same dtypes, shapes and bytes). Each the best of ``repeat``.
    """
    import time

    from clef_format import vllm as hooks
    from clef_format.vllm.content import forget_verified

    def best(fn: Any) -> float:
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    holder = torch.nn.Module()
    for i, (_, p) in enumerate(model.named_parameters()):
        holder.register_parameter(f"p{i}", torch.nn.Parameter(p.detach().clone(), requires_grad=False))
    tracker = hooks.WriteTracker(holder)
    return {
        "gate": best(lambda: (forget_verified(), hooks.check_checkpoint(root, plugin_version, check_references=True))),
        "gate_unhashed": best(lambda: (forget_verified(),
                                       hooks.check_checkpoint(root, plugin_version, check_references=False))),
        "gate_again": best(lambda: hooks.check_checkpoint(root, plugin_version)),  # files proven: remembered
        "arm": best(tracker.arm),
        "check": best(tracker.unwritten),
        "params": sum(p.numel() for p in holder.parameters()),
        "param_bytes": sum(p.numel() * p.element_size() for p in holder.parameters()),
    }
