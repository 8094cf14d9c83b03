"""The int8 tables file check (verify/checks/tables.py): each tensor the format defines is there with
its dtype and shape, nothing else is, the metadata matches the format and the tables, and a table is
read in chunks that keep its elements whole."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from clef_format.read.checkpoint import read_checkpoint
from clef_format.spec import layouts as L
from clef_format.spec import tables_format as TF
from clef_format.verify.checks import tables
from clef_format.verify.checks.tables import check_tables
from tests.support.hostile_cases import edit_header

FIX = ("re-download clef_head/tables_int8.safetensors, or re-create it from a layout-1 copy of the same revision: "
       "clef-format migrate COPY --to layout-2")
LM_SCALE = "lm_head.weight_scale"


def _findings(root: Path) -> list[dict]:
    return [f.to_dict() for f in check_tables(read_checkpoint(root))]


def test_a_renamed_scale_is_one_missing_and_one_undefined_tensor(fresh) -> None:
    root = fresh("layout-2", "bf16")

    def rename(header: dict) -> None:
        header["lm_head.weight_scales"] = header.pop(LM_SCALE)

    edit_header(L.TABLES, rename)(root)
    assert _findings(root) == [
        {"code": "table-shape", "severity": "error", "message": f"{L.TABLES} lacks {LM_SCALE}", "file": L.TABLES,
         "tensor": LM_SCALE, "fix": FIX},
        {"code": "table-shape", "severity": "warning",
         "message": f"{L.TABLES} holds lm_head.weight_scales, which the format does not define: the plugin reads "
                    "the tables by name and ignores it (it only costs disk space)", "file": L.TABLES,
         "tensor": "lm_head.weight_scales", "fix": f"remove lm_head.weight_scales from {L.TABLES}, or leave it"},
        {"code": "tables-metadata", "severity": "warning",
         "message": f"{L.TABLES}: metadata 'digests' records 1 tensor(s) the file does not hold ({LM_SCALE}): a "
                    "tensor renamed or dropped after the digests were written (provenance only: no loader reads it)",
         "file": L.TABLES, "fix": "nothing to do to serve: no loader reads it (the tables file a migration "
                                        "from a layout-1 copy writes records it)"}]


def test_a_scale_of_another_shape_names_both_shapes_and_the_config_sizes(fresh) -> None:
    root = fresh("layout-2", "bf16")

    def reshape(header: dict) -> None:
        header[LM_SCALE]["shape"] = [256, 2]

    edit_header(L.TABLES, reshape)(root)
    assert _findings(root) == [
        {"code": "table-shape", "severity": "error",
         "message": f"{LM_SCALE} is F32[256, 2], expected F32[512, 1] (vocab 512, hidden 64)", "file": L.TABLES,
         "tensor": LM_SCALE, "fix": FIX}]


def test_quality_metadata_of_other_tables_than_the_files_is_a_metadata_note(fresh) -> None:
    root = fresh("layout-2", "bf16")

    def drop_embed_quality(header: dict) -> None:
        quality = json.loads(header["__metadata__"]["quality"])
        del quality["model.language_model.embed_tokens.weight"]
        header["__metadata__"]["quality"] = json.dumps(quality)

    edit_header(L.TABLES, drop_embed_quality)(root)
    assert _findings(root) == [
        {"code": "tables-metadata", "severity": "warning",
         "message": f"{L.TABLES}: metadata 'quality' describes ['lm_head.weight'], expected the tables "
                    "['lm_head.weight', 'model.language_model.embed_tokens.weight'] (provenance only: no loader "
                    "reads it)",
         "file": L.TABLES, "fix": "nothing to do to serve: no loader reads it (the tables file a migration "
                                        "from a layout-1 copy writes records it)"}]


def _f32_file(path: Path, values: list[float]) -> int:
    path.write_bytes(struct.pack(f"<{len(values)}f", *values))
    return 4 * len(values)


def test_a_chunk_size_that_is_no_multiple_of_the_element_width_keeps_elements_whole(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    """A 1001-byte chunk is read as 1000 bytes of F32: the NaN at element 700 (bytes 2800..2803) is found there."""
    monkeypatch.setattr(tables, "CHUNK", 1001)
    values = [1.0] * 1000
    values[700] = float("nan")
    nbytes = _f32_file(tmp_path / "t.bin", values)
    calls = []

    def rule(data: bytes) -> TF.Problems:
        calls.append(len(data))
        assert len(calls) <= 10, "the scan does not advance"
        return TF.float_problems("F32", data)

    with open(tmp_path / "t.bin", "rb") as fh:
        p = tables._scan(fh, 0, nbytes, 4, rule)
    assert calls == [1000, 1000, 1000, 1000]
    assert p.counts == {"nonfinite": 1} and p.first["nonfinite"] == [700]


def test_a_table_shorter_than_its_header_says_stops_the_scan(tmp_path: Path) -> None:
    nbytes = _f32_file(tmp_path / "t.bin", [1.0] * 4)
    with open(tmp_path / "t.bin", "rb") as fh, pytest.raises(OSError, match="changed size while a table was read"):
        tables._scan(fh, 0, nbytes + 8, 4, lambda d: TF.float_problems("F32", d))
