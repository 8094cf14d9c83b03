"""One definition of a valid table (spec.tables_format), and every reader applies it alike: verify,
verify --deep, the serving gate, the marker repair and migrate agree on a huge row scale, an int8
-128, a NaN row in a BF16 table, and a zero row."""

from __future__ import annotations

import struct

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from clef_format.compat import IncompatibleError, check_checkpoint
from clef_format.migrate.session import Options, migrate
from clef_format.read.checkpoint import read_checkpoint
from clef_format.read.safetensors import read_header
from clef_format.spec import layouts as L
from clef_format.spec import tables_format as TF
from clef_format.verify.run import verify
from tests.support.header_edit import reseal_digests


def _poke(path, name, offset, data: bytes) -> None:
    h = read_header(path)
    with open(path, "r+b") as fh:
        fh.seek(h.data_start + h.tensors[name].begin + offset)
        fh.write(data)


def _errors(report) -> set[str]:
    return {f.code for f in report.findings if f.severity == "error"}


def _migrate(root, to):
    report = migrate(str(root), str(root), Options(to=to))
    return _errors(report), report


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), max_size=64))
@example([2.668922665663266e36])  # decodes to BF16_MAX: an earlier rule called it too large
def test_scale_rule_agrees_with_a_bf16_decode(values):
    """A scale is valid exactly when it is finite, not negative and 127 * scale decodes to a finite BF16."""
    t = torch.tensor(values, dtype=torch.float32)
    decoded = (t * TF.QMAX).to(torch.bfloat16)
    want = [i for i, v in enumerate(t.tolist())
            if not (torch.isfinite(torch.tensor(v)) and v >= 0 and bool(torch.isfinite(decoded[i])))]
    p = TF.scale_problems(t.numpy().tobytes())
    got = sorted(i for kind in p.first for i in p.first[kind])
    assert sum(p.counts.values()) == len(want)
    assert set(got) <= set(want)


def _f32(bits: int) -> float:
    return struct.unpack("<f", bits.to_bytes(4, "little"))[0]


def _bf16_decode_is_finite(bits: int) -> bool:
    s = torch.tensor([bits], dtype=torch.int32).view(torch.float32)
    return bool(torch.isfinite((s * TF.QMAX).to(torch.bfloat16)).all())


def test_largest_scale_is_derived_from_the_decode_rule():
    """The largest valid scale: 127 * s in F32, then BF16 (nearest, ties to even) stays finite; one
    F32 ulp more overflows. Derived from the rounding rule in exact arithmetic, and checked with torch."""
    limit = 2**128 - 2**119 - 2**103  # the F32 product rounds to the BF16 overflow midpoint from here
    bits = 0x7C000000
    while 127 * _f32(bits + 1) < limit:
        bits += 1
    assert bits == TF._SCALE_MAX_BITS
    assert _f32(bits) == TF.SCALE_MAX
    assert _bf16_decode_is_finite(bits) and not _bf16_decode_is_finite(bits + 1)
    assert not TF.scale_problems(struct.pack("<f", TF.SCALE_MAX))
    assert TF.scale_problems((bits + 1).to_bytes(4, "little")).counts == {"too-large": 1}
    # BF16_MAX / 127 and a few hundred ulps above it decode to BF16_MAX, a finite row: valid
    below = int.from_bytes(struct.pack("<f", TF.BF16_MAX / TF.QMAX), "little")
    for b in range(below, bits + 1, 97):
        assert _bf16_decode_is_finite(b) and not TF.scale_problems(b.to_bytes(4, "little")), hex(b)


def test_scale_rule_boundary():
    assert not TF.scale_problems(struct.pack("<f", TF.SCALE_MAX * (1 - 1e-6)))
    assert TF.scale_problems(struct.pack("<f", TF.SCALE_MAX * (1 + 1e-6))).counts == {"too-large": 1}
    assert not TF.scale_problems(struct.pack("<2f", 0.0, -0.0))  # zero rows
    # each bad value is named for what it is (the message tells the user which rule it breaks)
    assert TF.scale_problems(struct.pack("<f", -1.0)).counts == {"negative": 1}
    assert TF.scale_problems(struct.pack("<f", -TF.SCALE_MAX * 2)).counts == {"negative": 1}
    assert TF.scale_problems(struct.pack("<2f", float("nan"), float("-inf"))).counts == {"nonfinite": 2}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(width=16, allow_nan=True, allow_infinity=True), max_size=64), st.sampled_from(["BF16", "F16", "F32"]))
def test_float_rule_agrees_with_torch(values, dtype):
    tdt = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}[dtype]
    t = torch.tensor(values, dtype=torch.float32).to(tdt)
    raw = t.view(torch.int16 if dtype != "F32" else torch.int32).numpy().tobytes()
    want = torch.nonzero(~torch.isfinite(t.float())).flatten().tolist()
    p = TF.float_problems(dtype, raw)
    assert p.counts.get("nonfinite", 0) == len(want) and p.first.get("nonfinite", []) == want[:5]


