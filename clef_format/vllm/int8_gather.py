"""Dequantize-on-gather for the int8 tables (``tables_format``): embedding lookups and row gathers.

A gathered row decodes exactly as ``quantize.dequantize_rows`` decodes it: ``q.float() * scale``
in float32, then one cast (round to nearest even) to the serving dtype. Gathering first and
decoding only the gathered rows is what lets the serving path keep the table in int8 (half the
memory of BF16) and still read fewer bytes than a BF16 ``embedding``: 1 byte per element read and
2 written, against BF16's 2 and 2.

Two backends compute bit-identical results:

* ``"triton"``: one fused kernel (gather, scale, cast, store) for CUDA tensors.
* ``"torch"``: ``index_select`` of the rows and scales, then one ``torch.mul`` that computes in
  float32 and writes the output dtype. Runs anywhere; the reference for the kernel.

``"auto"`` takes Triton when the tensors are on CUDA and Triton imports, else torch. Triton is
imported lazily, on the first CUDA call: importing this module imports no Triton and touches no
GPU, so verify and migrate stay usable on machines without either.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal

import torch

Backend = Literal["auto", "triton", "torch"]
BACKENDS: tuple[str, ...] = ("auto", "triton", "torch")

#: Index dtypes the kernel reads directly; other integer dtypes are widened to int64 first.
_KERNEL_ID_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class KernelConfig:
    """One launch shape of the fused kernel: a program covers ``block_t`` ids x ``block_h`` columns."""

    block_t: int
    block_h: int
    num_warps: int


#: Launch shapes by number of ids, tuned on an H200 for hidden 4096 (``benchmarks/bench_gather_gpu.py
#: --sweep``, CUDA-graph timings): ``(max ids, config)``, first match wins. Many ids want whole-row
#: tiles with few warps (each thread streams 64 values); up to ~128 ids the row is split over more
#: programs so that enough of the chip has loads in flight; between, 8-id tiles of 512 columns did
#: best. Within the top few shapes the spread is only 1-4%: these are latency- or HBM-bound.
_TUNED: tuple[tuple[int, KernelConfig], ...] = (
    (128, KernelConfig(block_t=1, block_h=1024, num_warps=4)),
    (1024, KernelConfig(block_t=8, block_h=512, num_warps=4)),
    (1 << 62, KernelConfig(block_t=1, block_h=4096, num_warps=2)),
)


def default_config(n_ids: int, hidden: int) -> KernelConfig:
    """The tuned launch shape for ``n_ids`` ids of ``hidden`` columns."""
    for limit, cfg in _TUNED:
        if n_ids <= limit:
            break
    block_h = min(cfg.block_h, _next_pow2(hidden))
    # A narrow row must not leave threads idle: at least 8 elements (one 8-byte load) per thread.
    num_warps = max(1, min(cfg.num_warps, (cfg.block_t * block_h) // 256))
    return KernelConfig(cfg.block_t, block_h, num_warps)


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


# ----------------------------------------------------------------------------------------------
# public API


def gather_rows(
    q: torch.Tensor,
    scale: torch.Tensor,
    ids: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Rows ``ids`` of an int8 table, decoded: ``(q[ids].float() * scale[ids]).to(out_dtype)``.

    ``q`` is I8 ``[vocab, hidden]``, ``scale`` F32 ``[vocab, 1]``; ``ids`` is an integer tensor of
    any shape and the result has shape ``ids.shape + (hidden,)``. Ids must lie in ``[0, vocab)``:
    the torch backend raises on others; the Triton kernel never reads outside the table and gives
    zero rows for them (a bounds check would cost a device sync on every call).
    """
    _check_table(q, scale, ids)
    return _dispatch(q, scale, ids, out_dtype, backend, 0, q.shape[0], masked=False)


def gather_rows_shard(
    q_shard: torch.Tensor,
    scale_shard: torch.Tensor,
    ids: torch.Tensor,
    vocab_start: int,
    vocab_end: int,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    backend: Backend = "auto",
) -> torch.Tensor:
    """Vocab-parallel lookup: this rank holds global rows ``[vocab_start, vocab_end)`` as local rows 0...

    Ids outside the range give rows of zeros (+0.0), as vLLM's ``VocabParallelEmbedding`` masks
    before the all-reduce that sums the ranks' partial outputs. The shard may have padding rows
    past ``vocab_end - vocab_start``; they are never read.
    """
    _check_table(q_shard, scale_shard, ids)
    vocab_start, vocab_end = int(vocab_start), int(vocab_end)
    if not 0 <= vocab_end - vocab_start <= q_shard.shape[0] or vocab_start < 0:
        raise ValueError(
            f"shard range [{vocab_start}, {vocab_end}) does not fit a shard of {q_shard.shape[0]} rows"
        )
    return _dispatch(q_shard, scale_shard, ids, out_dtype, backend, vocab_start, vocab_end, masked=True)


