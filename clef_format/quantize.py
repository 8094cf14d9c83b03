"""Int8 per-row quantization of the tables (the arithmetic of ``tables_format``), streamed by row block.

Imports torch: only migration, fixtures and the serving hooks use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .tables_format import QMAX


class NonFiniteRows(ValueError):
    """The source table has NaN or infinite values; quantizing it would hide that."""

    def __init__(self, rows: list[int]) -> None:
        super().__init__(f"{len(rows)} row(s) hold NaN or Inf, first: {rows[:5]}")
        self.rows = rows


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
        x = ref.float()
        y = dequantize_rows(q, scale)
        diff = x - y
        row_err = diff.pow(2).sum(dim=1)
        row_ref = x.pow(2).sum(dim=1)
        self.err_sq += float(row_err.sum(dtype=torch.float64))
        self.ref_sq += float(row_ref.sum(dtype=torch.float64))
        nonzero = row_ref > 0
        if bool(nonzero.any()):
            cos = torch.nn.functional.cosine_similarity(x[nonzero], y[nonzero], dim=1)
            self.cos_sum += float(cos.sum(dtype=torch.float64))
            self.cos_min = min(self.cos_min, float(cos.min()))
            rel = (row_err[nonzero] / row_ref[nonzero]).sqrt()
            self.row_rel_max = max(self.row_rel_max, float(rel.max()))
            self._nonzero_rows += int(nonzero.sum())
        self.rows += x.shape[0]

    def figures(self) -> dict[str, float]:
        rel = math.sqrt(self.err_sq / self.ref_sq) if self.ref_sq > 0 else 0.0
        mean_cos = self.cos_sum / self._nonzero_rows if self._nonzero_rows else 1.0
        return {
            "rel_error": round(rel, 6),
            "mean_row_cosine": round(mean_cos, 7),
            "min_row_cosine": round(self.cos_min, 7),
            "max_row_rel_error": round(self.row_rel_max, 6),
            "rows": self.rows,
        }
