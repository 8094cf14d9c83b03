"""Did loading write every parameter? Decided from the parameters' storage, not from names.

vLLM's own check ("Following weights were not initialized from checkpoint") runs only for
unquantized models and exempts every module with a ``quant_method``: all linear layers and
embeddings (../shared/reference/vllm-integration.md, "Loading"). Name tracking alone would not
close the gap either: a fused parameter (``in_proj_qkvz`` = ``in_proj_qkv`` + ``in_proj_z``) is
reported loaded as soon as one of its shards is.

So before loading, every parameter is filled with a sentinel, and afterwards any sentinel left is
an element nothing wrote: floating parameters get NaN (checked element by element); integer and
float8 ones (e.g. NVFP4 ``weight_packed``) get a byte pattern and a row still entirely that
pattern counts as unwritten (a real row of packed FP4 all -6.0, or int8 -128 which symmetric
quantization never produces, is not a checkpoint). The fill is destructive on purpose: a
parameter that loading does not write raises here instead of serving whatever it held.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, Iterator, Optional

import torch

#: Parameters a checkpoint may legitimately lack: vLLM's KV-cache and activation scales keep
#: their constructed defaults when absent, and so do the KV-cache zero points that vLLM's
#: compressed-tensors attention layers create as placeholders (unused: symmetric only).
DEFAULT_EXEMPT = re.compile(r"(^|\.)(k_scale|v_scale|q_scale|prob_scale|k_zero_point|v_zero_point|q_zero_point)$")

_FLOAT = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_BYTE_SENTINEL = {torch.uint8: 0xFF, torch.int8: 0x80}  # uint8: two FP4 -6.0; int8: -128


class UnwrittenParametersError(RuntimeError):
    """Loading left parameters (or parts of them) unwritten; ``unwritten`` maps name -> what is missing."""

    def __init__(self, unwritten: dict[str, str]) -> None:
        lines = "\n".join(f"  {name}: {what}" for name, what in unwritten.items())
        super().__init__(f"{len(unwritten)} parameter(s) were not written from the checkpoint; serving would use "
                         f"uninitialized memory:\n{lines}\n  fix: run clef-format verify on the checkpoint and "
                         "re-download what it reports")
        self.unwritten = unwritten


def _fill(p: torch.Tensor) -> None:
    data = p.data
    if data.dtype in _FLOAT:
        data.fill_(float("nan"))
    elif data.element_size() == 1:  # uint8, int8, float8_*: 0xFF is NaN for both float8 formats
        data.view(torch.uint8).fill_(_BYTE_SENTINEL.get(data.dtype, 0xFF))
    elif data.dtype == torch.bool:
        data.fill_(True)
    else:
        data.fill_(torch.iinfo(data.dtype).min)


def _sentinel_mask(p: torch.Tensor) -> torch.Tensor:
    """Elements still holding the sentinel."""
    data = p.data
    if data.dtype in _FLOAT:
        return torch.isnan(data)
    if data.element_size() == 1:
        return data.view(torch.uint8) == _BYTE_SENTINEL.get(data.dtype, 0xFF)
    if data.dtype == torch.bool:
        return data.clone()
    return data == torch.iinfo(data.dtype).min


def _unwritten(p: torch.Tensor) -> Optional[str]:
    """What of ``p`` nothing wrote, in words; ``None`` when all of it was written."""
    mask = _sentinel_mask(p)
    if p.data.dtype in _FLOAT:
        left = int(mask.sum())
        if not left:
            return None
        return "never written" if left == mask.numel() else f"{left} of {mask.numel()} elements not written"
    rows = mask.reshape(mask.shape[0], -1).all(dim=1) if mask.dim() >= 2 else mask.reshape(1, -1).all(dim=1)
    left = int(rows.sum())
    if not left:
        return None
    return "never written" if left == rows.numel() else f"{left} of {rows.numel()} rows not written"


class WriteTracker:
    """Arm before loading, ``check`` after: every parameter of ``model`` must have been written.

    ``exempt(name)`` names parameters a checkpoint may lack (default: vLLM's KV-cache scales).
    Buffers are not tracked: the int8 tables are buffers the hooks fill themselves.
    """

    def __init__(self, model: torch.nn.Module, exempt: Optional[Callable[[str], bool]] = None) -> None:
        is_exempt = exempt or (lambda name: bool(DEFAULT_EXEMPT.search(name)))
        self.params: dict[str, torch.Tensor] = {
            name: p for name, p in model.named_parameters() if not is_exempt(name)}
        self.armed = False
        self.yielded: list[str] = []

    def arm(self) -> "WriteTracker":
        """Fill every tracked parameter with its sentinel (call right before loading)."""
        with torch.no_grad():
            for p in self.params.values():
                _fill(p)
        self.armed = True
        return self

    def record(self, weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """Pass ``weights`` through, remembering the checkpoint names (for the error message)."""
        for name, tensor in weights:
            self.yielded.append(name)
            yield name, tensor

    def unwritten(self) -> dict[str, str]:
        """Parameter name -> what was not written, for every incompletely written parameter."""
        if not self.armed:
            raise RuntimeError("WriteTracker.arm() must run before the weights are loaded")
        out: dict[str, str] = {}
        with torch.no_grad():
            for name, p in self.params.items():
                what = _unwritten(p)
                if what is not None:
                    out[name] = what
        return out

    def check(self, loaded: Optional[Iterable[str]] = None) -> None:
        """Raise ``UnwrittenParametersError`` unless every tracked parameter was written in full.

        ``loaded``: the names ``model.load_weights`` returned; only used to say in the message
        that vLLM counted a parameter as loaded although part of it was never written.
        """
        missing = self.unwritten()
        if not missing:
            return
        reported = set(loaded or ())
        if reported:
            missing = {name: what + (" (vLLM reported it loaded)" if name in reported else "")
                       for name, what in missing.items()}
        raise UnwrittenParametersError(missing)