def triton_available() -> bool:
    """Whether the fused kernel can be used at all here (Triton imports); cached."""
    return _triton() is not None


def resolve_backend(backend: Backend, device: torch.device) -> Literal["triton", "torch"]:
    """The backend a call on ``device`` will run; raises if ``"triton"`` is asked for and can't run."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
    if backend == "torch" or (backend == "auto" and device.type != "cuda"):
        return "torch"  # decided without importing triton: CPU callers never pay for it
    usable = _triton() is not None and (device.type == "cuda" or _interpreting())
    if backend == "triton":
        if not usable:
            raise RuntimeError(
                "backend='triton' needs CUDA tensors and an importable triton "
                f"(device={device}, triton importable={_triton() is not None})"
            )
        return "triton"
    return "triton" if usable and device.type == "cuda" else "torch"


# ----------------------------------------------------------------------------------------------
# shared plumbing


def _check_table(q: torch.Tensor, scale: torch.Tensor, ids: torch.Tensor) -> None:
    if q.dtype != torch.int8 or q.dim() != 2:
        raise TypeError(f"q must be int8 [vocab, hidden], got {q.dtype} {tuple(q.shape)}")
    if scale.dtype != torch.float32 or tuple(scale.shape) != (q.shape[0], 1):
        raise TypeError(f"scale must be float32 [{q.shape[0]}, 1], got {scale.dtype} {tuple(scale.shape)}")
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"ids must be an integer tensor, got {ids.dtype}")
    if not (q.device == scale.device == ids.device):
        raise ValueError(f"q, scale and ids must share a device: {q.device}, {scale.device}, {ids.device}")


def _dispatch(
    q: torch.Tensor,
    scale: torch.Tensor,
    ids: torch.Tensor,
    out_dtype: torch.dtype,
    backend: Backend,
    vocab_start: int,
    vocab_end: int,
    *,
    masked: bool,
) -> torch.Tensor:
    if not out_dtype.is_floating_point:
        raise TypeError(f"out_dtype must be a floating dtype, got {out_dtype}")
    chosen = resolve_backend(backend, q.device)
    flat = ids.reshape(-1)
    hidden = q.shape[1]
    if chosen == "triton":
        out = _gather_triton(q, scale, flat, out_dtype, vocab_start, vocab_end)
    elif masked:
        out = _gather_torch_masked(q, scale, flat, out_dtype, vocab_start, vocab_end)
    else:
        out = _gather_torch(q, scale, flat, out_dtype)
    return out.view(*ids.shape, hidden)


# ----------------------------------------------------------------------------------------------
# torch backend


def _gather_torch(q: torch.Tensor, scale: torch.Tensor, flat: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """Gather then decode. ``torch.mul`` of int8 by float32 computes in float32 (int8 -> float32
    is exact) and rounds once into ``out``: the same bits as ``dequantize_rows``, in one pass over
    the gathered rows instead of a float copy, a product and a cast."""
    if flat.dtype not in _KERNEL_ID_DTYPES:
        flat = flat.long()
    rows = q.index_select(0, flat)  # raises on ids outside [0, vocab)
    scales = scale.index_select(0, flat)
    out = torch.empty((flat.numel(), q.shape[1]), dtype=out_dtype, device=q.device)
    torch.mul(rows, scales, out=out)
    return out


def _gather_torch_masked(
    q: torch.Tensor, scale: torch.Tensor, flat: torch.Tensor, out_dtype: torch.dtype, start: int, end: int
) -> torch.Tensor:
    if flat.dtype not in _KERNEL_ID_DTYPES:
        flat = flat.long()
    valid = (flat >= start) & (flat < end)
    if end == start:  # an empty shard has no row 0 to stand in for the masked ids
        return torch.zeros((flat.numel(), q.shape[1]), dtype=out_dtype, device=q.device)
    local = torch.where(valid, flat - start, torch.zeros_like(flat))
    out = _gather_torch(q, scale, local, out_dtype)
    return out.masked_fill_(~valid.unsqueeze(1), 0)


# ----------------------------------------------------------------------------------------------
# triton backend (built on first use)

_TRITON_STATE: dict[str, Any] = {}


def _interpreting() -> bool:
    """Triton's CPU interpreter (``TRITON_INTERPRET=1``) runs the kernel on CPU tensors: for tests."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _triton() -> Any:
    """The triton module, or None when it does not import. Imported once, on first need."""
    if "module" not in _TRITON_STATE:
        try:
            import triton  # noqa: F401
            import triton.language  # noqa: F401
        except Exception:  # ImportError, or a broken install that fails while importing
            _TRITON_STATE["module"] = None
        else:
            _TRITON_STATE["module"] = triton
    return _TRITON_STATE["module"]


