"""Int8 per-row quantization of the tables (the arithmetic of ``tables_format``), streamed by row block.

The tests' reference (torch): the package's ``clef_format.quant.int8`` (numpy, what migrate and the
fixture builders run) is proven bit-identical to it by tests/quant/test_int8.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from clef_format.errors import NonFiniteRows
from clef_format.quant.int8 import QualityMeter as _NumpyMeter
from clef_format.spec.tables_format import QMAX


def quantize_rows(block: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a ``[rows, hidden]`` block: returns (I8 values, F32 ``[rows, 1]`` scales)."""
    x = block.float()
    finite = torch.isfinite(x).all(dim=1)
    if not bool(finite.all()):
        raise NonFiniteRows(torch.nonzero(~finite).flatten().tolist())
    amax = x.abs().amax(dim=1, keepdim=True)
    scale = amax / QMAX
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(x / safe).clamp_(-QMAX, QMAX).to(torch.int8)
    return q, scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode rows: ``q * scale`` in float32, cast to ``dtype``."""
    return (q.float() * scale.float()).to(dtype)


@dataclass
class QualityMeter:
    """Error figures of one table, accumulated block by block (bounded memory)."""

    err_sq: float = 0.0
    ref_sq: float = 0.0
    cos_sum: float = 0.0
    cos_min: float = 1.0
    row_rel_max: float = 0.0
    rows: int = 0
    _nonzero_rows: int = field(default=0, repr=False)

    def add(self, ref: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> None:
        """Account one block: the reference rows and their quantized form."""
        x = ref.float()
        y = dequantize_rows(q, scale)
        norm = torch.linalg.vector_norm
        self.add_norms(norm(x, dim=1).double(), norm(y, dim=1).double(), norm(x - y, dim=1).double())

    def add_norms(self, nx: torch.Tensor, ny: torch.Tensor, nd: torch.Tensor) -> None:
        """Account rows from three norms per row: ``|x|``, ``|y|`` (decoded) and ``|x - y|``.

        ``cos = 1 - (|d|^2 - (|x| - |y|)^2) / (2 |x| |y|)`` in float64: well conditioned near 1,
        unlike ``x.y / (|x| |y|)`` in float32. The streaming quantizer feeds the same norms.
        """
        self.rows += nx.shape[0]
        dd, xx = nd * nd, nx * nx
        self.err_sq += float(dd.sum())
        self.ref_sq += float(xx.sum())
        nonzero = nx > 0
        if bool(nonzero.any()):
            nx, ny, dd, xx = nx[nonzero], ny[nonzero], dd[nonzero], xx[nonzero]
            denom = (2 * nx * ny).clamp_min(1e-300)
            cos = (1 - (dd - (nx - ny) ** 2).clamp_min(0) / denom).clamp(-1.0, 1.0)
            self.cos_sum += float(cos.sum())
            self.cos_min = min(self.cos_min, float(cos.min()))
            self.row_rel_max = max(self.row_rel_max, math.sqrt(float((dd / xx).max())))
            self._nonzero_rows += int(nonzero.sum())

    #: The figures are computed once, by the numpy meter migrate uses (same accumulator fields).
    figures = _NumpyMeter.figures
