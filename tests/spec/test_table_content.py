"""What the tables' bytes must be, seen by every reader that reads them in full: the complete table rule
(a zero scale only on a zero row, no -128) and the digests migrate records, applied alike by
``verify --deep``, the serving gate (``check_checkpoint``) and migrate. Each case is a single mutation
of a real checkpoint that the engine would have served wrong, or a strictness no loader needs.

The structure path reads headers and scales only: a wrong row is invisible there by design (its
time bound), and the gate runs what ``--deep`` runs on the tables."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from clef_format.compat import IncompatibleError, check_checkpoint
from clef_format.migrate.session import Options, migrate
from clef_format.read.safetensors import read_header
from clef_format.read.table_scan import scan_tables
from clef_format.spec import layouts as L
from clef_format.spec import tables_format as TF
from clef_format.verify.run import verify
from tests.support.header_edit import poke, reseal_digests
from tests.support.hostile_cases import edit_header

EMBED, LM = L.EMBED_TOKENS, L.LM_HEAD


def _errors(report) -> set[str]:
    return {f.code for f in report.findings if f.severity == "error"}


def _gate_code(root: Path) -> str | None:
    try:
        check_checkpoint(root, "0.2.0")
    except IncompatibleError as exc:
        return exc.code
    return None


def _read(path: Path, name: str) -> bytes:
    h = read_header(path)
    t = h.tensors[name]
    with open(path, "rb") as fh:
        fh.seek(h.data_start + t.begin)
        return fh.read(t.end - t.begin)


def _hidden(root: Path) -> int:
    return read_header(root / L.TABLES).tensors[EMBED].shape[1]


# ---- the rule itself, on bytes --------------------------------------------------------------

def test_a_zero_scale_is_valid_only_on_a_zero_row() -> None:
    scales = struct.pack("<5f", 0.5, 0.0, -0.0, 0.0, -0.0)
    rows = bytes([1, 2]) + bytes(2) + bytes(2) + bytes([0, 3]) + bytes([0x81, 0])  # rows 1, 2 zero; 3, 4 not
    rule = TF.TableRule(scales, 2)
    rule.feed(0, rows)
    assert rule.problems.counts == {"zero-scale": 2} and rule.problems.first == {"zero-scale": [3, 4]}
    assert "scale 0 on a row whose values are not all 0" in rule.problems.describe()


@pytest.mark.parametrize("block_rows", [1, 2, 3, 7])
def test_blocks_of_any_row_count_find_the_same_rows(block_rows: int) -> None:
    """Fed in blocks, the rule reports what it reports on the whole table: rows, not element indexes."""
    g = np.random.default_rng(0)
    q = g.integers(-127, 128, size=(10, 4), dtype=np.int8)
    scale = np.full(10, 0.25, np.float32)
    q[2, 1] = -128
    q[7] = [-128, 0, -128, 0]
    scale[5] = 0.0
    q[9] = 0
    scale[9] = -0.0
    rule = TF.TableRule(scale.tobytes(), 4)
    data = q.tobytes()
    for first in range(0, 10, block_rows):
        rule.feed(first, data[first * 4:(first + block_rows) * 4])
    assert rule.problems.counts == {"out-of-range": 3, "zero-scale": 1}
    assert rule.problems.first == {"out-of-range": [2, 7], "zero-scale": [5]}


def test_the_scan_reports_rows_and_digests_in_one_pass(fresh) -> None:
    root = fresh("layout-2", "bf16", num_layers=4)
    h = read_header(root / L.TABLES)
    scan = scan_tables(str(root / L.TABLES), h, (EMBED, LM), list(h.tensors))
    assert not any(scan.problems.values())
    assert {n: f"blake3:{d}" for n, d in scan.digests.items()} == json.loads(h.metadata[TF.DIGESTS_KEY])


# ---- false OK before: the engine served these wrong ------------------------------------------

def test_a_zero_scale_on_a_nonzero_row_is_refused_by_deep_the_gate_and_migrate(fresh) -> None:
    root = fresh("layout-2", "bf16", num_layers=4)
    poke(root / L.TABLES, TF.scale_name(LM), 4 * 3, struct.pack("<f", 0.0))
    reseal_digests(root / L.TABLES)  # as if written so: the rule alone must see it
    assert verify(str(root)).ok  # the structure path reads no rows
    deep = [f for f in verify(str(root), deep=True).findings if f.severity == "error"]
    assert [(f.code, f.tensor) for f in deep] == [("table-zero-scale", LM)] and "rows [3]" in deep[0].message
    assert "served as zeros" in deep[0].message
    assert _gate_code(root) == "table-zero-scale"
    report = migrate(str(root), str(root), Options(to="layout-1"))
    assert _errors(report) == {"migrate-refused"}
    assert "1 row(s) with scale 0 but values not all 0" in report.findings[0].message


def test_minus_128_is_refused_by_the_gate_at_start_up(fresh) -> None:
    root = fresh("layout-2", "bf16", num_layers=4)
    poke(root / L.TABLES, EMBED, _hidden(root) * 6 + 1, b"\x80")
    reseal_digests(root / L.TABLES)
    assert verify(str(root)).ok
    assert _errors(verify(str(root), deep=True)) == {"table-value-range"}
    assert _gate_code(root) == "table-value-range"


def _double_scale(root: Path) -> None:
    s = struct.unpack("<f", _read(root / L.TABLES, TF.scale_name(EMBED))[4 * 9: 4 * 10])[0]
    poke(root / L.TABLES, TF.scale_name(EMBED), 4 * 9, struct.pack("<f", 2 * s))


def _negate_row(root: Path) -> None:
    hidden = _hidden(root)
    row = np.frombuffer(_read(root / L.TABLES, LM)[hidden * 4: hidden * 5], np.int8)
    poke(root / L.TABLES, LM, hidden * 4, (-row.astype(np.int16)).astype(np.int8).tobytes())


def _swap_tables(root: Path) -> None:
    path = root / L.TABLES
    for a, b in ((EMBED, LM), (TF.scale_name(EMBED), TF.scale_name(LM))):
        da, db = _read(path, a), _read(path, b)
        poke(path, a, 0, db)
        poke(path, b, 0, da)


@pytest.mark.parametrize("mutate, tensors", [
    (_double_scale, {TF.scale_name(EMBED)}),
    (_negate_row, {LM}),
    (_swap_tables, {EMBED, LM, TF.scale_name(EMBED), TF.scale_name(LM)}),
], ids=["row-scale-x2", "lm-head-row-negated", "tables-swapped"])
def test_a_table_edited_or_swapped_is_seen_by_its_recorded_digest(fresh, mutate, tensors) -> None:
    """Valid tables by the rule, the wrong ones: only the digests migrate recorded can tell."""
    root = fresh("layout-2", "bf16", num_layers=4)
    mutate(root)
    assert verify(str(root)).ok
    deep = verify(str(root), deep=True)
    assert _errors(deep) == {"digest-mismatch"}
    assert {f.tensor for f in deep.findings if f.code == "digest-mismatch"} == tensors
    assert _gate_code(root) == "digest-mismatch"


def test_a_file_without_digests_is_judged_by_the_rule_alone(fresh) -> None:
    """The release's own tables file may carry no digests: nothing to compare, no finding."""
    root = fresh("layout-2", "bf16", num_layers=4)
    edit_header(L.TABLES, lambda h: h["__metadata__"].pop(TF.DIGESTS_KEY) and None)(root)
    _swap_tables(root)
    assert verify(str(root), deep=True).ok and _gate_code(root) is None


