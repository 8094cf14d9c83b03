"""Dequantize-on-gather (clef_format.int8_gather) against quantize.dequantize_rows, bit for bit.

The torch backend runs everywhere; the Triton kernel runs in ``test_triton_matches_torch_exactly``
on a CUDA machine (skipped without one) and under Triton's CPU interpreter where triton is
installed. Tables are real quantized tables: ``quantize_rows`` over random BF16 rows.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.torch_int8 import dequantize_rows, quantize_rows
from clef_format.vllm.int8_gather import KernelConfig, default_config, gather_rows, gather_rows_shard, resolve_backend

OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def make_table(vocab: int, hidden: int, seed: int = 0, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """A quantized table with the rows real tables have: varied magnitudes, an outlier, a zero row."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(vocab, hidden, generator=gen)
    mags = torch.exp(torch.empty(vocab, 1).uniform_(-8, 3, generator=gen))
    rows = rows * mags
    if vocab > 2 and hidden > 1:
        rows[1, hidden // 2] *= 200.0  # outlier: most of the row quantizes to small q
        rows[2] = 0.0  # all-zero row: scale 0
    q, scale = quantize_rows(rows.to(torch.bfloat16))
    return q.to(device), scale.to(device)


def reference(q: torch.Tensor, scale: torch.Tensor, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Decode the whole table with the format's own arithmetic, then index."""
    return dequantize_rows(q, scale, dtype)[ids.long()]


def assert_bits_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
    if a.numel() == 0:
        return
    int_view = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    diff = a.contiguous().view(int_view) != b.contiguous().view(int_view)
    assert not bool(diff.any()), f"{int(diff.sum())} element(s) differ, first at {diff.nonzero()[0].tolist()}"


# ------------------------------------------------------------------------------------------------
# torch backend == dequantize_rows


@pytest.mark.parametrize("vocab,hidden", [(1, 1), (5, 3), (64, 64), (97, 130), (300, 257), (1000, 512)])
@pytest.mark.parametrize("dtype", OUT_DTYPES)
def test_torch_path_matches_dequantize_rows(vocab: int, hidden: int, dtype: torch.dtype) -> None:
    q, scale = make_table(vocab, hidden, seed=vocab * 7 + hidden)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (3 * vocab + 1,), generator=gen)
    out = gather_rows(q, scale, ids, dtype, backend="torch")
    assert_bits_equal(out, reference(q, scale, ids, dtype))


def test_repeated_ids_give_identical_rows() -> None:
    q, scale = make_table(50, 40)
    ids = torch.tensor([7, 7, 7, 0, 49, 7, 0, 2, 2])
    out = gather_rows(q, scale, ids, backend="torch")
    assert_bits_equal(out, reference(q, scale, ids, torch.bfloat16))
    assert_bits_equal(out[0], out[5])
    assert not bool(out[7].any())  # row 2 is the all-zero row: exact zeros


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 4)])
def test_empty_ids(shape: tuple[int, ...]) -> None:
    q, scale = make_table(10, 12)
    ids = torch.empty(shape, dtype=torch.long)
    out = gather_rows(q, scale, ids, backend="torch")
    assert out.shape == shape + (12,) and out.dtype == torch.bfloat16
    shard = gather_rows_shard(q, scale, ids, 0, 10, backend="torch")
    assert shard.shape == shape + (12,)


@pytest.mark.parametrize("shape", [(), (1,), (4, 5), (2, 3, 4)])
def test_ids_of_any_shape(shape: tuple[int, ...]) -> None:
    q, scale = make_table(40, 24)
    ids = torch.randint(0, 40, shape, generator=torch.Generator().manual_seed(3))
    out = gather_rows(q, scale, ids, torch.float32, backend="torch")
    assert out.shape == tuple(shape) + (24,)
    assert_bits_equal(out, reference(q, scale, ids, torch.float32))


@pytest.mark.parametrize("id_dtype", [torch.int64, torch.int32, torch.int16, torch.uint8])
def test_integer_id_dtypes(id_dtype: torch.dtype) -> None:
    q, scale = make_table(100, 16)
    ids = torch.arange(0, 100, 3).to(id_dtype)
    out = gather_rows(q, scale, ids, backend="torch")
    assert_bits_equal(out, reference(q, scale, ids, torch.bfloat16))


