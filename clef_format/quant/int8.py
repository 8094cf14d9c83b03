"""Int8 per-row quantization of the tables in numpy, bit-identical to torch's arithmetic.

The arithmetic of ``tables_format``, without torch: migrate uses it, so a light install (numpy and
the standard library) can migrate at copy speed. Source rows arrive as their raw bits, the way
they lie in a safetensors file:

* ``BF16``: ``uint16`` bit patterns, widened to float32 exactly (``bits << 16``);
* ``F16``: ``float16`` (or its ``uint16`` bits), widened by numpy's exact conversion;
* ``F32``: ``float32`` (or its ``uint32`` bits).

Per row: ``amax = max|x|``, ``scale = amax / 127`` (float32), ``q = round_half_even(x / scale)``
clamped to [-127, 127] (the same float32 division as torch; a zero row has scale 0 and q 0).
Rows holding NaN or Inf are refused with ``NonFiniteRows``. Decoding is ``q * scale`` in float32,
cast to the target dtype the way torch's CPU kernels cast it (``f32_to_bf16``, ``f32_to_f16``).

``amax`` and the non-finite test are computed on the sign-cleared bit patterns: for IEEE floats
of one sign the bit patterns order as the values do, and NaN/Inf are exactly the patterns at or
above the exponent-all-ones one. That is exact, and it reads half the bytes for BF16.

``RowQuantizer`` / ``RowDecoder`` are the streaming forms: preallocated buffers of one block,
reused for every block (no full-size temporaries), every quality figure from three row norms.
tests/quant/test_int8.py proves all of it bit-identical to the torch reference (``tests/support/torch_int8.py``).
"""

from __future__ import annotations

import math
import sys

import numpy as np

from clef_format.errors import NonFiniteRows
from clef_format.spec.tables_format import QMAX, SOURCE_DTYPES  # the table dtypes: one home, the format

#: Rows per compute block: 64 x 4096 float32 = 1 MiB per scratch buffer, near the core's caches.
BLOCK_ROWS = 64

# per source dtype: (bits dtype, sign-clearing mask, first non-finite pattern)
_BITS = {"BF16": (np.uint16, 0x7FFF, 0x7F80), "F16": (np.uint16, 0x7FFF, 0x7C00),
         "F32": (np.uint32, 0x7FFFFFFF, 0x7F800000)}
_ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4}
_QMAX32 = np.float32(QMAX)
_TINY32 = np.finfo(np.float32).tiny  # smallest normal float32
_LITTLE = sys.byteorder == "little"
#: What torch's vectorised CPU cast (the one a contiguous tensor takes) makes of a float32 NaN.
BF16_NAN = 0xFFFF


def itemsize(dtype: str) -> int:
    """Bytes per element of a source dtype."""
    return _ITEMSIZE[dtype]


def _check_dtype(dtype: str) -> None:
    if dtype not in _BITS:
        raise ValueError(f"unsupported table dtype {dtype!r} (expected one of {', '.join(SOURCE_DTYPES)})")


def _bits(raw: np.ndarray, dtype: str) -> np.ndarray:
    _check_dtype(dtype)
    want = _BITS[dtype][0]
    if raw.dtype.itemsize != np.dtype(want).itemsize:
        raise TypeError(f"{dtype} rows must be {np.dtype(want).itemsize}-byte elements, got {raw.dtype}")
    return raw.view(want)


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """BF16 bit patterns (``uint16``) -> float32, exactly."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray, out: np.ndarray | None = None, scratch: np.ndarray | None = None,
                may_hold_nan: bool = True) -> np.ndarray:
    """float32 -> BF16 bit patterns (``uint16``), round to nearest even, as torch's CPU cast.

    ``(u + 0x7FFF + ((u >> 16) & 1)) >> 16`` on the float32 bits ``u``: overflow goes to Inf,
    denormals round like any other value, and NaN becomes ``BF16_NAN`` (torch's vectorised kernel;
    its scalar constructor would give 0x7FC0, but a contiguous tensor never takes that path).
    ``out`` (``uint16``) and ``scratch`` (``uint32``), when given, have ``x``'s shape;
    ``may_hold_nan=False`` (the caller knows there is none) skips the NaN pass.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    t = np.empty(x.shape, np.uint32) if scratch is None else scratch
    np.right_shift(u, 16, out=t)
    np.bitwise_and(t, 1, out=t)
    np.add(t, 0x7FFF, out=t)
    np.add(t, u, out=t)  # wraps only for negative NaN patterns, replaced below
    np.right_shift(t, 16, out=t)
    out = np.empty(x.shape, np.uint16) if out is None else out
    np.copyto(out, t, casting="unsafe")
    if may_hold_nan:
        nan = np.isnan(x)
        if nan.any():
            out[nan] = BF16_NAN
    return out


