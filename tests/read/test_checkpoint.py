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


NOTE = ("vLLM loads it anyway (it reads every tensor of every file the index names), but transformers' "
        "from_pretrained lists the checkpoint's keys from the index entries and may report it missing")


def test_a_tensor_the_index_does_not_name_is_an_index_mismatch_warning(fresh) -> None:
    """vLLM reads every tensor of every indexed file: the entry changes nothing it loads (a note)."""
    root = _sharded(fresh)
    index = _index(root)
    name = _a_tensor_of(root, SHARD2)
    del index["weight_map"][name]
    _write_index(root, index)
    assert _found(root) == [{
        "code": "index-mismatch", "severity": "warning", "message": f"{name} is in {SHARD2} but not in the index: "
        f"{NOTE}", "file": SHARD2, "tensor": name, "fix": "re-download the index"}]


def test_a_tensor_the_index_maps_to_the_other_shard_is_one_warning(fresh) -> None:
    root = _sharded(fresh)
    index = _index(root)
    name = _a_tensor_of(root, SHARD2)
    index["weight_map"][name] = SHARD1
    _write_index(root, index)
    assert _found(root) == [
        {"code": "index-mismatch", "severity": "warning",
         "message": f"{name} is in {SHARD2} but the index maps it to {SHARD1}: {NOTE}",
         "file": SHARD2, "tensor": name, "fix": "re-download the index"},
    ]


def test_an_index_entry_for_a_tensor_no_indexed_file_holds_stays_an_error(fresh) -> None:
    root = _sharded(fresh)
    index = _index(root)
    index["weight_map"]["model.language_model.ghost.weight"] = SHARD1
    _write_index(root, index)
    assert _found(root) == [
        {"code": "index-mismatch", "severity": "error",
         "message": f"index maps model.language_model.ghost.weight to {SHARD1}, whose header lacks it, and no file "
                    "the index names holds it: a loader that follows the index fails on it",
         "file": SHARD1, "tensor": "model.language_model.ghost.weight", "fix": "re-download the shard and the index"},
    ]


def test_a_key_twice_with_the_same_value_is_a_warning_and_with_another_an_error(fresh) -> None:
    root = _sharded(fresh)
    text = (root / INDEX).read_text()
    same = json.dumps(_index(root)["metadata"])
    (root / INDEX).write_text(text.replace("{", '{"metadata": ' + same + ", ", 1))
    found = _found(root)
    assert [(f["code"], f["severity"]) for f in found] == [("bad-config", "warning")], found
    assert "twice with the same value" in found[0]["message"]
    (root / INDEX).write_text(text.replace("{", '{"metadata": {"total_size": 1}, ', 1))  # another value
    assert [(f["code"], f["severity"]) for f in _found(root)] == [("bad-config", "error")]


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


# --- weight_map values vLLM would not match (F-idx) -------------------------------------------------


def _verdicts(root: Path) -> tuple[list[dict], str | None]:
    """verify's findings and the serving gate's refusal code (``None``: it serves) on the same folder."""
    from clef_format.compat import IncompatibleError, check_checkpoint
    from clef_format.verify.run import verify

    report = verify(str(root))
    try:
        check_checkpoint(root, "0.2.1")
        code = None
    except IncompatibleError as exc:
        code = exc.code
    errors = [f.to_dict() for f in report.findings if f.severity == "error"]
    assert (code is None) == (not errors) and (code is None or code == errors[0]["code"]), (code, errors)
    return [f.to_dict() for f in report.findings], code


@pytest.mark.parametrize("value, plain, move", [
    (f"./{SHARD2}", SHARD2, ""),
    (f"sub/../{SHARD2}", SHARD2, ""),
    (f"sub/{SHARD2}", SHARD2, f" and move sub/{SHARD2} to the checkpoint's top level"),
    (f".{SHARD2}", f".{SHARD2}", ""),
])
def test_an_index_entry_vllm_would_not_match_is_an_index_mismatch_naming_it(fresh, value: str, plain: str,
                                                                            move: str) -> None:
    """vLLM keeps a shard only when os.path.join(folder, entry) equals a path its *.safetensors glob
    returned: any other string (./x, sub/../x, sub/x, a hidden name) is refused, however it normalises."""
    root = _sharded(fresh)
    index = _index(root)
    names = sorted(n for n, f in index["weight_map"].items() if f == SHARD2)
    for n in names:
        index["weight_map"][n] = value
    _write_index(root, index)
    member = os.path.normpath(value)
    if member != SHARD2:
        (root / member).parent.mkdir(exist_ok=True)
        os.rename(root / SHARD2, root / member)
    found, code = _verdicts(root)
    assert found == [{
        "code": "index-mismatch", "severity": "error",
        "message": f"index entry {value!r} (for {names[0]} and {len(names) - 1} more tensor(s)): vLLM refuses to load the "
                   "checkpoint: it compares os.path.join(folder, entry) with the top-level *.safetensors files it globbed, "
                   "as strings, and this entry is no plain, non-hidden top-level .safetensors file name "
                   "(FileNotFoundError: Weight files referenced in index but missing)",
        "file": INDEX, "tensor": names[0],
        "fix": f"write the plain file name {plain!r} for these entries in {INDEX}{move}"}]
    assert code == "index-mismatch"