def test_noncontiguous_ids_and_table_slice() -> None:
    q, scale = make_table(60, 32)
    ids = torch.randint(0, 60, (8, 6), generator=torch.Generator().manual_seed(4)).t()  # not contiguous
    assert not ids.is_contiguous()
    assert_bits_equal(gather_rows(q, scale, ids, backend="torch"), reference(q, scale, ids, torch.bfloat16))
    # a row range of a bigger table (a view with an offset) is a table too
    sub_q, sub_s = q[10:50], scale[10:50]
    sub_ids = torch.tensor([0, 39, 5])
    assert_bits_equal(
        gather_rows(sub_q, sub_s, sub_ids, backend="torch"), reference(q, scale, sub_ids + 10, torch.bfloat16)
    )


@pytest.mark.parametrize("bad", [10, 11, -1])
def test_out_of_range_ids_raise_on_torch_path(bad: int) -> None:
    q, scale = make_table(10, 8)
    with pytest.raises((IndexError, RuntimeError)):
        gather_rows(q, scale, torch.tensor([0, bad]), backend="torch")


def test_bad_arguments_are_refused() -> None:
    q, scale = make_table(10, 8)
    ids = torch.tensor([1, 2])
    with pytest.raises(TypeError):
        gather_rows(q.float(), scale, ids)
    with pytest.raises(TypeError):
        gather_rows(q, scale.double(), ids)
    with pytest.raises(TypeError):
        gather_rows(q, scale.view(-1), ids)
    with pytest.raises(TypeError):
        gather_rows(q, scale, ids.float())
    with pytest.raises(TypeError):
        gather_rows(q, scale, ids, torch.int32)
    with pytest.raises(ValueError):
        gather_rows(q, scale, ids, backend="cuda")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        gather_rows_shard(q, scale, ids, 0, 11)  # range longer than the shard
    with pytest.raises(ValueError):
        gather_rows_shard(q, scale, ids, 5, 4)


def test_backend_resolution_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    cpu = torch.device("cpu")
    assert resolve_backend("auto", cpu) == "torch"
    assert resolve_backend("torch", cpu) == "torch"
    with pytest.raises(RuntimeError):
        resolve_backend("triton", cpu)
    q, scale = make_table(10, 8)
    with pytest.raises(RuntimeError):
        gather_rows(q, scale, torch.tensor([1]), backend="triton")


