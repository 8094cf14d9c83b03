"""The joint schema head: built from the checked config, fed with lexical rows of ``lm_head``."""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

import torch

from clef_format import vllm as hooks

from . import PLUGIN_VERSION

#: the reference code every Clef checkpoint ships at its root, and the head's weights
HEAD_CODE = "joint_schema_model.py"
HEAD_WEIGHTS = "clef_head/joint_head.safetensors"


def _head_class(root: str) -> type:
    """``JointSchemaHead`` from the checkpoint's own reference code."""
    path = os.path.join(root, HEAD_CODE)
    spec = importlib.util.spec_from_file_location("joint_schema_model", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("joint_schema_model", module)
    spec.loader.exec_module(module)
    return module.JointSchemaHead


def build_head(source: str) -> Any:
    """``JointSchemaHead(**config)`` with the head file's weights: the pair is checked again and the marker
    removed by the hook, and the file is checked against this very class before a strict load."""
    from safetensors.torch import load_file

    from .model import on_refusal  # None in the shipped build: every refusal raises

    ck = hooks.gate_or_report(source, PLUGIN_VERSION, on_refusal("head"))
    cls = _head_class(ck.root)
    hooks.check_plugin_head(ck, PLUGIN_VERSION, cls, on_refusal("head"))  # the head file is exactly what this head loads
    config = hooks.head_config(ck, PLUGIN_VERSION, on_refusal("head"))
    head = cls(**config)
    head.load_state_dict(load_file(os.path.join(ck.root, HEAD_WEIGHTS)), strict=True)
    head.clef_config = config  # what it was built from, for the engine probes
    return head


def _lm_head(model: torch.nn.Module) -> torch.nn.Module:
    lm = getattr(model, "language_model", model)
    return lm.lm_head


def lexical_rows(model: torch.nn.Module, token_ids: torch.Tensor) -> torch.Tensor:
    """The rows of ``lm_head`` for ``token_ids`` (shape ``ids.shape + (hidden,)``).

    Layout 2 (plugin >= 0.2.0): gathered from the int8 table and decoded (this rank's shard,
    all-reduced under tensor parallelism). Layout 1 (plugin 0.1.x): rows of vLLM's BF16
    ``lm_head.weight``, as plugin 0.1.0 reads them (single GPU only: that weight is vocab-sharded).
    """
    head = _lm_head(model)
    if isinstance(head, hooks.Int8VocabEmbedding):
        return head.rows(token_ids)
    return head.weight[token_ids]


def lexical_vectors(model: torch.nn.Module, option_token_ids: torch.Tensor) -> torch.Tensor:
    """Per option, the mean of its tokens' lexical rows: ``[..., tokens] -> [..., hidden]``."""
    return lexical_rows(model, option_token_ids).mean(dim=-2)