def test_a_malformed_digests_entry_is_a_note(fresh) -> None:
    root = fresh("layout-2", "bf16", num_layers=4)
    edit_header(L.TABLES, lambda h: h["__metadata__"].update(digests='{"lm_head.weight": "md5:00"}'))(root)
    report = verify(str(root), deep=True)
    notes = [f for f in report.findings if f.code == "tables-metadata"]
    assert report.ok and [f.severity for f in notes] == ["warning"] and "lm_head.weight" in notes[0].message


def test_a_digest_of_a_tensor_the_file_does_not_hold_is_a_note(fresh) -> None:
    root = fresh("layout-2", "bf16", num_layers=4)

    def stray(header: dict) -> None:
        digests = json.loads(header["__metadata__"][TF.DIGESTS_KEY])
        digests["model.gone.weight"] = "blake3:" + "0" * 64
        header["__metadata__"][TF.DIGESTS_KEY] = json.dumps(digests)

    edit_header(L.TABLES, stray)(root)
    report = verify(str(root), deep=True)
    notes = [f for f in report.findings if f.code == "tables-metadata"]
    assert report.ok and [f.severity for f in notes] == ["warning"] and "model.gone.weight" in notes[0].message


def test_digests_are_read_case_insensitively(fresh) -> None:
    """A hex digest means the same in either case: "BLAKE3:" and upper-case hex are the recorded digest."""
    root = fresh("layout-2", "bf16", num_layers=4)

    def upper(header: dict) -> None:
        digests = json.loads(header["__metadata__"][TF.DIGESTS_KEY])
        header["__metadata__"][TF.DIGESTS_KEY] = json.dumps({k: v.upper() for k, v in digests.items()})

    edit_header(L.TABLES, upper)(root)
    report = verify(str(root), deep=True)
    assert report.ok and not [f for f in report.findings if f.code == "tables-metadata"]
    _swap_tables(root)  # and they still catch an edit
    assert _gate_code(root) == "digest-mismatch"


# ---- false BROKEN before: served bit for bit ---------------------------------------------------

def test_an_extra_tensor_in_the_tables_file_is_a_warning(fresh) -> None:
    root = fresh("layout-2", "bf16", num_layers=4)

    def add(header: dict) -> None:
        end = max(t["data_offsets"][1] for k, t in header.items() if k != "__metadata__")
        header["notes.extra"] = {"dtype": "I8", "shape": [0], "data_offsets": [end, end]}

    edit_header(L.TABLES, add)(root)
    report = verify(str(root), deep=True)
    found = [f for f in report.findings if f.tensor == "notes.extra"]
    assert report.ok and [(f.code, f.severity) for f in found] == [("table-shape", "warning")]
    assert "ignores it" in found[0].message
    assert _gate_code(root) is None


