"""The layout check (verify/checks/layout.py): which files a layout requires, where its tables must be,
the version marker, and what each finding names (file, tensor) and how it is fixed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from clef_format.read.checkpoint import read_checkpoint
from clef_format.spec import layouts as L
from clef_format.verify.checks.layout import check_layout
from tests.support.hostile_cases import edit_header

EMBED = "model.language_model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"


def _findings(root: Path) -> list[dict]:
    return [f.to_dict() for f in check_layout(read_checkpoint(root))]


def _set_marker(root: Path, value: object) -> None:
    config = json.loads((root / L.HEAD_CONFIG).read_text())
    config[L.MARKER_KEY] = value
    (root / L.HEAD_CONFIG).write_text(json.dumps(config))


def test_a_folder_without_backbone_is_one_missing_file_error_naming_both_forms(fresh) -> None:
    root = fresh("layout-2", "bf16")
    (root / L.BACKBONE_SINGLE).unlink()
    assert _findings(root) == [{
        "code": "missing-file", "severity": "error",
        "message": "no backbone: neither model.safetensors nor model.safetensors.index.json",
        "file": "model.safetensors", "fix": "download the checkpoint again; the backbone weights are missing"}]


def test_shards_the_index_names_but_that_are_absent_are_left_to_the_reader(fresh) -> None:
    """The reader already says which shards are missing: no second 'no backbone' error."""
    root = fresh("layout-2", "bf16", shards=3)
    index = json.loads((root / L.BACKBONE_INDEX).read_text())
    for shard in set(index["weight_map"].values()):
        (root / shard).unlink()
    ck = read_checkpoint(root)
    assert not ck.backbone_files and "missing-file" in {f.code for f in ck.findings}
    assert list(check_layout(ck)) == []


def test_a_backbone_beside_no_clef_head_is_an_unknown_layout(fresh) -> None:
    root = fresh("layout-2", "bf16")
    shutil.rmtree(root / "clef_head")
    assert _findings(root) == [{
        "code": "unknown-layout", "severity": "error",
        "message": "the files match no Clef layout (no joint head, or tables nowhere)",
        "fix": f"compare with the layouts in `clef-format verify --help`; re-download {root}"}]


def test_a_required_file_missing_is_an_error_on_that_file(fresh) -> None:
    root = fresh("layout-2", "bf16")
    (root / L.HEAD_CODE).unlink()
    assert _findings(root) == [{
        "code": "missing-file", "severity": "error", "message": f"{L.HEAD_CODE} is missing (layout-2 requires it)",
        "file": L.HEAD_CODE, "fix": "download this file from the same revision of the checkpoint"}]


def test_a_missing_tokenizer_file_is_a_warning_on_that_file(fresh) -> None:
    root = fresh("layout-2", "bf16")
    (root / "tokenizer.json").unlink()
    assert _findings(root) == [{
        "code": "missing-file", "severity": "warning", "message": "tokenizer.json is missing: serving needs the tokenizer",
        "file": "tokenizer.json", "fix": "download the tokenizer files from the same revision"}]


def test_a_top_level_safetensors_file_beside_a_single_backbone_is_stray_weights(fresh) -> None:
    root = fresh("layout-2", "bf16")
    shutil.copyfile(root / L.HEAD_WEIGHTS, root / "extra.safetensors")
    assert _findings(root) == [{
        "code": "stray-weights", "severity": "error",
        "message": "extra.safetensors is not part of the backbone (model.safetensors), but vLLM loads every top-level, "
                   "non-hidden .safetensors file beside it: its tensors would be loaded too",
        "file": "extra.safetensors", "fix": "remove or move extra.safetensors out of the checkpoint folder"}]


def test_layout_1_is_a_legacy_warning_whose_fix_migrates_this_path_to_layout_2(fresh) -> None:
    root = fresh("layout-1", "bf16")
    assert _findings(root) == [{
        "code": "legacy-layout", "severity": "warning",
        "message": "layout-1: BF16 tables inside the backbone; only clef-vllm < 0.2.0 serves it (the int8 layout-2 "
                   "tables take half the bytes on disk and in GPU memory)",
        "fix": f"clef-format migrate {root} --to layout-2; the result is served only by clef-vllm>=0.2.0 (a "
               "clef-vllm 0.1.x serves this layout-1 as it is: migrate when you upgrade the plugin)"}]


def test_a_layout_1_backbone_lacking_lm_head_is_tables_missing_on_that_tensor(fresh) -> None:
    root = fresh("layout-1", "bf16")

    def rename(header: dict) -> None:
        header["lm_head.weight_x"] = header.pop(LM_HEAD)

    edit_header(L.BACKBONE_SINGLE, rename)(root)
    findings = _findings(root)
    assert {"code": "tables-missing", "severity": "error",
            "message": f"{LM_HEAD} is missing from the backbone (layout-1 holds both tables there)",
            "tensor": LM_HEAD, "fix": "re-download the backbone"} in findings
    assert [f["tensor"] for f in findings if f["code"] == "tables-missing"] == [LM_HEAD]


def test_a_marked_head_beside_backbone_tables_and_no_tables_file_names_what_the_backbone_holds(fresh) -> None:
    """layout-1 files plus the marker: layout-2 (the marker decides), its tables file missing."""
    root = fresh("layout-1", "bf16")
    _set_marker(root, L.MARKER_VALUE)
    findings = _findings(root)
    assert [f["code"] for f in findings] == ["missing-file", "tables-missing"]
    assert findings[1] == {
        "code": "tables-missing", "severity": "error",
        "message": f"{L.TABLES} is missing (and the backbone still holds {EMBED}, {LM_HEAD})",
        "file": L.TABLES, "fix": "download clef_head/tables_int8.safetensors from the same revision"}


def test_tables_both_in_the_backbone_and_the_tables_file_are_duplicated_per_table(fresh, built) -> None:
    root = fresh("layout-1", "bf16")
    _set_marker(root, L.MARKER_VALUE)
    shutil.copyfile(built("layout-2", "bf16") / L.TABLES, root / L.TABLES)
    fix = ("re-download the backbone files of this revision: in layout-2 they do not hold the tables "
           f"({L.TABLES} does); no migration removes a duplicate")
    assert _findings(root) == [
        {"code": "tables-duplicated", "severity": "error", "message": f"{t} is both in the backbone and in {L.TABLES}",
         "file": L.BACKBONE_SINGLE, "tensor": t, "fix": fix} for t in (EMBED, LM_HEAD)]


def test_a_marker_admitting_old_plugins_is_invalid_with_the_edit_that_repairs_it(fresh) -> None:
    root = fresh("layout-2", "bf16")
    _set_marker(root, ">=0.1.0")
    (finding,) = _findings(root)
    assert finding["code"] == "marker-invalid" and finding["file"] == L.HEAD_CONFIG
    assert finding["fix"] == f'set "{L.MARKER_KEY}": "{L.MARKER_VALUE}" in {L.HEAD_CONFIG}'


def _gate_code(root: Path) -> str | None:
    from clef_format.compat import IncompatibleError, check_checkpoint

    try:
        check_checkpoint(root, "0.2.1")
    except IncompatibleError as exc:
        return exc.code
    return None


def test_a_hidden_top_level_safetensors_file_is_no_stray_weights(fresh) -> None:
    """vLLM's *.safetensors glob skips names starting with a dot (glob's rule): it never loads them."""
    import glob

    from clef_format.verify.run import verify

    root = fresh("layout-2", "bf16")
    shutil.copyfile(root / L.BACKBONE_SINGLE, root / ".hidden.safetensors")
    assert glob.glob(str(root / "*.safetensors")) == [str(root / L.BACKBONE_SINGLE)]
    assert _findings(root) == []
    report = verify(str(root))
    assert report.ok and report.findings == () and _gate_code(root) is None


@pytest.mark.parametrize("rel", L.TOKENIZER_FILES)
def test_an_empty_tokenizer_file_is_a_warning_like_a_missing_one(fresh, rel: str) -> None:
    root = fresh("layout-2", "bf16")
    (root / rel).write_bytes(b"")
    assert _findings(root) == [{
        "code": "missing-file", "severity": "warning", "message": f"{rel} is empty (0 bytes): serving needs the tokenizer",
        "file": rel, "fix": "download the tokenizer files from the same revision"}]


def test_an_index_that_is_not_json_is_its_bad_config_only(fresh) -> None:
    """The index exists: no 'no backbone: neither model.safetensors nor the index' on top of its finding."""
    from clef_format.verify.run import verify

    root = fresh("layout-2", "bf16", shards=3)
    (root / L.BACKBONE_INDEX).write_text('{"weight_map": ')
    report = verify(str(root))
    assert [(f.code, f.file) for f in report.findings if f.severity == "error"] == [("bad-config", L.BACKBONE_INDEX)]
    assert _gate_code(root) == "bad-config"


def test_an_index_naming_no_shard_says_so(fresh) -> None:
    root = fresh("layout-2", "bf16", shards=3)
    (root / L.BACKBONE_INDEX).write_text('{"weight_map": {}}')
    codes = [(f["code"], f["message"]) for f in _findings(root)]
    assert codes[0] == ("missing-file", f"no backbone: {L.BACKBONE_INDEX} maps no tensor to a shard")
