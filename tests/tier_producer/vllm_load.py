"""The oracle of the producer tier: what vLLM itself does with one checkpoint, on the CPU.

vLLM's own model class is built on the CPU device (``initialize_model``), its own ``load_weights``
runs over every tensor of the backbone files, then its own ``process_weights_after_loading``.
Every log record of level WARNING or above from vLLM's loggers and every Python warning is
captured. Whether each parameter was written is judged by clef_format's ``WriteTracker`` (each
parameter filled with a sentinel before loading; vLLM's own KV-cache scale defaults exempt).

The only thing replaced is what has no CPU implementation in the CUDA wheel (see ``cpu_kernels``):
the GEMM kernels a scheme selects. Nothing of clef_format's rules is used.
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

from clef_format.vllm import WriteTracker
from clef_format.vllm_rules import matching as R
from tests.tier_vllm import hooks_support as hs
from tests.tier_vllm import oracle

VERSION = oracle.VERSION
UNQUANTIZED = "unquantized"
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")


@dataclass
class Outcome:
    """What vLLM did with a checkpoint. ``stage``: where it raised (config, build, load, process) or None."""

    stage: str | None = None
    error: str | None = None
    loaded: int = 0  # tensors vLLM's load_weights consumed
    unwritten: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    layers: dict[str, Any] = field(default_factory=dict)  # the per-layer view in the tool's terms

    @property
    def ok(self) -> bool:
        return self.stage is None and not self.unwritten and not self.warnings

    def summary(self) -> str:
        if self.stage is not None:
            return f"{self.stage} error: {self.error}"
        parts = []
        if self.unwritten:
            parts.append(f"{len(self.unwritten)} parameter(s) not written, e.g. {next(iter(self.unwritten.items()))}")
        parts += [f"warning: {w}" for w in self.warnings]
        return "; ".join(parts) or "loaded cleanly"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.name}: {record.getMessage()}")


@contextlib.contextmanager
def captured() -> Iterator[list[str]]:
    """Every vLLM log record >= WARNING and every Python warning raised inside, as text."""
    handler = _Records()
    logger = logging.getLogger("vllm")
    logger.addHandler(handler)
    with contextlib.suppress(Exception):  # vLLM's warning_once remembers messages per process
        from vllm import logger as vlog

        for fn in vars(vlog).values():
            if hasattr(fn, "cache_clear"):
                fn.cache_clear()
    out: list[str] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield out
    finally:
        logger.removeHandler(handler)
    out.extend(handler.messages)
    out.extend(f"{w.category.__name__}: {w.message}" for w in caught)


def _label(module: torch.nn.Module) -> str | None:
    """The scheme vLLM built for a linear layer, in the tool's terms (None: not a quantizable layer)."""
    method = getattr(module, "quant_method", None)
    if method is None:
        return None
    name = type(method).__name__
    if name == "UnquantizedLinearMethod" or name == "UnquantizedEmbeddingMethod":
        return UNQUANTIZED
    scheme = getattr(module, "scheme", None)
    if scheme is None:
        return f"?{name}"
    cls = type(scheme).__name__
    if getattr(scheme, "use_a16", False) or cls == "CompressedTensorsW4A16Fp4":
        return R.NVFP4_W4A16
    return R.VLLM_SCHEME_CLASSES.get(cls, cls)


def layer_view(model: torch.nn.Module) -> dict[str, Any]:
    """``{"rows": {index: {group: label}}, "vision": label(s), "lm_head": label}`` as vLLM built them."""
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    rows: dict[int, dict[str, str]] = {}
    vision: set[str] = set()
    lm_head = None
    for name, module in model.named_modules():
        if isinstance(module, ParallelLMHead):
            lm_head = _label(module) or UNQUANTIZED
            continue
        if not isinstance(module, LinearBase):
            continue
        label = _label(module) or UNQUANTIZED
        if "visual" in name.split("."):
            vision.add(label)
            continue
        m = _LAYER.search(name)
        if m:
            rows.setdefault(int(m.group(1)), {})[m.group(2)] = label
    return {"rows": rows, "vision": sorted(vision), "lm_head": lm_head}


def _tensors(root: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for path in sorted(root.glob("*.safetensors")):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def load(root: Path) -> Outcome:
    """Build, load and post-process ``root`` with vLLM on the CPU; never raises for vLLM's own errors."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    out = Outcome()
    with captured() as messages:
        stage = "config"
        try:
            cfg = hs.engine_config(root)
            hs.ensure_distributed(cfg)
            stage = "build"
            with cpu_kernels():
                model = hs.build_model(cfg)
                out.layers = layer_view(model)
                tracker = WriteTracker(model).arm()
                stage = "load"
                with set_current_vllm_config(cfg):
                    loaded = model.load_weights(_tensors(root))
                out.loaded = len(loaded or ())
                out.unwritten = tracker.unwritten()
                stage = "process"
                with set_current_vllm_config(cfg):
                    process_weights_after_loading(model, cfg.model_config, torch.device("cpu"))
            stage = None
        except Exception as e:  # vLLM's refusal, in whatever form it takes: the oracle's verdict
            out.stage, out.error = stage, f"{type(e).__name__}: {str(e)[:300]}"
    out.warnings = [m for m in messages if not _environment_noise(m)]
    return out


#: Messages about this machine, not about the checkpoint (set by ``calibrate_noise`` from a BF16 load).
NOISE: set[str] = set()


def _environment_noise(message: str) -> bool:
    return message in NOISE


def calibrate_noise(root: Path) -> Outcome:
    """Load the unquantized output: whatever vLLM says about it is about the machine; remember it."""
    NOISE.clear()
    result = load(root)
    NOISE.update(result.warnings)
    result.warnings = []
    return result


@contextlib.contextmanager
def cpu_kernels() -> Iterator[None]:
    """Stand-ins for the GEMM kernels that the CUDA wheel has no CPU implementation of."""
    yield