def f32_to_f16(x: np.ndarray, out: np.ndarray | None = None, may_hold_nan: bool = True) -> np.ndarray:
    """float32 -> F16 bit patterns (``uint16``), round to nearest even, as torch's CPU cast (F16C).

    Finite values and infinities convert as numpy converts them; a NaN keeps its sign and the top
    10 payload bits and is made quiet (numpy would keep a signalling NaN signalling).
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty(x.shape, np.uint16) if out is None else out
    with np.errstate(over="ignore"):  # overflow to Inf is the intended result
        np.copyto(out.view(np.float16), x, casting="same_kind")
    if may_hold_nan:
        nan = np.isnan(x)
        if nan.any():
            u = x.view(np.uint32)[nan]
            out[nan] = (((u >> 16) & 0x8000) | 0x7E00 | ((u >> 13) & 0x3FF)).astype(np.uint16)
    return out


def _widen(bits: np.ndarray, dtype: str, out: np.ndarray) -> np.ndarray:
    """Source bits -> float32 values in ``out`` (exact)."""
    if dtype == "BF16":
        np.left_shift(bits, 16, out=out.view(np.uint32), dtype=np.uint32)
    elif dtype == "F16":
        np.copyto(out, bits.view(np.float16))
    else:
        np.copyto(out, bits.view(np.float32))
    return out


def _amax(bits: np.ndarray, dtype: str, mag: np.ndarray, first_row: int) -> np.ndarray:
    """Per-row ``max|x|`` as float32 ``[r]``; raises ``NonFiniteRows`` (absolute row numbers)."""
    _, mask, nonfinite = _BITS[dtype]
    np.bitwise_and(bits, mask, out=mag)
    m = mag.max(axis=1)
    bad = m >= nonfinite
    if bad.any():
        raise NonFiniteRows([first_row + int(i) for i in np.flatnonzero(bad)])
    if dtype == "BF16":
        return (m.astype(np.uint32) << 16).view(np.float32)
    if dtype == "F16":
        return m.view(np.float16).astype(np.float32)
    return m.view(np.float32)


def _scales(amax: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scale, divisor): ``amax / 127`` in float32, and the same with 1 where the scale is 0."""
    scale = amax / _QMAX32
    return scale, np.where(scale > 0, scale, np.float32(1))


def _clamp_denormal_rows(d: np.ndarray, scale: np.ndarray) -> None:
    """Clamp the rows whose scale is denormal: only there can ``|x / scale|`` round past 127.

    With a normal scale ``|x / scale| <= 127 (1 + 2^-23)``, so torch's clamp never changes a value
    and this pass is skipped; a denormal scale is rounded coarsely (an F32 source with a tiny amax).
    """
    small = (scale > 0) & (scale < _TINY32)
    if small.any():
        rows = np.flatnonzero(small)
        d[rows] = np.clip(d[rows], -QMAX, QMAX)


def quantize_rows(raw: np.ndarray, dtype: str = "BF16") -> tuple[np.ndarray, np.ndarray]:
    """Quantize a ``[rows, hidden]`` block: returns (I8 values, F32 ``[rows, 1]`` scales)."""
    bits = _bits(np.asarray(raw), dtype)
    if bits.ndim != 2:
        raise ValueError(f"expected [rows, hidden], got shape {bits.shape}")
    amax = _amax(bits, dtype, np.empty(bits.shape, bits.dtype), 0)
    scale, div = _scales(amax)
    x = _widen(bits, dtype, np.empty(bits.shape, np.float32))
    d = np.divide(x, div[:, None], out=x)
    np.rint(d, out=d)  # round half to even, as torch.round
    _clamp_denormal_rows(d, scale)
    return d.astype(np.int8), scale[:, None]