def test_import_needs_no_triton_and_touches_no_gpu() -> None:
    code = textwrap.dedent(
        """
        import sys, torch
        import clef_format.int8_gather as g
        assert "triton" not in sys.modules, "imported triton at import time"
        assert not torch.cuda.is_initialized(), "initialised CUDA at import time"
        q = torch.zeros(4, 3, dtype=torch.int8); s = torch.zeros(4, 1)
        g.gather_rows(q, s, torch.tensor([1, 2]))  # auto on CPU: the torch path, still no triton
        assert "triton" not in sys.modules, "imported triton for a CPU call"
        print("ok")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr


def test_default_config_shapes() -> None:
    for n in (1, 2, 64, 65, 512, 513, 4096, 4097, 19200, 10**7):
        for hidden in (1, 7, 64, 100, 4096, 5120):
            cfg = default_config(n, hidden)
            assert cfg.block_t >= 1 and cfg.num_warps >= 1
            assert cfg.block_h & (cfg.block_h - 1) == 0  # power of two, as tl.arange needs
            assert cfg.block_h <= max(1, 1 << (hidden - 1).bit_length())


# ------------------------------------------------------------------------------------------------
# vocab-parallel shards


def shard_bounds(vocab: int, ranks: int) -> list[tuple[int, int, int]]:
    """(start, end, padded rows) per rank, split the way vLLM pads vocab shards to equal size."""
    per = -(-vocab // ranks)
    return [(min(vocab, r * per), min(vocab, (r + 1) * per), per) for r in range(ranks)]


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("dtype", OUT_DTYPES)
def test_shards_sum_to_full_lookup(ranks: int, dtype: torch.dtype) -> None:
    vocab, hidden = 203, 48
    q, scale = make_table(vocab, hidden, seed=ranks)
    ids = torch.randint(0, vocab, (5, 9), generator=torch.Generator().manual_seed(ranks))
    ids[0, :3] = torch.tensor([0, vocab - 1, vocab - 1])
    total = torch.zeros(5, 9, hidden, dtype=dtype)
    for start, end, rows in shard_bounds(vocab, ranks):
        # the shard is padded past its range with garbage rows, which must never be read
        q_shard = torch.full((rows, hidden), 99, dtype=torch.int8)
        s_shard = torch.full((rows, 1), 1e30)
        q_shard[: end - start], s_shard[: end - start] = q[start:end], scale[start:end]
        part = gather_rows_shard(q_shard, s_shard, ids, start, end, dtype, backend="torch")
        outside = (ids < start) | (ids >= end)
        assert not bool(part[outside].view(torch.int16 if dtype != torch.float32 else torch.int32).any()), (
            "masked rows must be +0.0 exactly"
        )
        inside = ~outside
        assert_bits_equal(part[inside], reference(q, scale, ids[inside], dtype))
        total += part  # the all-reduce: x + 0 == x exactly
    assert_bits_equal(total, reference(q, scale, ids, dtype))


def test_shard_with_empty_range_gives_zeros() -> None:
    q, scale = make_table(8, 16)
    out = gather_rows_shard(q[:0], scale[:0], torch.tensor([0, 3, 7]), 8, 8, backend="torch")
    assert out.shape == (3, 16) and not bool(out.any())


# ------------------------------------------------------------------------------------------------
# properties


@st.composite
def lookups(draw: st.DrawFn) -> tuple[int, int, int, torch.Tensor, torch.dtype, int, int]:
    vocab = draw(st.integers(1, 80))
    hidden = draw(st.integers(1, 70))
    seed = draw(st.integers(0, 2**16))
    shape = draw(st.lists(st.integers(0, 6), min_size=0, max_size=3))
    n = 1
    for d in shape:
        n *= d
    flat = draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n))
    ids = torch.tensor(flat, dtype=torch.long).reshape(shape)
    dtype = draw(st.sampled_from(OUT_DTYPES))
    start = draw(st.integers(0, vocab))
    end = draw(st.integers(start, vocab))
    return vocab, hidden, seed, ids, dtype, start, end


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lookups())
def test_property_gather_and_shard(case: tuple[int, int, int, torch.Tensor, torch.dtype, int, int]) -> None:
    vocab, hidden, seed, ids, dtype, start, end = case
    q, scale = make_table(vocab, hidden, seed=seed)
    want = reference(q, scale, ids, dtype)
    got = gather_rows(q, scale, ids, dtype, backend="auto")
    assert got.shape == tuple(ids.shape) + (hidden,)
    assert_bits_equal(got, want)
    part = gather_rows_shard(q[start:end], scale[start:end], ids, start, end, dtype, backend="torch")
    keep = ((ids >= start) & (ids < end)).unsqueeze(-1)
    assert_bits_equal(part, torch.where(keep, want, torch.zeros((), dtype=dtype)))


# ------------------------------------------------------------------------------------------------
# the Triton kernel


def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


CONFIGS = [None, KernelConfig(1, 256, 2), KernelConfig(4, 1024, 4), KernelConfig(8, 2048, 8), KernelConfig(2, 64, 1)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.skipif(not _triton_importable(), reason="needs triton")
def test_triton_matches_torch_exactly() -> None:
    """The fused kernel must give the torch path's bits: every shape, dtype, id layout and shard."""
    from clef_format.vllm.int8_gather import _gather_triton

    dev = "cuda"
    assert resolve_backend("auto", torch.device(dev)) == "triton"
    cases = [(1, 1), (97, 130), (300, 257), (1000, 512), (4099, 4096), (2048, 5120)]
    gen = torch.Generator().manual_seed(5)
    for vocab, hidden in cases:
        q, scale = make_table(vocab, hidden, seed=vocab + hidden, device=dev)
        for n in (0, 1, 17, 64, 257, 3000):
            ids_cpu = torch.randint(0, vocab, (n,), generator=gen)
            if n >= 4:
                ids_cpu[:4] = torch.tensor([0, vocab - 1, 0, vocab - 1])  # ends and repeats
            for id_dtype in (torch.int64, torch.int32):
                ids = ids_cpu.to(dev, id_dtype)
                for dtype in OUT_DTYPES:
                    want = gather_rows(q, scale, ids, dtype, backend="torch")
                    assert_bits_equal(want, reference(q, scale, ids, dtype))
                    # poison the allocator's free blocks so an unwritten output can't pass by luck
                    torch.full((max(n, 1) * hidden * 4 + 4096,), float("nan"), device=dev)
                    got = gather_rows(q, scale, ids, dtype, backend="triton")
                    assert_bits_equal(got, want)
                    if id_dtype == torch.int64 and dtype == torch.bfloat16:  # other shapes: fewer compiles
                        for cfg in CONFIGS[1:]:
                            assert_bits_equal(_gather_triton(q, scale, ids, dtype, 0, vocab, cfg), want)
        # 2-D ids, and vocab-parallel shards with padding rows
        ids2 = torch.randint(0, vocab, (7, 33), generator=gen).to(dev)
        assert_bits_equal(gather_rows(q, scale, ids2, backend="triton"), gather_rows(q, scale, ids2, backend="torch"))
        for start, end, rows in shard_bounds(vocab, 4):
            q_shard = torch.full((rows, hidden), 99, dtype=torch.int8, device=dev)
            s_shard = torch.full((rows, 1), 1e30, device=dev)
            q_shard[: end - start], s_shard[: end - start] = q[start:end], scale[start:end]
            for dtype in OUT_DTYPES:
                want = gather_rows_shard(q_shard, s_shard, ids2, start, end, dtype, backend="torch")
                got = gather_rows_shard(q_shard, s_shard, ids2, start, end, dtype, backend="triton")
                assert_bits_equal(got, want)
    # a table slice that starts at an odd byte offset (no 16-byte alignment) still works
    q, scale = make_table(64, 96, device=dev)
    ids = torch.arange(63, device=dev)
    q_odd = torch.empty(64 * 96 + 1, dtype=torch.int8, device=dev)[1:].view(64, 96)
    q_odd.copy_(q)
    assert_bits_equal(gather_rows(q_odd, scale, ids, backend="triton"), gather_rows(q, scale, ids, backend="torch"))
    torch.cuda.synchronize()


@pytest.mark.skipif(not _triton_importable(), reason="needs triton")
def test_triton_kernel_under_interpreter() -> None:
    """The kernel's indexing and masking, run by Triton's CPU interpreter (no GPU needed).

    The interpreter truncates float32 -> bfloat16 instead of rounding it (a limitation of its numpy
    emulation, not of the compiled kernel), so it is checked at float16 and float32, where its
    casts round like torch's; BF16 is covered bit for bit on the GPU by the test above.
    """
    code = textwrap.dedent(
        """
        import torch
        from tests.hooks.test_int8_gather import make_table, reference, assert_bits_equal, shard_bounds, CONFIGS
        from clef_format.vllm.int8_gather import gather_rows, gather_rows_shard, _gather_triton
        gen = torch.Generator().manual_seed(0)
        for vocab, hidden in [(1, 1), (37, 100), (200, 64)]:
            q, scale = make_table(vocab, hidden, seed=vocab)
            for shape in [(0,), (5,), (3, 4)]:
                ids = torch.randint(0, vocab, shape, generator=gen)
                for dtype in (torch.float16, torch.float32):
                    want = reference(q, scale, ids, dtype)
                    assert_bits_equal(gather_rows(q, scale, ids, dtype, backend="triton"), want)
                    for cfg in CONFIGS[1:]:
                        got = _gather_triton(q, scale, ids.reshape(-1), dtype, 0, vocab, cfg)
                        assert_bits_equal(got.view(want.shape), want)
                    for start, end, rows in shard_bounds(vocab, 3):
                        qs = torch.full((rows, hidden), 99, dtype=torch.int8)
                        ss = torch.full((rows, 1), 1e30)
                        qs[: end - start], ss[: end - start] = q[start:end], scale[start:end]
                        got = gather_rows_shard(qs, ss, ids, start, end, dtype, backend="triton")
                        assert_bits_equal(got, gather_rows_shard(qs, ss, ids, start, end, dtype, backend="torch"))
        print("ok")
        """
    )
    env = dict(os.environ, TRITON_INTERPRET="1")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root, timeout=600)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stdout + res.stderr
