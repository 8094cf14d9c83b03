"""The backbone weights iterator a plugin hands to vLLM's ``load_weights`` instead of vLLM's own.

It yields ``(name, tensor)`` pairs like vLLM's ``safetensors_weights_iterator`` (Hugging Face
names, CPU tensors read one at a time with ``safe_open``), after ``check_checkpoint`` has accepted
the pair. The checks run when the function is called, not on the first ``next()``: a refused
checkpoint never opens a weights file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from clef_format.spec.layouts import Layout
from clef_format.vllm.gate import CheckpointSource, check_checkpoint

if TYPE_CHECKING:
    import torch

    from clef_format.read.checkpoint import Checkpoint


def skipped_tensors(ck: "Checkpoint") -> frozenset[str]:
    """Backbone names the iterator never yields: in layout 2 the tables are the int8 modules' job."""
    return frozenset(ck.tables) if ck.layout is Layout.LAYOUT_2 else frozenset()


def backbone_weights(source: CheckpointSource, plugin_version: str) -> Iterator[tuple[str, "torch.Tensor"]]:
    """Checked backbone tensors for vLLM's ``model.load_weights``.

    Refuses layout-2-unmarked, layout-1 for a plugin that expects int8 tables (>= 0.2.0), and
    everything else ``check_checkpoint`` refuses, by raising ``IncompatibleError`` right here.
    """
    ck = check_checkpoint(source, plugin_version)
    return stream_backbone(ck, skipped_tensors(ck))


def stream_backbone(ck: "Checkpoint", skip: frozenset[str]) -> Iterator[tuple[str, "torch.Tensor"]]:
    """The backbone tensors of a checked checkpoint, file by file, except the names in ``skip``."""
    from safetensors import safe_open

    for rel in ck.backbone_files:
        with safe_open(ck.path(rel), framework="pt", device="cpu") as f:
            for name in f.keys():
                if name not in skip:
                    yield name, f.get_tensor(name)