def test_a_dotdot_entry_that_stays_inside_is_not_a_path_escape(fresh) -> None:
    root = _sharded(fresh)
    index = _index(root)
    name = _a_tensor_of(root, SHARD2)
    index["weight_map"][name] = f"clef_head/../{SHARD2}"
    _write_index(root, index)
    assert [f["code"] for f in _found(root)] == ["index-mismatch"]


# --- files verify does not parse are still opened (F-unread) -----------------------------------------

SETPRIV = __import__("shutil").which("setpriv")
UNPRIVILEGED = ([SETPRIV, "--bounding-set=-dac_override,-dac_read_search", "--"]
                if SETPRIV and os.geteuid() == 0 else [])
_PROBE = """
import json, sys
from clef_format.compat import IncompatibleError, check_checkpoint
from clef_format.verify.run import verify
r = verify(sys.argv[1])
try:
    check_checkpoint(sys.argv[1], "0.2.1"); gate = None
except IncompatibleError as exc:
    gate = exc.code
print(json.dumps({"codes": [[f.code, f.file] for f in r.findings], "gate": gate}))
"""


@pytest.mark.skipif(os.geteuid() == 0 and not SETPRIV, reason="root without setpriv: permissions are not enforced")
@pytest.mark.parametrize("rel", ["tokenizer.json", "tokenizer_config.json", "generation_config.json",
                                 "chat_template.jinja", "joint_schema_model.py", "NOTES.md"])
def test_a_file_nothing_parses_that_cannot_be_opened_is_unreadable_for_verify_and_the_gate(fresh, rel: str) -> None:
    import subprocess
    import sys

    root = fresh("layout-2")
    if rel == "NOTES.md":
        (root / rel).write_text("notes")
    (root / rel).chmod(0)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([*UNPRIVILEGED, sys.executable, "-c", _PROBE, str(root)], capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out == {"codes": [["unreadable", rel]], "gate": "unreadable"}
    cli = subprocess.run([*UNPRIVILEGED, sys.executable, "-m", "clef_format", "verify", str(root), "--json"],
                         capture_output=True, text=True, env=env)
    assert cli.returncode == 2 and [f["code"] for f in json.loads(cli.stdout)["findings"]] == ["unreadable"]


def test_the_readability_pass_opens_but_never_reads_an_unparsed_file(fresh, monkeypatch) -> None:
    """open + close only: a tokenizer of any size costs one syscall pair on the structure path."""
    import builtins

    root = fresh("layout-2")
    opened: list[str] = []
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: (opened.append(os.path.basename(f)), real_open(f, *a, **k))[1])
    ck = read_checkpoint(root)
    assert ck.findings == [] and "tokenizer.json" not in opened and "tokenizer.json" not in ck.parsed


# --- a head config that cannot be read as JSON decides no layout (F-json-marker) ------------------------

HEAD_CONFIG = "clef_head/joint_head_config.json"


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[:-2])


def _empty(p: Path) -> None:
    p.write_bytes(b"")


def _directory(p: Path) -> None:
    p.unlink()
    p.mkdir()


def _json_value(text: str):  # noqa: ANN202 - a damage: valid JSON that is not an object
    def damage(p: Path) -> None:
        p.write_text(text)
    damage.__name__ = f"json-{text}"
    return damage


@pytest.mark.parametrize("layout", ["layout-2", "layout-2-unmarked", "layout-1"])
@pytest.mark.parametrize("damage, code", [(_truncate, "bad-config"), (_empty, "bad-config"), (_directory, "missing-file"),
                                          *[(_json_value(t), "bad-config") for t in ("[]", "null", '"x"', "1", "true")]])
def test_a_head_config_never_read_leaves_the_marker_and_the_layout_unknown(fresh, layout, damage, code) -> None:
    """The marker's presence is a statement about content: it is never made from a file that could not
    be parsed (no marker-missing, no migrate fix, no layout-2-unmarked), by verify and the gate alike.
    A key written twice is read on as Python reads it (bad-config, the layout still detected)."""
    root = fresh(layout)
    damage(root / HEAD_CONFIG)
    ck = read_checkpoint(root)
    assert ck.layout_unread == HEAD_CONFIG and str(ck.layout) == "unknown"
    found, gate = _verdicts(root)
    assert [(f["code"], f["file"]) for f in found] == [(code, HEAD_CONFIG)], found
    assert "migrate" not in found[0]["fix"] and gate == code


def test_a_head_config_key_written_twice_is_read_on_and_the_layout_still_detected(fresh) -> None:
    root = fresh("layout-2")
    p = root / HEAD_CONFIG
    p.write_text(p.read_text().replace("{", '{"heads": 4, ', 1))
    ck = read_checkpoint(root)
    assert ck.layout_unread is None and str(ck.layout) == "layout-2"
    assert [f.code for f in ck.findings] == ["bad-config"]
