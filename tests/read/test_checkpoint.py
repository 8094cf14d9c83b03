"""Reading a checkpoint's structure (read/checkpoint.py): every finding reading itself produces, with
its code, file and fix, on real checkpoints from the fixture builders changed one way at a time."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from clef_format.read.checkpoint import MAX_JSON_BYTES, read_checkpoint

INDEX = "model.safetensors.index.json"
SHARD1 = "model-00001-of-00002.safetensors"
SHARD2 = "model-00002-of-00002.safetensors"
UNREADABLE_FIX = "make it readable (chmod / chown), or run as a user who can read the whole checkpoint"


def _sharded(fresh) -> Path:
    return fresh(shards=2)


def _index(root: Path) -> dict:
    return json.loads((root / INDEX).read_text())


def _write_index(root: Path, index: dict) -> None:
    (root / INDEX).write_text(json.dumps(index))


def _found(root: Path, code: str | None = None) -> list[dict]:
    return [f.to_dict() for f in read_checkpoint(root).findings if code is None or f.code == code]


def _a_tensor_of(root: Path, shard: str) -> str:
    return next(name for name, file in _index(root)["weight_map"].items() if file == shard)


def test_the_pristine_sharded_checkpoint_reads_clean(fresh) -> None:
    root = _sharded(fresh)
    ck = read_checkpoint(root)
    assert ck.findings == [] and ck.backbone_files == [SHARD1, SHARD2]
    assert ck.hf_snapshot is False


def test_a_tensor_the_index_does_not_name_is_an_index_mismatch(fresh) -> None:
    root = _sharded(fresh)
    index = _index(root)
    name = _a_tensor_of(root, SHARD2)
    del index["weight_map"][name]
    _write_index(root, index)
    assert _found(root) == [{
        "code": "index-mismatch", "severity": "error", "message": f"{name} is in {SHARD2} but not in the index",
        "file": SHARD2, "tensor": name, "fix": "re-download the index"}]


def test_a_tensor_the_index_maps_to_the_other_shard_is_reported_from_both_sides(fresh) -> None:
    root = _sharded(fresh)
    index = _index(root)
    name = _a_tensor_of(root, SHARD2)
    index["weight_map"][name] = SHARD1
    _write_index(root, index)
    assert _found(root) == [
        {"code": "index-mismatch", "severity": "error", "message": f"index maps {name} to {SHARD1}, whose header lacks it",
         "file": SHARD1, "tensor": name, "fix": "re-download the shard and the index"},
        {"code": "index-mismatch", "severity": "error", "message": f"{name} is in {SHARD2} but the index maps it elsewhere",
         "file": SHARD2, "tensor": name, "fix": "re-download the shard and the index"},
    ]


@pytest.mark.parametrize("index", [{"metadata": {}}, {"weight_map": ["a", "b"]}, {"weight_map": {"a": 1}}, ["weight_map"]])
def test_an_index_without_a_weight_map_of_names_is_bad_config(fresh, index) -> None:
    root = _sharded(fresh)
    _write_index(root, index)
    ck = read_checkpoint(root)
    assert [f.to_dict() for f in ck.findings] == [{
        "code": "bad-config", "severity": "error", "message": f"{INDEX} has no weight_map of tensor -> file",
        "file": INDEX, "fix": "restore the file from the original download"}]
    assert ck.backbone_files == [] and ck.backbone == {}


@pytest.mark.parametrize("value", ["../model-00002-of-00002.safetensors", "/etc/passwd", "a/../../x.safetensors"])
def test_an_index_entry_leaving_the_checkpoint_is_a_path_escape_and_never_read(fresh, value: str) -> None:
    root = _sharded(fresh)
    index = _index(root)
    name = _a_tensor_of(root, SHARD2)
    index["weight_map"][name] = value
    _write_index(root, index)
    found = _found(root, "path-escape")
    assert found == [{
        "code": "path-escape", "severity": "error",
        "message": f"index entry {value!r} leads outside the checkpoint; never read",
        "file": INDEX, "fix": "restore the index from the original download"}]


def test_a_shard_the_index_names_but_absent_is_a_missing_file(fresh) -> None:
    root = _sharded(fresh)
    (root / SHARD2).unlink()
    ck = read_checkpoint(root)
    assert [f.to_dict() for f in ck.findings] == [{
        "code": "missing-file", "severity": "error", "message": f"shard {SHARD2} named by the index is missing",
        "file": SHARD2, "fix": "re-download the missing shard"}]
    assert ck.backbone_files == [SHARD1]


def test_a_truncated_shard_is_a_bad_header_with_the_redownload_fix(fresh) -> None:
    root = _sharded(fresh)
    raw = (root / SHARD2).read_bytes()
    (root / SHARD2).write_bytes(raw[:-1])
    (finding,) = _found(root)
    assert finding["code"] == "bad-header" and finding["file"] == SHARD2
    assert finding["message"].startswith(f"{SHARD2}: ")
    assert finding["fix"] == "re-download this file; a truncated or corrupted download looks like this"


def test_a_json_file_over_the_limit_is_not_read(fresh) -> None:
    root = _sharded(fresh)
    with open(root / INDEX, "r+b") as fh:
        fh.truncate(MAX_JSON_BYTES + 1)  # sparse: costs no disk
    ck = read_checkpoint(root)
    assert [f.to_dict() for f in ck.findings] == [{
        "code": "bad-config", "severity": "error",
        "message": f"{INDEX} is {MAX_JSON_BYTES + 1} bytes, over the {MAX_JSON_BYTES} limit; not read",
        "file": INDEX, "fix": "restore the file from the original download"}]


def test_a_config_that_is_not_json_is_bad_config_naming_the_file(fresh) -> None:
    root = fresh()
    (root / "config.json").write_text('{"architectures": ')
    ck = read_checkpoint(root)
    (finding,) = [f.to_dict() for f in ck.findings if f.code == "bad-config"]
    assert finding["file"] == "config.json" and finding["message"].startswith("config.json is not valid JSON: ")
    assert finding["fix"] == "restore the file from the original download"
    assert ck.config is None


def test_a_config_the_model_spec_refuses_is_bad_config_with_its_reason(fresh) -> None:
    root = fresh()
    config = json.loads((root / "config.json").read_text())
    config["architectures"] = []
    (root / "config.json").write_text(json.dumps(config))
    ck = read_checkpoint(root)
    assert [f.to_dict() for f in ck.findings if f.code == "bad-config"] == [{
        "code": "bad-config", "severity": "error", "message": "config.json: architectures must be a non-empty list of names",
        "file": "config.json", "fix": "restore config.json from the original download"}]
    assert ck.model is None


def test_a_file_symlink_leading_outside_is_a_path_escape_naming_the_target(fresh, tmp_path: Path) -> None:
    root = fresh()
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    (root / "tokenizer.json").unlink()
    (root / "tokenizer.json").symlink_to(outside)
    ck = read_checkpoint(root)
    assert [f.to_dict() for f in ck.findings] == [{
        "code": "path-escape", "severity": "error",
        "message": f"tokenizer.json is a symlink leading outside the checkpoint (to {os.path.realpath(outside)}); never read",
        "file": "tokenizer.json", "fix": "replace the symlink with the real file"}]
    assert "tokenizer.json" not in ck.files


def test_a_directory_symlink_inside_is_not_followed_and_warned(fresh) -> None:
    root = fresh()
    (root / "alias").symlink_to(root / "clef_head", target_is_directory=True)
    ck = read_checkpoint(root)
    assert [f.to_dict() for f in ck.findings] == [{
        "code": "path-escape", "severity": "warning", "message": "directory symlink alias is not followed",
        "file": "alias", "fix": "replace the symlink with a real directory"}]
    assert not [rel for rel in ck.files if rel.startswith("alias/")]


def test_a_directory_symlink_leading_outside_is_an_error_and_not_followed(fresh, tmp_path: Path) -> None:
    root = fresh()
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "secret.json").write_text("{}")
    (root / "extra").symlink_to(outside, target_is_directory=True)
    ck = read_checkpoint(root)
    assert [f.to_dict() for f in ck.findings] == [{
        "code": "path-escape", "severity": "error",
        "message": f"directory symlink extra leads outside the checkpoint (to {os.path.realpath(outside)}); not followed",
        "file": "extra", "fix": "replace the symlink with the directory it should contain"}]
    assert "extra/secret.json" not in ck.files


def test_an_unfinished_download_is_a_partial_download(fresh) -> None:
    root = fresh()
    (root / "model-00002-of-00002.safetensors.incomplete").write_bytes(b"\0" * 16)
    ck = read_checkpoint(root)
    assert [f.to_dict() for f in ck.findings] == [{
        "code": "partial-download", "severity": "error",
        "message": "model-00002-of-00002.safetensors.incomplete is an unfinished download",
        "file": "model-00002-of-00002.safetensors.incomplete",
        "fix": "re-run the download (huggingface-cli download / snapshot_download) to finish it"}]


@pytest.mark.parametrize("name", ["pytorch_model.bin", "sub/weights.PT"])
def test_a_pickle_weight_file_is_unsafe_and_never_loaded(fresh, name: str) -> None:
    root = fresh()
    (root / name).parent.mkdir(exist_ok=True)
    (root / name).write_bytes(b"\x80\x04not really a pickle")
    ck = read_checkpoint(root)
    assert [f.to_dict() for f in ck.findings] == [{
        "code": "unsafe-file", "severity": "error",
        "message": f"{name} is a pickle-based weight file; clef-format never loads it",
        "file": name, "fix": "delete it: Clef checkpoints ship safetensors only"}]
    assert name not in ck.files


def test_a_broken_symlink_is_a_missing_file(fresh) -> None:
    root = fresh()
    (root / "tokenizer.json").unlink()
    (root / "tokenizer.json").symlink_to(root / "gone.json")
    (finding,) = _found(root)
    assert finding == {"code": "missing-file", "severity": "error",
                       "message": "tokenizer.json is a broken symlink: No such file or directory",
                       "file": "tokenizer.json", "fix": "restore the file (re-download it)"}


def test_a_file_that_cannot_be_statted_is_unreadable_with_the_os_reason(fresh) -> None:
    root = fresh()
    (root / "long.json").symlink_to("a" * 300)  # a component over NAME_MAX: ENAMETOOLONG, even for root
    ck = read_checkpoint(root)
    assert [f.to_dict() for f in ck.findings] == [{
        "code": "unreadable", "severity": "error", "message": "long.json cannot be read: File name too long",
        "file": "long.json", "fix": UNREADABLE_FIX}]
    assert ck.unreadable == {"long.json"}


def test_a_folder_that_cannot_be_listed_is_unreadable(fresh) -> None:
    """A folder nested past PATH_MAX cannot be listed by path (even by root): reported, not skipped."""
    root = fresh()
    part = "d" * 250
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(18):  # 18 * 251 > 4096
            os.mkdir(part, dir_fd=fd)
            new = os.open(part, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = new
    finally:
        os.close(fd)
    ck = read_checkpoint(root)
    (finding,) = [f.to_dict() for f in ck.findings]
    assert finding["code"] == "unreadable" and finding["fix"] == UNREADABLE_FIX
    assert finding["file"].startswith(part + "/") and set(finding["file"].split("/")) == {part}
    assert finding["message"] == f"{finding['file']} cannot be listed: File name too long"
    assert ck.unreadable == {finding["file"]}