def dequantize_rows(q: np.ndarray, scale: np.ndarray, dtype: str = "F32") -> np.ndarray:
    """Decode rows: ``q * scale`` in float32, cast to ``dtype`` (BF16: ``uint16`` bits)."""
    with np.errstate(all="ignore"):  # an Inf or NaN scale gives what IEEE (and torch) give
        y = np.multiply(q, np.asarray(scale, np.float32).reshape(-1, 1), dtype=np.float32)
    if dtype == "F32":
        return y
    if dtype == "BF16":
        return f32_to_bf16(y)
    if dtype == "F16":
        return f32_to_f16(y).view(np.float16)
    raise ValueError(f"unsupported table dtype {dtype!r}")


def row_norms(x: np.ndarray) -> np.ndarray:
    """Euclidean norm of each row of a float32 block, as float64 ``[r]``.

    Squares summed in float32, as torch's ``vector_norm`` sums them: it overflows to Inf (and
    underflows to 0) on the same rows.
    """
    with np.errstate(all="ignore"):
        if hasattr(np, "vecdot"):  # numpy >= 2.0: a ufunc over the last axis (SIMD dot per row)
            sq = np.vecdot(x, x)
        else:  # pragma: no cover - numpy 1.x
            sq = np.einsum("ij,ij->i", x, x)
    return np.sqrt(sq.astype(np.float64))


class QualityMeter:
    """Error figures of one table, accumulated block by block (bounded memory).

    The formulas of the torch reference's ``QualityMeter`` in float64 numpy: fed the same three
    norms per row, both give the same figures.
    """

    def __init__(self) -> None:
        self.err_sq = 0.0
        self.ref_sq = 0.0
        self.cos_sum = 0.0
        self.cos_min = 1.0
        self.row_rel_max = 0.0
        self.rows = 0
        self._nonzero_rows = 0

    def add(self, ref: np.ndarray, q: np.ndarray, scale: np.ndarray) -> None:
        """Account one block: the reference rows (float32 values) and their quantized form."""
        x = np.asarray(ref, np.float32)
        y = dequantize_rows(q, scale)
        self.add_norms(row_norms(x), row_norms(y), row_norms(x - y))

    def add_norms(self, nx: np.ndarray, ny: np.ndarray, nd: np.ndarray) -> None:
        """Account rows from three float64 norms per row: ``|x|``, ``|y|`` (decoded) and ``|x - y|``.

        ``cos = 1 - (|d|^2 - (|x| - |y|)^2) / (2 |x| |y|)``: well conditioned near 1.
        """
        nx, ny, nd = (np.asarray(a, np.float64) for a in (nx, ny, nd))
        self.rows += nx.shape[0]
        dd, xx = nd * nd, nx * nx
        self.err_sq += float(dd.sum())
        self.ref_sq += float(xx.sum())
        nonzero = nx > 0
        if bool(nonzero.any()):
            nx, ny, dd, xx = nx[nonzero], ny[nonzero], dd[nonzero], xx[nonzero]
            with np.errstate(all="ignore"):  # float64 overflow/underflow as in torch: Inf, then clipped
                denom = np.maximum(2 * nx * ny, 1e-300)
                cos = np.clip(1 - np.maximum(dd - (nx - ny) ** 2, 0) / denom, -1.0, 1.0)
                rel = (dd / xx).max()
            self.cos_sum += float(cos.sum())
            self.cos_min = min(self.cos_min, float(cos.min()))
            self.row_rel_max = max(self.row_rel_max, math.sqrt(float(rel)))
            self._nonzero_rows += int(nonzero.sum())

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


class NormLog:
    """Row norms recorded for a ``QualityMeter`` later: blocks quantized out of order (several
    threads) are accounted in row order, so the figures do not depend on the thread count."""

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def add_norms(self, nx: np.ndarray, ny: np.ndarray, nd: np.ndarray) -> None:
        self.parts.append((nx, ny, nd))

    def replay(self, meter: QualityMeter) -> None:
        for part in self.parts:
            meter.add_norms(*part)


