"""vLLM's Qwen3.5 classes with clef-format's checks around construction and loading.

Where each hook is called (docs/HOOKS.md in clef-format):

1. ``__init__``: ``check_checkpoint`` (the start-up gate) before vLLM allocates the model. An old
   plugin with new weights, an unmarked layout 2, a missing tables file ... stop the engine here
   with the finding code and the fix in the error.
2. ``load_weights``: ``clef_format.vllm.load_weights`` replaces vLLM's iterator by the checked
   one; in layout 2 it installs this rank's shard of the int8 tables in place of the BF16
   ``embed_tokens`` / ``lm_head``; every parameter is armed before loading and anything left
   unwritten raises (vLLM's own check does not look at linear layers or embeddings).
3. After loading, the joint head is built from ``head_config`` (``clef_vllm.head``).

With the int8 ``lm_head`` installed, vLLM's ``compute_logits`` (which multiplies by a BF16
weight) has no weight to use; ``compute_logits`` here decodes the int8 rows block by block
instead, so generation and log-probs work on layout 2 as well. (The Clef head itself only
gathers rows: ``clef_vllm.head.lexical_rows``.)
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
from vllm.logger import init_logger
from vllm.model_executor.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration

from clef_format import vllm as hooks

from . import GATED, PLUGIN_VERSION
from .head import build_head

logger = init_logger(__name__)

#: what the log says for each refusal the ungated build carries on past (the engine tier greps it)
UNGATED_REFUSAL = "clef-vllm ungated build: refused and served anyway"


def on_refusal(where: str) -> Any:
    """``None`` (refusals raise) in the shipped build; in the ungated build, a handler that logs the
    refusal and lets the hook carry on (``hooks.gate_or_report``)."""
    if GATED:
        return None

    def log(exc: Exception) -> None:
        logger.warning("%s (%s): %s", UNGATED_REFUSAL, where, exc)

    return log

#: rows of the int8 lm_head decoded at a time when computing full-vocabulary logits
LOGITS_BLOCK_ROWS = 16384


def int8_logits(lm_head: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """``hidden_states @ decoded(lm_head).T``, decoding ``LOGITS_BLOCK_ROWS`` rows at a time."""
    vocab = lm_head.num_embeddings
    parts = []
    for start in range(0, vocab, LOGITS_BLOCK_ROWS):
        ids = torch.arange(start, min(start + LOGITS_BLOCK_ROWS, vocab), device=hidden_states.device)
        rows = lm_head.rows(ids).to(hidden_states.dtype)
        parts.append(torch.nn.functional.linear(hidden_states, rows))
    return torch.cat(parts, dim=-1)


class _ClefChecked:
    """What both classes add: the gate, the checked load, the head, int8-aware logits."""

    clef_root: str
    clef_head: Any

    def _clef_gate(self, vllm_config: Any) -> str:
        root = vllm_config.model_config.model  # a directory, or a repo id in the HF cache
        # raises IncompatibleError(code, reason, fix); the ungated build logs it and carries on
        ck = hooks.gate_or_report(root, PLUGIN_VERSION, on_refusal("start-up gate"))
        logger.info("clef-vllm %s: serving %s (%s)", PLUGIN_VERSION, ck.root, ck.layout.value)
        return root

    def _clef_language_model(self) -> torch.nn.Module:
        return self  # type: ignore[return-value]

    def _clef_load(self, load: Any) -> set[str]:
        loaded = hooks.load_weights(self, self.clef_root, PLUGIN_VERSION, load, on_refusal=on_refusal("load_weights"))
        self.clef_head = build_head(self.clef_root)  # a submodule: its weights come from its own file
        return loaded | {f"clef_head.{name}" for name, _ in self.clef_head.named_parameters()}

    def _clef_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        lm_head = getattr(self._clef_language_model(), "lm_head", None)
        if isinstance(lm_head, hooks.Int8VocabEmbedding):
            return int8_logits(lm_head, hidden_states)
        return None


class ClefQwen3_5ForConditionalGeneration(_ClefChecked, Qwen3_5ForConditionalGeneration):
    """The architecture Clef checkpoints name (vision tower + language model)."""

    def __init__(self, *, vllm_config: Any, prefix: str = "model") -> None:
        root = self._clef_gate(vllm_config)  # before vLLM allocates anything
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.clef_root = root

    def _clef_language_model(self) -> torch.nn.Module:
        return self.language_model

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        # vLLM's own iterator (``weights``) is dropped: the hooks stream the checked backbone
        return self._clef_load(super().load_weights)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        logits = self._clef_logits(hidden_states)
        return logits if logits is not None else super().compute_logits(hidden_states)

    def compute_logits_local(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = self._clef_logits(hidden_states)
        return logits if logits is not None else super().compute_logits_local(hidden_states)


class ClefQwen3_5ForCausalLM(_ClefChecked, Qwen3_5ForCausalLM):
    """Text-only checkpoints (``Qwen3_5ForCausalLM``)."""

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        root = self._clef_gate(vllm_config)
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.clef_root = root

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return self._clef_load(super().load_weights)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        logits = self._clef_logits(hidden_states)
        return logits if logits is not None else super().compute_logits(hidden_states)

    def compute_logits_local(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = self._clef_logits(hidden_states)
        return logits if logits is not None else super().compute_logits_local(hidden_states)
