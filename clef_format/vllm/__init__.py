"""Serving hooks for a clef-vllm plugin: the only part of clef-format that touches vLLM.

Importing this package imports neither vllm nor torch: each hook is loaded from its submodule on
first use (PEP 562 ``__getattr__``), and only ``install`` imports vllm, inside the functions that
need vLLM's tensor-parallel group. See docs/HOOKS.md for where a plugin calls each hook.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    # gate.py: the serving gate at start-up (no torch)
    "check_checkpoint": "gate",
    "CheckpointSource": "gate",
    "gate_or_report": "gate",
    # head.py: the joint head config for a plugin version (no torch); the head file against the
    # plugin's own head (torch's meta device)
    "head_config": "head",
    "check_plugin_head": "head",
    "plugin_head_shapes": "head",
    # weights.py: the checked backbone iterator (torch only while iterating)
    "backbone_weights": "weights",
    "skipped_tensors": "weights",
    # int8_tables.py: int8 tables on a device, dequantized on gather
    "Int8VocabEmbedding": "int8_tables",
    "Int8Tables": "int8_tables",
    "load_int8_tables": "int8_tables",
    "shard_range": "int8_tables",
    # completeness.py: every parameter written, or an error naming those that were not
    "WriteTracker": "completeness",
    "UnwrittenParametersError": "completeness",
    # install.py: putting the tables into a vLLM Qwen3.5 model; the one-call load hook
    "install_int8_tables": "install",
    "load_weights": "install",
    "vllm_tensor_parallel": "install",
    # int8_gather.py: the fused dequantize-on-gather kernel
    "gather_rows": "int8_gather",
    "gather_rows_shard": "int8_gather",
}

__all__ = sorted(_EXPORTS) + ["IncompatibleError"]


def __getattr__(name: str) -> Any:
    if name == "IncompatibleError":
        from clef_format.errors import IncompatibleError

        return IncompatibleError
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