def _kernel() -> Any:
    """The jitted kernel; defined here rather than at module level so importing needs no triton."""
    if "kernel" in _TRITON_STATE:
        return _TRITON_STATE["kernel"]
    triton = _triton()
    tl = triton.language

    @triton.jit
    def _int8_gather_kernel(
        q_ptr,
        scale_ptr,
        ids_ptr,
        out_ptr,
        n_ids,
        hidden,
        stride_q,
        stride_scale,
        vocab_start,
        vocab_end,
        # triton reads these annotations when it compiles; to mypy ``tl`` is a value, not a type
        BLOCK_T: tl.constexpr,  # type: ignore[name-defined]
        BLOCK_H: tl.constexpr,  # type: ignore[name-defined]
        EVEN_H: tl.constexpr,  # type: ignore[name-defined]
        DOWNCAST: tl.constexpr,  # type: ignore[name-defined]
    ):
        # A program: BLOCK_T ids x BLOCK_H columns. Each id and its scale are loaded once for the
        # tile; the int8 slice is contiguous, so the loads vectorise to 16 bytes (16 values) and
        # the stores to 16 bytes (8 bf16 values).
        pid_t = tl.program_id(0)
        pid_h = tl.program_id(1)
        toks = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
        tok_in = toks < n_ids
        ids = tl.load(ids_ptr + toks, mask=tok_in, other=0).to(tl.int64)
        # Ids outside [vocab_start, vocab_end) read nothing and decode to +0.0 (q = 0, scale = 0).
        valid = tok_in & (ids >= vocab_start) & (ids < vocab_end)
        rows = ids - vocab_start
        scales = tl.load(scale_ptr + rows * stride_scale, mask=valid, other=0.0)
        cols = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
        if EVEN_H:  # no column mask: keeps the masks constant along a row, so loads stay wide
            load_mask = valid[:, None]
            store_mask = tok_in[:, None]
        else:
            col_in = cols < hidden
            load_mask = valid[:, None] & col_in[None, :]
            store_mask = tok_in[:, None] & col_in[None, :]
        vals = tl.load(q_ptr + rows[:, None] * stride_q + cols[None, :], mask=load_mask, other=0)
        # float32 product (no add, so nothing to contract into an FMA), then one rounding, spelled
        # out as round-to-nearest-even because that is what torch's cast does, bit for bit.
        prod = vals.to(tl.float32) * scales[:, None]
        if DOWNCAST:
            out = prod.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne")
        else:
            out = prod.to(out_ptr.dtype.element_ty)
        dst = out_ptr + toks.to(tl.int64)[:, None] * hidden + cols[None, :]
        tl.store(dst, out, mask=store_mask)

    _TRITON_STATE["kernel"] = _int8_gather_kernel
    return _int8_gather_kernel


def _gather_triton(
    q: torch.Tensor,
    scale: torch.Tensor,
    flat: torch.Tensor,
    out_dtype: torch.dtype,
    vocab_start: int,
    vocab_end: int,
    config: KernelConfig | None = None,
) -> torch.Tensor:
    """Launch the fused kernel over flat ids; ``config`` overrides the tuned shape (for sweeps)."""
    n, hidden = flat.numel(), q.shape[1]
    out = torch.empty((n, hidden), dtype=out_dtype, device=q.device)
    if n == 0 or hidden == 0:
        return out
    if flat.dtype not in _KERNEL_ID_DTYPES:
        flat = flat.long()
    flat = flat.contiguous()
    if q.stride(1) != 1:
        q = q.contiguous()
    cfg = config or default_config(n, hidden)
    grid = (triton_cdiv(n, cfg.block_t), triton_cdiv(hidden, cfg.block_h))
    kernel = _kernel()
    args = (q, scale, flat, out, n, hidden, q.stride(0), scale.stride(0), vocab_start, vocab_end)
    meta = dict(
        BLOCK_T=cfg.block_t, BLOCK_H=cfg.block_h, EVEN_H=hidden % cfg.block_h == 0, DOWNCAST=out_dtype.itemsize < 4,
        num_warps=cfg.num_warps,
    )
    if q.device.type == "cuda" and q.device.index not in (None, torch.cuda.current_device()):
        with torch.cuda.device(q.device):
            kernel[grid](*args, **meta)
    else:
        kernel[grid](*args, **meta)
    return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)