@pytest.mark.parametrize("key", ["quality", "source_dtype", "clef_tables_format"])
def test_missing_provenance_metadata_is_a_warning(fresh, key: str) -> None:
    root = fresh("layout-2", "bf16", num_layers=4)
    edit_header(L.TABLES, lambda h: h["__metadata__"].pop(key) and None)(root)
    report = verify(str(root))
    found = [f for f in report.findings if f.code == "tables-metadata"]
    assert report.ok and [f.severity for f in found] == ["warning"] and key in found[0].message
    assert _gate_code(root) is None


def test_a_metadata_value_that_says_another_format_stays_an_error(fresh) -> None:
    root = fresh("layout-2", "bf16", num_layers=4)
    edit_header(L.TABLES, lambda h: h["__metadata__"].update(quantization="int8-asymmetric"))(root)
    found = [f for f in verify(str(root)).findings if f.code == "tables-metadata"]
    assert [f.severity for f in found] == ["error"] and "decoded with the wrong rule" in found[0].message


# ---- migrate: its output follows the rule and carries the digests ------------------------------

def test_migrate_records_digests_that_deep_and_the_gate_check(fresh) -> None:
    root = fresh("layout-1", "bf16", num_layers=4)
    report = migrate(str(root), str(root), Options(to="layout-2"))
    assert not _errors(report), report.findings
    h = read_header(root / L.TABLES)
    recorded, problem = TF.read_digests(h.metadata)
    assert problem is None and set(recorded) == set(h.tensors)
    assert verify(str(root), deep=True).ok and _gate_code(root) is None
    _negate_row(root)
    assert _errors(verify(str(root), deep=True)) == {"digest-mismatch"}


def test_migrate_refuses_to_finish_with_tables_that_break_the_rule(fresh, monkeypatch) -> None:
    """A writer bug (the scales of the first rows written as zeros): the run fails and rolls back."""
    import hashlib

    from clef_format.migrate import writer

    root = fresh("layout-1", "bf16", num_layers=4)
    real = writer.write_all_at

    def zero_scales(fd, data, offset):
        data = memoryview(data).cast("B")
        if data.nbytes % 4 == 0 and data.nbytes < 100_000:  # a scale tensor: the first four scales lost
            data = bytes(16) + bytes(data[16:])
        real(fd, data, offset)

    monkeypatch.setattr(writer, "write_all_at", zero_scales)
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}
    report = migrate(str(root), str(root), Options(to="layout-2"))
    assert _errors(report) == {"migrate-failed"}, report.findings
    failed = [f for f in report.findings if f.code == "migrate-failed"]
    assert failed and "break the format's rule" in failed[0].message, report.findings
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}
    assert after == before


# ---- the tokenizer the engine parses at start ---------------------------------------------------

@pytest.mark.parametrize("rel", L.TOKENIZER_FILES)
def test_a_truncated_tokenizer_file_is_refused_by_deep_and_the_gate(fresh, rel: str) -> None:
    root = fresh("layout-2", "bf16", num_layers=4)
    text = (root / rel).read_bytes()
    (root / rel).write_bytes(text[: len(text) // 2])
    assert verify(str(root)).ok  # the structure path does not parse it (its time bound: RESULTS.md)
    found = [f for f in verify(str(root), deep=True).findings if f.severity == "error"]
    assert [(f.code, f.file) for f in found] == [("bad-config", rel)] and "fails to start" in found[0].message
    assert _gate_code(root) == "bad-config"


# ---- the backbone: only download references know it; the gate can check them on request ------

def _fp8_scale_x2(root: Path) -> None:
    path, name = root / L.BACKBONE_SINGLE, "model.language_model.layers.1.mlp.down_proj.weight_scale"
    s = np.frombuffer(_read(path, name), np.float32) * 2
    poke(path, name, 0, s.astype(np.float32).tobytes())


def _layer_swapped(root: Path) -> None:
    path = root / L.BACKBONE_SINGLE
    other = _read(path, "model.language_model.layers.2.mlp.down_proj.weight")
    poke(path, "model.language_model.layers.1.mlp.down_proj.weight", 0, other)


@pytest.mark.parametrize("mutate", [_fp8_scale_x2, _layer_swapped], ids=["fp8-weight-scale-x2", "layer-tensor-swapped"])
def test_the_gate_checks_download_references(fresh, mutate) -> None:
    from clef_format.cli.main import main

    root = fresh("layout-2", "fp8", num_layers=4)
    assert main(["manifest", str(root), "--json"]) == 0
    mutate(root)
    assert _errors(verify(str(root), deep=True)) == {"hash-mismatch"}
    assert _gate_code(root) == "hash-mismatch"  # by default the gate hashes what the engine reads
    assert check_checkpoint(root, "0.2.0", check_references=False)  # the opt-out: no other check sees it
    with pytest.raises(IncompatibleError) as exc:
        check_checkpoint(root, "0.2.0", check_references=True)
    assert exc.value.code == "hash-mismatch" and L.BACKBONE_SINGLE in exc.value.reason
