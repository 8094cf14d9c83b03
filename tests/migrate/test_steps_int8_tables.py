"""What ``clef-format migrate`` says and writes for step 0001_int8_tables, both ways, on real files:
the refusals a user reads for a backbone or tables file the step cannot convert (each names the
tensor and what is wrong), the bytes the dry run says it reads, the notes (the quantizer's and the
decoder's, with the relative errors the tables file records), the dtype the decoded tables come back
in (the ``source_dtype`` the tables file records, BF16 when it records none the format knows), and
the full table checks before a run (a NaN row, an int8 -128) in a dry run and a real one.

Written for survivors of the unsampled mutmut run over the migration steps (docs/TESTING.md).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from clef_format.migrations import v0001_int8_tables, v0002_repair_marker
from clef_format.migrate.plan import Decoded, QuantScales, QuantValues, Safetensors
from clef_format.read.checkpoint import read_checkpoint
from clef_format.read.safetensors import read_header
from clef_format.spec import layouts as L
from clef_format.spec import tables_format as TF
from tests.support.migrate import file_digests, run_json

EMBED, LM_HEAD = L.EMBED_TOKENS, L.LM_HEAD


# -- reading and writing safetensors files by hand (the format: 8-byte length, JSON header, data) ---------

def _load(path: Path) -> tuple[dict[str, list], dict[str, str]]:
    """name -> [dtype, shape, raw bytes] in file order, and the metadata."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    meta = head.pop("__metadata__", {})
    order = sorted(head, key=lambda k: head[k]["data_offsets"][0])
    data = raw[8 + n:]
    return {k: [head[k]["dtype"], list(head[k]["shape"]),
                data[head[k]["data_offsets"][0]:head[k]["data_offsets"][1]]] for k in order}, meta


def _save(path: Path, tensors: dict[str, list], meta: dict[str, str]) -> None:
    head: dict = {"__metadata__": meta} if meta else {}
    at = 0
    for name, (dtype, shape, data) in tensors.items():
        head[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + len(data)]}
        at += len(data)
    text = json.dumps(head, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(t[2] for t in tensors.values()))


def _edit(path: Path, change: Callable[[dict[str, list], dict[str, str]], None]) -> None:
    tensors, meta = _load(path)
    change(tensors, meta)
    _save(path, tensors, meta)


def _bf16_to_f16(data: bytes) -> bytes:
    f32 = (np.frombuffer(data, np.uint16).astype(np.uint32) << 16).view(np.float32)
    return f32.astype(np.float16).tobytes()


def _as_f16(tensors: dict[str, list], meta: dict[str, str], names=(EMBED, LM_HEAD)) -> None:
    for name in names:
        assert tensors[name][0] == "BF16"
        tensors[name][0], tensors[name][2] = "F16", _bf16_to_f16(tensors[name][2])


def _only_refusal(out: dict) -> dict:
    (finding,) = [f for f in out["findings"] if f["severity"] == "error"]
    return finding


def _plan(out: dict) -> dict:
    (only,) = out["steps"]
    return only["plan"]


def _decoded_note(dtype: str, figures: dict | None) -> str:
    return (f"the tables come back DECODED FROM INT8 as {dtype}, not the original BF16 download"
            + (f" (relative error {figures})" if figures else "")
            + "; for the exact original tables, re-download the layout-1 revision")


def _recorded_errors(root: Path) -> dict:
    quality = json.loads(read_header(root / L.TABLES).metadata["quality"])
    return {k: v["rel_error"] for k, v in quality.items()}


# -- upgrade: refusals -----------------------------------------------------------------------------------

def _mixed(t, m):
    _as_f16(t, m, names=(EMBED,))