class RowQuantizer:
    """Quantize one table block by block into caller-owned output, accumulating its quality figures.

    Holds one block of scratch (three float32 buffers and one of bits): nothing is allocated per
    block but the per-row vectors. Blocks of any size are cut into ``block_rows`` pieces.
    """

    def __init__(self, hidden: int, dtype: str = "BF16", block_rows: int = BLOCK_ROWS) -> None:
        _check_dtype(dtype)
        self.hidden, self.dtype, self.block_rows = hidden, dtype, block_rows
        self.x = np.empty((block_rows, hidden), np.float32)
        self.d = np.empty((block_rows, hidden), np.float32)
        self.t = np.empty((block_rows, hidden), np.float32)
        self.mag = np.empty((block_rows, hidden), _BITS[dtype][0])
        self.meter = QualityMeter()

    def block(self, raw: np.ndarray, first_row: int = 0, q_out: np.ndarray | None = None,
              scale_out: np.ndarray | None = None, meter: "QualityMeter | NormLog | None" = None
              ) -> tuple[np.ndarray, np.ndarray]:
        """Quantize ``[r, hidden]`` source rows (their bits) into ``q_out`` (I8) and ``scale_out`` (F32 ``[r, 1]``).

        Without ``q_out`` / ``scale_out`` new arrays are returned. The rows' norms go to ``meter``
        (default: this quantizer's own). Raises ``NonFiniteRows`` naming ``first_row``-based row
        numbers, before anything of the block is written.
        """
        bits = _bits(raw, self.dtype).reshape(-1, self.hidden)
        r = bits.shape[0]
        q = np.empty((r, self.hidden), np.int8) if q_out is None else q_out.reshape(r, self.hidden)
        scale = np.empty((r, 1), np.float32) if scale_out is None else scale_out.reshape(r, 1)
        meter = self.meter if meter is None else meter
        for a in range(0, r, self.block_rows):
            b = min(r, a + self.block_rows)
            self._piece(bits[a:b], first_row + a, q[a:b], scale[a:b, 0], meter)
        return q, scale

    def _piece(self, bits: np.ndarray, first_row: int, q: np.ndarray, scale_out: np.ndarray,
               meter: "QualityMeter | NormLog") -> None:
        r = bits.shape[0]
        x, d, t, mag = self.x[:r], self.d[:r], self.t[:r], self.mag[:r]
        amax = _amax(bits, self.dtype, mag, first_row)
        scale, div = _scales(amax)
        _widen(bits, self.dtype, x)
        col = div[:, None]
        np.divide(x, col, out=d)
        np.rint(d, out=d)  # round half to even, as torch.round
        _clamp_denormal_rows(d, scale)
        np.copyto(q, d, casting="unsafe")  # integral values in [-127, 127]: exact
        scale_out[:] = scale
        # quality from three row norms: |x|, |y| = |q| * scale, |x - y| with y = fl(q * scale)
        nx, nq = row_norms(x), row_norms(d)
        with np.errstate(all="ignore"):  # q * scale may round past the largest float32: Inf, as in torch
            np.multiply(d, scale[:, None], out=t)
            np.subtract(x, t, out=t)
        meter.add_norms(nx, nq * scale.astype(np.float64), row_norms(t))

    def figures(self) -> dict[str, float]:
        return self.meter.figures()


class RowDecoder:
    """Decode int8 rows to a source dtype block by block, into caller-owned output (bits for BF16)."""

    def __init__(self, hidden: int, dtype: str = "BF16", block_rows: int = BLOCK_ROWS) -> None:
        _check_dtype(dtype)
        self.hidden, self.dtype, self.block_rows = hidden, dtype, block_rows
        self.y = np.empty((block_rows, hidden), np.float32)
        self.u = np.empty((block_rows, hidden), np.uint32)

    def block(self, q: np.ndarray, scale: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``q`` I8 ``[r, hidden]``, ``scale`` F32 ``[r]`` or ``[r, 1]`` -> ``out`` (``[r, hidden]`` of the dtype's bits)."""
        q = q.reshape(-1, self.hidden)
        r = q.shape[0]
        bits_dtype = _BITS[self.dtype][0]
        out = np.empty((r, self.hidden), bits_dtype) if out is None else out.reshape(r, self.hidden)
        scale = np.asarray(scale, np.float32).reshape(r, 1)
        finite = bool(np.isfinite(scale).all())  # q * finite scale is never NaN
        for a in range(0, r, self.block_rows):
            b = min(r, a + self.block_rows)
            y = self.y[: b - a]
            with np.errstate(all="ignore"):
                np.multiply(q[a:b], scale[a:b], out=y)
            if self.dtype == "BF16":
                f32_to_bf16(y, out[a:b], self.u[: b - a], may_hold_nan=not finite)
            elif self.dtype == "F16":
                f32_to_f16(y, out[a:b], may_hold_nan=not finite)
            else:
                np.copyto(out[a:b].view(np.float32), y)
        return out
