"""Putting the hooks into a vLLM Qwen3.5 model: the int8 tables, and the one-call load hook.

The only module of clef-format that imports vllm, and only inside ``vllm_tensor_parallel`` (when
vLLM's model-parallel groups exist, i.e. inside a vLLM worker).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import torch

from clef_format.spec.layouts import Layout
from clef_format.vllm.completeness import WriteTracker
from clef_format.vllm.gate import CheckpointSource, OnRefusal, gate_or_report
from clef_format.vllm.int8_tables import AllReduce, Int8Tables, load_int8_tables
from clef_format.vllm.weights import skipped_tensors, stream_backbone

#: Where vLLM's Qwen3.5 classes keep the two tables: multimodal first, then text-only.
EMBED_PATHS = ("language_model.model.embed_tokens", "model.embed_tokens")
LM_HEAD_PATHS = ("language_model.lm_head", "lm_head")


def vllm_tensor_parallel() -> tuple[int, int, Optional[AllReduce]]:
    """(rank, size, all_reduce) of vLLM's tensor-parallel group; (0, 1, None) outside vLLM."""
    import sys

    if "vllm" not in sys.modules:  # never import vllm just to learn there is no group
        return 0, 1, None
    from vllm.distributed import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return 0, 1, None
    from vllm.distributed import tensor_model_parallel_all_reduce

    return ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size(), tensor_model_parallel_all_reduce


def _find(model: torch.nn.Module, paths: tuple[str, ...]) -> Optional[str]:
    names = dict(model.named_modules())
    return next((p for p in paths if p in names), None)


def install_int8_tables(model: torch.nn.Module, tables: Int8Tables, replace_lm_head: bool = True) -> dict[str, str]:
    """Replace ``embed_tokens`` (and ``lm_head``) of a vLLM Qwen3.5 model with the int8 modules.

    Returns {module path: what now sits there}. The BF16 parameters they replace are dropped, so
    their memory is freed and vLLM's loader has nothing there to leave unwritten. With
    ``replace_lm_head`` the lexical rows are ``model...lm_head.rows(ids)``; full-vocabulary logits
    (``compute_logits``) are then not available: the Clef head never computes them.
    """
    targets = [(EMBED_PATHS, tables.embed)] + ([(LM_HEAD_PATHS, tables.lexical)] if replace_lm_head else [])
    done: dict[str, str] = {}
    for paths, module in targets:
        path = _find(model, paths)
        if path is None:
            raise LookupError(f"{type(model).__name__} has none of {paths}: not a vLLM Qwen3.5 model")
        parent_path, _, attr = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        setattr(parent, attr, module)
        done[path] = type(module).__name__
    return done


def load_weights(model: torch.nn.Module, source: CheckpointSource, plugin_version: str,
                 load: Callable[[Iterable[tuple[str, torch.Tensor]]], Any], *,
                 tensor_parallel: Optional[tuple[int, int, Optional[AllReduce]]] = None,
                 exempt: Optional[Callable[[str], bool]] = None, replace_lm_head: bool = True,
                 on_refusal: OnRefusal = None) -> set[str]:
    """The whole load, checked: what a plugin's ``Model.load_weights`` calls instead of vLLM's body.

    ``load`` is vLLM's own ``load_weights`` of the model class (``super().load_weights``). In order:
    the pair and the files are checked (a refusal raises before any weight is read); for layout 2
    the int8 tables are read onto the model's device (this rank's shard) and installed; every
    parameter is armed; vLLM loads the checked backbone iterator; then anything left unwritten
    raises ``UnwrittenParametersError``. Returns the names vLLM's loader expects back.
    ``on_refusal``: see ``gate.gate_or_report`` (a refusal handed over, the load carried on: tests only).
    """
    ck = gate_or_report(source, plugin_version, on_refusal)
    tables: Optional[Int8Tables] = None
    if ck.layout is Layout.LAYOUT_2:
        rank, size, reduce = tensor_parallel or vllm_tensor_parallel()
        first = next(model.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
        dtype = first.dtype if first is not None and first.dtype.is_floating_point else torch.bfloat16
        tables = load_int8_tables(ck, device, rank, size, out_dtype=dtype, all_reduce=reduce)
        install_int8_tables(model, tables, replace_lm_head=replace_lm_head)
    tracker = WriteTracker(model, exempt).arm()
    loaded = load(tracker.record(stream_backbone(ck, skipped_tensors(ck))))
    tracker.check(loaded)
    names = set(loaded) if loaded is not None else set(tracker.params)
    return names
