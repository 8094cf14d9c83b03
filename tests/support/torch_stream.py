"""The streaming form of the torch reference (``torch_int8``): same arithmetic, preallocated buffers, fused quality.

``quantize_rows`` + ``QualityMeter.add`` allocate several full-size float32 temporaries per call;
on a 248320 x 4096 table that is page-fault bound (about 10x slower than this on the 2-core
machines). ``RowQuantizer`` reuses two float32 buffers of one block and derives every quality
figure from three row dot products. The tests check it bit-identical to ``quantize_rows`` and
its figures equal to ``QualityMeter``'s.
"""

from __future__ import annotations

import torch

from tests.support.torch_int8 import NonFiniteRows, QualityMeter
from clef_format.spec.tables_format import QMAX

#: Rows per block: 512 x 4096 float32 = 8 MiB per buffer, small enough to stay near the caches.
BLOCK_ROWS = 512


class RowQuantizer:
    """Quantize one table block by block, accumulating its quality figures."""

    def __init__(self, hidden: int, block_rows: int = BLOCK_ROWS) -> None:
        self.hidden = hidden
        self.x = torch.empty(block_rows, hidden, dtype=torch.float32)
        self.d = torch.empty(block_rows, hidden, dtype=torch.float32)
        self.q = torch.empty(block_rows, hidden, dtype=torch.int8)
        self.meter = QualityMeter()

    def block(self, rows: torch.Tensor, first_row: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Quantize ``[r, hidden]`` rows: (I8 view valid until the next call, F32 ``[r, 1]`` scales)."""
        r = rows.shape[0]
        x, d, q = self.x[:r], self.d[:r], self.q[:r]
        x.copy_(rows)
        amax = torch.maximum(x.amax(dim=1, keepdim=True), x.amin(dim=1, keepdim=True).neg_())  # NaN/Inf propagate
        finite = torch.isfinite(amax)
        if not bool(finite.all()):
            raise NonFiniteRows([first_row + i for i in torch.nonzero(~finite.flatten()).flatten().tolist()])
        scale = amax / QMAX
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        torch.div(x, safe, out=d)
        d.round_()  # |x / scale| <= 127 (+1 ulp) by construction: round never passes 127, no clamp pass needed
        q.copy_(d)
        # quality from three row norms: |x|, |y| (decoded) and |y - x|
        ny = torch.linalg.vector_norm(d, dim=1).double() * scale.flatten().double()  # |q| * scale = |decoded|
        torch.addcmul(x, d, scale, value=-1, out=d)  # x - decoded: one pass, its norm is the error
        self.meter.add_norms(torch.linalg.vector_norm(x, dim=1).double(), ny, torch.linalg.vector_norm(d, dim=1).double())
        return q, scale

    def figures(self) -> dict[str, float]:
        return self.meter.figures()