def _lm_head_3d(t, m):
    t[LM_HEAD][1] = [t[LM_HEAD][1][0], 8, t[LM_HEAD][1][1] // 8]


def _lm_head_i32(t, m):  # the same bytes read as I32 [rows, hidden/2]
    t[LM_HEAD][0], t[LM_HEAD][1] = "I32", [t[LM_HEAD][1][0], t[LM_HEAD][1][1] // 2]


def _lm_head_1d(t, m):
    t[LM_HEAD][1] = [t[LM_HEAD][1][0] * t[LM_HEAD][1][1]]


def _no_lm_head(t, m):
    del t[LM_HEAD]


@pytest.mark.parametrize("change, message", [
    (_mixed, "the two tables have different dtypes ['BF16', 'F16']"),
    (_lm_head_3d, f"{LM_HEAD} is BF16[512, 8, 8]; expected a 2-D BF16/F16/F32 table"),
    (_lm_head_1d, f"{LM_HEAD} is BF16[32768]; expected a 2-D BF16/F16/F32 table"),
    (_lm_head_i32, f"{LM_HEAD} is I32[512, 32]; expected a 2-D BF16/F16/F32 table"),
    (_no_lm_head, f"{LM_HEAD} is not in the backbone: nothing to quantize"),
], ids=["mixed-dtypes", "3-d", "1-d", "i32", "missing"])
def test_upgrade_refuses_tables_it_cannot_quantize_saying_why(fresh, capsys, change, message: str) -> None:
    root = fresh("layout-1")
    _edit(root / L.BACKBONE_SINGLE, change)
    before = file_digests(root)
    for extra in (["--dry-run"], []):
        rc, out = run_json(capsys, str(root), *extra)
        assert rc == 1 and out["layout"] == "layout-1"
        finding = _only_refusal(out)
        assert (finding["code"], finding["message"]) == ("migrate-refused", message)
    assert file_digests(root) == before


def test_upgrade_without_a_head_config_is_refused_naming_the_file(fresh, capsys) -> None:
    root = fresh("layout-1")
    (root / L.HEAD_CONFIG).unlink()
    rc, out = run_json(capsys, str(root), "--dry-run")
    assert rc == 1 and out["layout"] == "layout-1"
    assert _only_refusal(out)["message"] == f"{L.HEAD_CONFIG} is missing or not a JSON object"


# -- upgrade: the plan a user approves ---------------------------------------------------------------------

def test_upgrade_plan_reads_every_tensor_byte_of_the_backbone_once_and_says_what_it_does(built, capsys) -> None:
    """The backbone is read once in full (the tables to quantize, every other tensor to copy): its data
    section, file size minus the header, is what the dry run says it reads from it."""
    root = built("layout-1")
    path = root / L.BACKBONE_SINGLE
    (header_len,) = struct.unpack("<Q", path.read_bytes()[:8])
    rc, out = run_json(capsys, str(root), "--dry-run")
    assert rc == 0
    plan = _plan(out)
    assert plan["read"][L.BACKBONE_SINGLE] == path.stat().st_size - 8 - header_len
    assert plan["notes"] == [f"quantizes {EMBED}, {LM_HEAD} (BF16) to int8 with one scale per row; "
                             "the BF16 originals are removed from the backbone"]


def test_step_plans_name_their_checkpoint_and_where_each_table_byte_comes_from(built) -> None:
    """The step functions' own plans (the API under the CLI): each names the checkpoint it was planned
    from; the upgrade quantizes each table from its rows in the backbone, its scales one per row; the
    downgrade decodes each table from its own int8 values and scales in the tables file."""
    root1 = built("layout-1")
    ck = read_checkpoint(root1)
    up = v0001_int8_tables.upgrade(ck)
    assert up.source == ck.root
    (tables,) = [o for o in up.outputs if isinstance(o, Safetensors) and o.rel == L.TABLES]
    head = read_header(root1 / L.BACKBONE_SINGLE)
    by_name = {t.name: t for t in tables.tensors}
    for name in L.TABLE_NAMES:
        info = head.tensors[name]
        rows, hidden = info.shape
        assert by_name[name].source == QuantValues(name, L.BACKBONE_SINGLE, head.data_start + info.begin,
                                                   "BF16", rows, hidden)
        assert (by_name[TF.scale_name(name)].shape, by_name[TF.scale_name(name)].source) == (
            (rows, 1), QuantScales(name, rows))

    root2 = built("layout-2")
    ck2 = read_checkpoint(root2)
    down = v0001_int8_tables.downgrade(ck2)
    assert down.source == ck2.root
    theads = read_header(root2 / L.TABLES)
    decoded = {t.name: t.source for o in down.outputs if isinstance(o, Safetensors) for t in o.tensors
               if isinstance(t.source, Decoded)}
    assert set(decoded) == set(L.TABLE_NAMES)
    for name, src in decoded.items():
        q, s = theads.tensors[name], theads.tensors[TF.scale_name(name)]
        assert src == Decoded(name, L.TABLES, theads.data_start + q.begin, theads.data_start + s.begin,
                              q.shape[0], q.shape[1], "BF16")
    unmarked = read_checkpoint(built("layout-2-unmarked"))
    assert v0002_repair_marker.upgrade(unmarked).source == unmarked.root


# -- downgrade ---------------------------------------------------------------------------------------------

def test_downgrade_plan_names_the_step_and_the_recorded_relative_errors(built, capsys) -> None:
    root = built("layout-2")
    rc, out = run_json(capsys, str(root), "--to", "layout-1", "--dry-run")
    assert rc == 0
    plan = _plan(out)
    step = v0001_int8_tables
    assert (plan["revision"], plan["direction"], plan["from"], plan["to"]) == (
        step.revision, "downgrade", step.to_layout, step.from_layout)
    figures = _recorded_errors(root)
    assert set(figures) == set(L.TABLE_NAMES) and all(isinstance(v, float) and v > 0 for v in figures.values())
    assert plan["notes"] == [_decoded_note("BF16", figures)]


@pytest.mark.parametrize("quality", [None, "not json"], ids=["absent", "unparsable"])
def test_downgrade_note_without_usable_quality_figures_says_none(fresh, capsys, quality: str | None) -> None:
    root = fresh("layout-2")

    def change(t, m):
        if quality is None:
            del m["quality"]
        else:
            m["quality"] = quality
    _edit(root / L.TABLES, change)
    rc, out = run_json(capsys, str(root), "--to", "layout-1", "--dry-run")
    assert rc == 0
    assert _plan(out)["notes"] == [_decoded_note("BF16", None)]


@pytest.mark.parametrize("recorded", ["F64", "bf16", None], ids=["unknown", "lowercase", "absent"])
def test_downgrade_decodes_to_bf16_when_the_recorded_source_dtype_is_not_one_the_format_knows(
        fresh, capsys, recorded: str | None) -> None:
    root = fresh("layout-2")

    def change(t, m):
        if recorded is None:
            del m["source_dtype"]
        else:
            m["source_dtype"] = recorded
    _edit(root / L.TABLES, change)
    rc, out = run_json(capsys, str(root), "--to", "layout-1", "--dry-run")
    assert rc == 0
    assert _plan(out)["notes"] == [_decoded_note("BF16", _recorded_errors(root))]
    rc, out = run_json(capsys, str(root), "--to", "layout-1")
    assert rc == 0 and out["layout"] == "layout-1"
    head = read_header(root / L.BACKBONE_SINGLE)
    assert {name: head.tensors[name].dtype for name in L.TABLE_NAMES} == {EMBED: "BF16", LM_HEAD: "BF16"}


def test_f16_tables_go_to_layout_2_and_come_back_as_f16(fresh, capsys) -> None:
    """A layout-1 whose tables are F16: the tables file records F16 as their source dtype, and the way
    back decodes them to F16 (the note says so), close to the F16 originals."""
    root = fresh("layout-1")
    _edit(root / L.BACKBONE_SINGLE, _as_f16)
    originals, _ = _load(root / L.BACKBONE_SINGLE)
    rc, out = run_json(capsys, str(root))
    assert rc == 0 and out["layout"] == "layout-2", out
    assert read_header(root / L.TABLES).metadata["source_dtype"] == "F16"
    figures = _recorded_errors(root)
    rc, out = run_json(capsys, str(root), "--to", "layout-1")
    assert rc == 0 and out["layout"] == "layout-1", out
    assert _plan(out)["notes"] == [_decoded_note("F16", figures)]
    back, _ = _load(root / L.BACKBONE_SINGLE)
    for name in L.TABLE_NAMES:
        assert back[name][:2] == originals[name][:2] == ["F16", originals[name][1]]
        a = np.frombuffer(originals[name][2], np.float16).astype(np.float64)
        b = np.frombuffer(back[name][2], np.float16).astype(np.float64)
        assert 0 < np.linalg.norm(a - b) / np.linalg.norm(a) < 0.03


def _no_scale(t, m):
    del t[TF.scale_name(LM_HEAD)]


def _no_values(t, m):
    del t[LM_HEAD]


def _flat_values(t, m):
    t[LM_HEAD][1] = [t[LM_HEAD][1][0] * t[LM_HEAD][1][1]]


@pytest.mark.parametrize("change", [_no_scale, _no_values, _flat_values], ids=["no-scale", "no-values", "1-d"])
def test_downgrade_refuses_a_tables_file_without_a_table_or_its_scale(fresh, capsys, change) -> None:
    root = fresh("layout-2")
    _edit(root / L.TABLES, change)
    before = file_digests(root)
    rc, out = run_json(capsys, str(root), "--to", "layout-1", "--dry-run")
    assert rc == 1 and out["layout"] == "layout-2"
    finding = _only_refusal(out)
    assert (finding["code"], finding["message"]) == ("migrate-refused", f"{L.TABLES} lacks {LM_HEAD} or its scale")
    assert file_digests(root) == before


def test_downgrade_refuses_an_unreadable_tables_file(fresh, capsys) -> None:
    root = fresh("layout-2")
    (root / L.TABLES).write_bytes(b"\xff" * 64)
    rc, out = run_json(capsys, str(root), "--to", "layout-1", "--dry-run")
    assert rc == 1 and out["layout"] == "layout-2"
    assert _only_refusal(out)["message"] == f"{L.TABLES} is missing or unreadable: nothing to decode"


# -- the full table checks before a run ------------------------------------------------------------------

def _nan_row(root: Path, row: int) -> None:
    ck = read_checkpoint(root)
    rel = ck.tensor_file[EMBED]
    head = read_header(root / rel)
    info = head.tensors[EMBED]
    with open(root / rel, "r+b") as fh:
        fh.seek(head.data_start + info.begin + row * info.shape[1] * 2 + 6)
        fh.write(struct.pack("<H", 0x7FC0))  # BF16 NaN


def _minus_128(root: Path, row: int) -> None:
    head = read_header(root / L.TABLES)
    info = head.tensors[EMBED]
    with open(root / L.TABLES, "r+b") as fh:
        fh.seek(head.data_start + info.begin + row * info.shape[1] + 3)
        fh.write(b"\x80")


def test_a_nan_row_is_refused_by_the_dry_run_and_by_the_quantizer_of_the_real_run(fresh, capsys) -> None:
    """The dry run scans the BF16 tables in full and names the table and the row; the real run leaves
    that scan to its quantizer (one read of the tables), which refuses the same row before any swap."""
    root = fresh("layout-1")
    _nan_row(root, 7)
    before = file_digests(root)
    rc, out = run_json(capsys, str(root), "--dry-run")
    assert rc == 1
    finding = _only_refusal(out)
    assert finding["code"] == "table-nonfinite" and finding["message"].startswith(f"{EMBED}: 1 value(s) NaN")
    assert "rows [7]" in finding["message"]
    rc, out = run_json(capsys, str(root))
    assert rc == 1
    finding = _only_refusal(out)
    assert (finding["code"], finding["message"]) == (
        "table-nonfinite", "1 row(s) hold NaN or Inf, first: [7]: quantizing would hide them; nothing was changed")
    assert file_digests(root) == before


@pytest.mark.parametrize("layout, to, revision", [("layout-2", "layout-1", "0001_int8_tables"),
                                                  ("layout-2-unmarked", "layout-2", "0002_repair_marker")])
def test_an_int8_minus_128_is_refused_before_decoding_or_marking(fresh, capsys, layout: str, to: str,
                                                                 revision: str) -> None:
    root = fresh(layout)
    _minus_128(root, 5)
    before = file_digests(root)
    for extra in (["--dry-run"], []):
        rc, out = run_json(capsys, str(root), "--to", to, *extra)
        assert rc == 1 and out["layout"] == layout
        finding = _only_refusal(out)
        assert finding["code"] == "migrate-refused"
        assert finding["message"].startswith(f"{EMBED}: 1 value(s) -128")
        assert finding["message"].endswith(f"the tables do not follow the format; {revision} would serve or decode them")
    assert file_digests(root) == before
