"""The completeness check (clef_format/vllm/completeness.py) on real torch parameters of every kind
the serving models hold: float tables and norms, packed NVFP4 bytes, int8 rows, float8 weights,
int32 indexes, bool masks, and 1-D parameters (biases, scales)."""

from __future__ import annotations

import pytest
import torch

from clef_format.vllm import UnwrittenParametersError, WriteTracker


def _model(**params: torch.Tensor) -> torch.nn.Module:
    m = torch.nn.Module()
    for name, value in params.items():
        setattr(m, name, torch.nn.Parameter(value, requires_grad=False))
    return m


def test_arm_fills_each_dtype_with_its_sentinel() -> None:
    m = _model(f=torch.zeros(2, 3), packed=torch.zeros(2, 3, dtype=torch.uint8),
               q=torch.zeros(2, 3, dtype=torch.int8), f8=torch.zeros(2, 3, dtype=torch.float8_e4m3fn),
               idx=torch.zeros(2, 3, dtype=torch.int32), mask=torch.zeros(2, 3, dtype=torch.bool))
    WriteTracker(m).arm()
    assert torch.isnan(m.f).all()
    assert (m.packed == 0xFF).all()  # two FP4 -6.0
    assert (m.q == -128).all()  # never produced by symmetric int8
    assert (m.f8.view(torch.uint8) == 0xFF).all()  # NaN in float8
    assert (m.idx == torch.iinfo(torch.int32).min).all()
    assert m.mask.all()


def test_nothing_written_is_reported_per_parameter_in_the_error() -> None:
    m = _model(f=torch.zeros(2, 3), f8=torch.zeros(2, 3, dtype=torch.float8_e4m3fn),
               idx=torch.zeros(2, 3, dtype=torch.int32), mask=torch.zeros(2, 3, dtype=torch.bool))
    tracker = WriteTracker(m).arm()
    with pytest.raises(UnwrittenParametersError) as caught:
        tracker.check()
    assert caught.value.unwritten == {name: "never written" for name in ("f", "f8", "idx", "mask")}
    assert str(caught.value) == (
        "4 parameter(s) were not written from the checkpoint; serving would use uninitialized memory:\n"
        "  f: never written\n  f8: never written\n  idx: never written\n  mask: never written\n"
        "  fix: run clef-format verify on the checkpoint and re-download what it reports")


def test_partly_written_parameters_are_counted_by_element_or_by_row() -> None:
    m = _model(f=torch.zeros(2, 3), f8=torch.zeros(3, 2, dtype=torch.float8_e4m3fn),
               idx=torch.zeros(4, 2, dtype=torch.int32), mask=torch.zeros(2, 2, dtype=torch.bool))
    tracker = WriteTracker(m).arm()
    with torch.no_grad():
        m.f[0].copy_(torch.tensor([1.0, 2.0, 3.0]))
        m.f[1, 0] = 4.0
        m.f8[0].copy_(torch.tensor([0.5, -1.0]).to(torch.float8_e4m3fn))
        m.idx[:3].copy_(torch.arange(6, dtype=torch.int32).reshape(3, 2))
        m.mask[0].copy_(torch.tensor([False, True]))
    assert tracker.unwritten() == {"f": "2 of 6 elements not written", "f8": "2 of 3 rows not written",
                                   "idx": "1 of 4 rows not written", "mask": "1 of 2 rows not written"}


def test_fully_written_parameters_pass_the_check() -> None:
    m = _model(f=torch.zeros(2, 3), q=torch.zeros(2, 3, dtype=torch.int8),
               f8=torch.zeros(2, 2, dtype=torch.float8_e4m3fn), idx=torch.zeros(2, 2, dtype=torch.int32),
               mask=torch.zeros(2, 2, dtype=torch.bool), bias=torch.zeros(4, dtype=torch.int8))
    tracker = WriteTracker(m).arm()
    with torch.no_grad():
        m.f.copy_(torch.randn(2, 3))
        m.q.copy_(torch.tensor([[1, -127, 127], [0, 5, -5]], dtype=torch.int8))
        m.f8.copy_(torch.tensor([[1.0, 2.0], [-3.0, 0.0]]).to(torch.float8_e4m3fn))
        m.idx.copy_(torch.tensor([[7, 8], [9, 10]], dtype=torch.int32))
        m.mask.copy_(torch.tensor([[False, True], [True, False]]))
        m.bias[:2].copy_(torch.tensor([3, 4], dtype=torch.int8))  # a 1-D parameter is one row
    assert tracker.unwritten() == {}
    tracker.check()