def test_int8_rule():
    assert not TF.int8_problems(bytes([0x7F, 0x81, 0, 1]))  # 127, -127
    p = TF.int8_problems(bytes([0, 0x80, 5, 0x80]))
    assert p.counts == {"out-of-range": 2} and p.first["out-of-range"] == [1, 3]


def test_huge_row_scale_is_refused_everywhere(fresh):
    root = fresh("layout-2", "bf16", num_layers=4)
    _poke(root / L.TABLES, TF.scale_name(L.LM_HEAD), 4 * 3, struct.pack("<f", 3e37))  # finite, but 127x is inf in BF16
    assert "scale-range" in _errors(verify(str(root)))
    assert "scale-range" in _errors(verify(str(root), deep=True))
    with pytest.raises(IncompatibleError) as exc:
        check_checkpoint(root, "0.2.0")
    assert exc.value.code == "scale-range"
    codes, _ = _migrate(root, "layout-1")
    assert codes == {"migrate-refused"}


def test_huge_row_scale_blocks_the_repair(fresh):
    root = fresh("layout-2-unmarked", "bf16", num_layers=4)
    _poke(root / L.TABLES, TF.scale_name(L.EMBED_TOKENS), 0, struct.pack("<f", 1e38))
    codes, _ = _migrate(root, "layout-2")
    assert codes == {"migrate-refused"} and read_checkpoint(root).layout is L.Layout.LAYOUT_2_UNMARKED


def test_int8_minus_128_is_refused_by_deep_repair_and_migrate(fresh):
    root = fresh("layout-2", "bf16", num_layers=4)
    _poke(root / L.TABLES, L.EMBED_TOKENS, 70, b"\x80")
    report = verify(str(root), deep=True)
    found = [f for f in report.findings if f.code == "table-value-range"]
    assert found and found[0].tensor == L.EMBED_TOKENS and "rows [1]" in found[0].message  # hidden 64: byte 70 is row 1
    codes, _ = _migrate(root, "layout-1")
    assert codes == {"migrate-refused"}


def test_int8_minus_128_blocks_the_repair(fresh):
    root = fresh("layout-2-unmarked", "bf16", num_layers=4)
    _poke(root / L.TABLES, L.LM_HEAD, 3, b"\x80")
    assert "table-value-range" in _errors(verify(str(root), deep=True))
    codes, _ = _migrate(root, "layout-2")
    assert codes == {"migrate-refused"}


def test_nan_row_in_a_bf16_table_is_refused_by_deep_and_migrate(fresh):
    root = fresh("layout-1", "bf16", num_layers=4)
    ck = read_checkpoint(root)
    rel = ck.tensor_file[L.LM_HEAD]
    _poke(root / rel, L.LM_HEAD, 2 * 64 * 5 + 8, struct.pack("<H", 0x7FC0))  # row 5
    found = [f for f in verify(str(root), deep=True).findings if f.code == "table-nonfinite"]
    assert found and "rows [5]" in found[0].message and found[0].severity == "error"
    codes, _ = _migrate(root, "layout-2")
    assert codes == {"table-nonfinite"}


def test_a_zero_row_is_valid_everywhere(fresh):
    root = fresh("layout-2", "bf16", num_layers=4)
    h = read_header(root / L.TABLES)
    hidden = h.tensors[L.EMBED_TOKENS].shape[1]
    _poke(root / L.TABLES, L.EMBED_TOKENS, hidden * 2, b"\0" * hidden)
    _poke(root / L.TABLES, TF.scale_name(L.EMBED_TOKENS), 4 * 2, struct.pack("<f", 0.0))
    reseal_digests(root / L.TABLES)  # a file written with this zero row (its recorded digests are its own)
    assert verify(str(root), deep=True).ok
    check_checkpoint(root, "0.2.0")
    codes, report = _migrate(root, "layout-1")
    assert not codes, report.findings


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
def test_nan_in_the_last_row_refuses_with_nothing_changed(fresh, dry_run: bool):
    """The real run finds a NaN while quantizing (the last row of the second table, after everything
    else was written to the workspace): refused with the same code, the checkpoint untouched and the
    workspace gone; the dry run finds it by scanning."""
    import hashlib

    root = fresh("layout-1", "bf16", num_layers=4)
    ck = read_checkpoint(root)
    rel = ck.tensor_file[L.LM_HEAD]
    rows, width = ck.backbone[L.LM_HEAD].shape
    _poke(root / rel, L.LM_HEAD, 2 * width * (rows - 1) + 2 * (width - 1), struct.pack("<H", 0x7F80))  # +Inf
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}
    report = migrate(str(root), str(root), Options(to="layout-2", dry_run=dry_run))
    assert _errors(report) == {"table-nonfinite"}, report.findings
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}
    assert after == before and not [p for p in root.parent.iterdir() if ".clef-migrate" in p.name and
                                    not p.name.endswith(".lock")]