def test_a_1d_parameter_is_one_row() -> None:
    m = _model(bias=torch.zeros(4, dtype=torch.int8), scale=torch.zeros(3, dtype=torch.int32))
    tracker = WriteTracker(m).arm()
    with torch.no_grad():
        m.bias[0] = 1
    assert tracker.unwritten() == {"scale": "never written"}


def test_check_names_what_vllm_reported_loaded() -> None:
    m = _model(a=torch.zeros(2, 2), b=torch.zeros(2, 2))
    tracker = WriteTracker(m).arm()
    with torch.no_grad():
        m.a[0].fill_(1.0)
    with pytest.raises(UnwrittenParametersError) as caught:
        tracker.check(loaded=["a"])
    assert caught.value.unwritten == {"a": "2 of 4 elements not written (vLLM reported it loaded)",
                                      "b": "never written"}


def test_unwritten_before_arm_is_a_usage_error() -> None:
    tracker = WriteTracker(_model(a=torch.zeros(2, 2)))
    with pytest.raises(RuntimeError) as caught:
        tracker.check()
    assert str(caught.value) == "WriteTracker.arm() must run before the weights are loaded"


def test_record_passes_the_weights_through_and_remembers_their_names() -> None:
    tracker = WriteTracker(_model(a=torch.zeros(2, 2))).arm()
    weights = [("a", torch.ones(2, 2)), ("b.weight", torch.zeros(1))]
    assert list(tracker.record(iter(weights))) == weights
    assert tracker.yielded == ["a", "b.weight"]


@pytest.mark.parametrize("dtype,sentinel", [(torch.uint8, 0xFF), (torch.int8, -128), (torch.float8_e4m3fn, 0xFF),
                                            (torch.int32, torch.iinfo(torch.int32).min)])
def test_written_rows_that_merely_contain_sentinel_bytes_are_written(dtype: torch.dtype, sentinel: int) -> None:
    """A good NVFP4 row holds 0xFF wherever two adjacent values are both -6.0; one such byte (or all but
    one) in a row that loading wrote must not count as unwritten. Only a row entirely the sentinel does."""
    rows, width = 6, 8
    m = _model(w=torch.zeros(rows, width, dtype=dtype), v=torch.zeros(width, dtype=dtype))
    raw = torch.arange(1, rows * width + 1, dtype=torch.int32).reshape(rows, width) % 100 + 1  # no sentinel
    for r in range(rows - 1):
        raw[r, r % width] = sentinel if dtype is not torch.float8_e4m3fn else 0
    raw[rows - 1, :-1] = sentinel if dtype is not torch.float8_e4m3fn else 0  # all but one byte
    tracker = WriteTracker(m).arm()
    with torch.no_grad():
        if dtype is torch.float8_e4m3fn:  # the sentinel byte itself, written by the loader
            bits = raw.to(torch.uint8)
            bits[raw == 0] = sentinel
            m.w.view(torch.uint8).copy_(bits)
            m.v.view(torch.uint8).copy_(bits[0])
        else:
            m.w.copy_(raw.to(dtype))
            m.v.copy_(raw[0].to(dtype))
    assert tracker.unwritten() == {}
    tracker.check()
    fresh = _model(w=torch.zeros(rows, width, dtype=dtype))
    tracker = WriteTracker(fresh).arm()
    with torch.no_grad():
        fresh.w[1:].copy_(m.w[1:])  # the first row is never written
    assert tracker.unwritten() == {"w": f"1 of {rows} rows not written"}
