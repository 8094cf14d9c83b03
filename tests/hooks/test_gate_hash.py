"""The serving gate checks content by default: every file the engine or the plugin reads is hashed
against the strongest reference its download has, before any weight is loaded.

Real downloads of a real (tiny) checkpoint: a Hugging Face cache checkout (``tests/support/hub_cache.py``, the
layout ``scan_cache_dir`` reads), a ``--local-dir`` download whose metadata is written by
huggingface_hub's own ``write_download_metadata``, and a folder with ``clef-format manifest``'s
``clef_manifest.json``. Each kind of file gets one changed byte that no other check of the gate sees
(a BF16 mantissa bit, a digit of provenance metadata, a marker still satisfied, JSON whitespace, a
docstring letter): refused by default with ``hash-mismatch``, served with the opt-out.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Callable

import pytest

from clef_format.cli.main import main
from clef_format.compat import IncompatibleError, check_checkpoint
from clef_format.errors import UsageError
from tests.support.hub_cache import build_hub_cache, default_lfs, etag_of, fake_commit
from clef_format.read.safetensors import read_header
from clef_format.spec import layouts as L
from clef_format.vllm import content
from tests.support.header_edit import poke

PLUGIN = "0.2.1"
SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture(autouse=True)
def _fresh_process_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test as a fresh engine process: nothing proven yet, the opt-out variable unset."""
    monkeypatch.delenv(content.ENV, raising=False)
    content.forget_verified()


@pytest.fixture
def source(built) -> Path:
    """A layout-2 checkpoint with a sharded backbone (so it has an index)."""
    return built("layout-2", "bf16", num_layers=4, shards=2)


# ---------------------------------------------------------------- downloads


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() and ".cache" not in p.parts)


def cache_checkout(src: Path, tmp: Path) -> Path:
    """A snapshot of a Hugging Face cache (blobs named by etag, relative symlinks, refs/main)."""
    return build_hub_cache(tmp / "hub", "org/clef-tiny", src)


def local_dir_download(src: Path, tmp: Path) -> Path:
    """What ``hf download REPO --local-dir DIR`` leaves: the files, and per file the metadata that
    huggingface_hub writes (``write_download_metadata``: commit, etag, timestamp)."""
    from huggingface_hub._local_folder import read_download_metadata, write_download_metadata

    dest = tmp / "local"
    shutil.copytree(src, dest)
    commit = fake_commit("org/clef-tiny@main")
    for rel in _files(dest):
        etag = etag_of(dest / rel, default_lfs(rel, (dest / rel).stat().st_size))
        write_download_metadata(dest, rel, commit, etag)
        assert read_download_metadata(dest, rel).etag == etag  # huggingface_hub reads it back as written
    return dest


def manifest_folder(src: Path, tmp: Path) -> Path:
    """A plain folder with ``clef_manifest.json`` (BLAKE3), as ``clef-format manifest`` writes it."""
    dest = tmp / "plain"
    shutil.copytree(src, dest)
    assert main(["manifest", str(dest), "--json"]) == 0
    return dest


DOWNLOADS: dict[str, Callable[[Path, Path], Path]] = {
    "cache": cache_checkout, "local-dir": local_dir_download, "manifest": manifest_folder}


# ---------------------------------------------------------------- one byte per kind of file
# (writing through a snapshot entry writes its blob: a test corrupting the blob store, never the tool)


def _flip_weight(rel: str, tensor: Callable[[dict], str]) -> Callable[[Path], None]:
    """XOR the low (mantissa) byte of a BF16 weight's first element: a finite value, one bit off."""
    def mutate(root: Path) -> None:
        name = tensor(read_header(root / rel).tensors)
        with open(root / rel, "rb") as fh:
            h = read_header(root / rel)
            fh.seek(h.data_start + h.tensors[name].begin)
            byte = fh.read(1)[0]
        poke(root / rel, name, 0, bytes([byte ^ 0x01]))
    return mutate


def _replace_once(rel: str, old: bytes, new: bytes) -> Callable[[Path], None]:
    """Replace the first ``old`` by ``new`` (same length: one byte differs)."""
    assert len(old) == len(new) and sum(a != b for a, b in zip(old, new)) == 1

    def mutate(root: Path) -> None:
        data = (root / rel).read_bytes()
        assert old in data, (rel, old)
        with open(root / rel, "r+b") as fh:  # in place, as bit rot or an edit would
            fh.seek(data.index(old))
            fh.write(new)
    return mutate


def _first_bf16(prefix: str) -> Callable[[dict], str]:
    return lambda tensors: next(n for n, t in sorted(tensors.items()) if n.startswith(prefix)
                                and t.dtype == "BF16" and n.endswith("proj.weight"))


ONE_BYTE: dict[str, tuple[str, Callable[[Path], None]]] = {
    "backbone-shard": (SHARD, _flip_weight(SHARD, _first_bf16("model.language_model.layers."))),
    "head-weights": (L.HEAD_WEIGHTS, _flip_weight(L.HEAD_WEIGHTS, _first_bf16(""))),
    # the tables' recorded digests cover their tensors, not the provenance metadata: one digit of it
    "tables": (L.TABLES, _replace_once(L.TABLES, b'mean_row_cosine\\": 0.99', b'mean_row_cosine\\": 0.98')),
    "config": (L.CONFIG, _replace_once(L.CONFIG, b'"rms_norm_eps": 1e-06', b'"rms_norm_eps": 2e-06')),
    "tokenizer": ("tokenizer.json", _replace_once("tokenizer.json", b'\n  "', b'\n \t"')),
    "tokenizer-config": ("tokenizer_config.json", _replace_once("tokenizer_config.json", b'\n  "', b'\n \t"')),
    "generation-config": ("generation_config.json", _replace_once("generation_config.json", b'\n  "', b'\n \t"')),
    "head-code": (L.HEAD_CODE, _replace_once(L.HEAD_CODE, b'"""Reference', b'"""reference')),
    "marker": (L.HEAD_CONFIG, _replace_once(L.HEAD_CONFIG, b'">=0.2.0"', b'">=0.2.1"')),  # still this plugin's
    "index": (L.BACKBONE_INDEX, _replace_once(L.BACKBONE_INDEX, b'\n  "', b'\n \t"')),
    "chat-template": ("chat_template.jinja", _replace_once("chat_template.jinja", b"{% for m", b"{%\tfor m")),
}


def _refusal(root: Path, **kw: object) -> IncompatibleError | None:
    try:
        check_checkpoint(root, PLUGIN, **kw)
    except IncompatibleError as exc:
        return exc
    return None


@pytest.mark.parametrize("download", sorted(DOWNLOADS))
@pytest.mark.parametrize("kind", sorted(ONE_BYTE))
def test_one_changed_byte_is_refused_by_default_and_served_with_the_opt_out(
        source: Path, tmp_path: Path, download: str, kind: str) -> None:
    root = DOWNLOADS[download](source, tmp_path)
    assert _refusal(root) is None  # the download as it came
    content.forget_verified()
    rel, mutate = ONE_BYTE[kind]
    mutate(root)
    exc = _refusal(root)
    assert exc is not None and exc.code == "hash-mismatch", (kind, download, exc)
    assert {f.file for f in exc.findings if f.code == "hash-mismatch"} == {rel}
    assert "re-download" in exc.fix or "copy" in exc.fix
    if download == "cache":
        assert "--force-download" in exc.fix and "org/clef-tiny" in exc.fix
    assert _refusal(root, check_references=False) is None  # no other check of the gate sees the change


def test_a_change_after_a_served_start_is_seen_by_the_next_gate(source: Path, tmp_path: Path) -> None:
    """The gate remembers files it proved (a plugin calls it several times per start), by identity and
    change times: a file rewritten in place since is hashed again, never taken as proven."""
    root = cache_checkout(source, tmp_path)
    assert _refusal(root) is None
    rel, mutate = ONE_BYTE["backbone-shard"]
    mutate(root)
    exc = _refusal(root)
    assert exc is not None and exc.code == "hash-mismatch" and exc.findings[0].file == rel


def test_a_second_gate_in_the_process_hashes_only_what_changed(source: Path, tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    root = local_dir_download(source, tmp_path)
    n = len([rel for rel in _files(root) if L.read_at_start(rel)])
    with caplog.at_level(logging.INFO, logger="clef_format.gate"):
        check_checkpoint(root, PLUGIN)
        check_checkpoint(root, PLUGIN)
    lines = [r.getMessage() for r in caplog.records if "match their references" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(f"clef-format gate: {n} file(s)")
    assert "local_dir download metadata" in lines[0]


def test_the_environment_variable_turns_hashing_off(source: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    root = manifest_folder(source, tmp_path)
    ONE_BYTE["backbone-shard"][1](root)
    for off in ("0", "false", "OFF", " no "):
        monkeypatch.setenv(content.ENV, off)
        assert _refusal(root) is None, off
        assert _refusal(root, check_references=True).code == "hash-mismatch"  # the keyword wins
    for on in ("1", "true", "on", ""):
        monkeypatch.setenv(content.ENV, on)
        assert _refusal(root).code == "hash-mismatch", on
        assert _refusal(root, check_references=False) is None  # the keyword wins


@pytest.mark.parametrize("value", ["disabled", "2", "nope"])
def test_an_unknown_value_of_the_variable_is_a_usage_error(source: Path, value: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """An opt-out that silently did nothing would be worse than none: refused before anything is read."""
    monkeypatch.setenv(content.ENV, value)
    with pytest.raises(UsageError) as exc:
        check_checkpoint(source / "does-not-exist", PLUGIN)
    assert content.ENV in str(exc.value) and f"{content.ENV}=0" in exc.value.fix
    with pytest.raises(UsageError):
        check_checkpoint(source, PLUGIN, check_references="yes")  # type: ignore[arg-type]


def test_files_without_a_reference_are_logged_as_unchecked(source: Path, tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """A plain folder: served, with one warning naming every file read at start that nothing proves."""
    root = tmp_path / "plain"
    shutil.copytree(source, root)
    with caplog.at_level(logging.WARNING, logger="clef_format.gate"):
        assert _refusal(root) is None
    (warning,) = [r for r in caplog.records if "not checked" in r.getMessage()]
    assert warning.levelno == logging.WARNING
    for rel in _files(root):
        assert (rel in warning.getMessage()) == L.read_at_start(rel), rel
    assert "clef-format manifest" in warning.getMessage()


def test_a_local_dir_file_without_metadata_is_unchecked_the_others_checked(
        source: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = local_dir_download(source, tmp_path)
    (root / ".cache/huggingface/download/tokenizer.json.metadata").unlink()
    ONE_BYTE["tokenizer"][1](root)  # unproven now: served, and said so
    with caplog.at_level(logging.WARNING, logger="clef_format.gate"):
        assert _refusal(root) is None
    (warning,) = [r for r in caplog.records if "not checked" in r.getMessage()]
    assert "1 file(s)" in warning.getMessage() and "tokenizer.json" in warning.getMessage()
    ONE_BYTE["config"][1](root)
    assert _refusal(root).code == "hash-mismatch"


def test_a_cache_entry_that_is_no_blob_link_is_unchecked(source: Path, tmp_path: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    snap = cache_checkout(source, tmp_path)
    root = tmp_path / "copy"
    shutil.copytree(snap, root, symlinks=False)  # a copy of a snapshot is a plain folder: no blob names
    with caplog.at_level(logging.WARNING, logger="clef_format.gate"):
        assert _refusal(root) is None
    assert any(L.TABLES in r.getMessage() and "not checked" in r.getMessage() for r in caplog.records)


def test_files_no_loader_reads_are_not_refused(source: Path, tmp_path: Path) -> None:
    """A README or a release's ``vllm_plugin/`` source changed in the blob store: the engine serves the
    same bytes, so the gate serves (verify --deep still reports them)."""
    src = tmp_path / "src"
    shutil.copytree(source, src)
    (src / "README.md").write_text("# clef tiny\n")
    (src / "vllm_plugin").mkdir()
    (src / "vllm_plugin" / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    root = cache_checkout(src, tmp_path)
    _replace_once("README.md", b"tiny", b"tinY")(root)
    _replace_once("vllm_plugin/setup.py", b"setup()", b"setup( ")(root)
    assert _refusal(root) is None
    ONE_BYTE["head-code"][1](root)
    assert _refusal(root).code == "hash-mismatch"


def test_an_edited_marker_says_re_download_before_the_pair(source: Path, tmp_path: Path) -> None:
    """A marker edited to exclude this plugin: the file is not the download's, so the refusal says to
    re-download it (not to install another plugin); without hashing the pair rule refuses it."""
    root = cache_checkout(source, tmp_path)
    _replace_once(L.HEAD_CONFIG, b'">=0.2.0"', b'">=0.3.0"')(root)
    exc = _refusal(root)
    assert exc is not None and exc.code == "hash-mismatch"
    assert {f.code for f in exc.findings} == {"hash-mismatch", "plugin-incompatible"}
    assert _refusal(root, check_references=False).code == "plugin-incompatible"


def test_the_files_read_at_start() -> None:
    read = ["config.json", "model.safetensors", SHARD, L.BACKBONE_INDEX, L.TABLES, L.HEAD_WEIGHTS, L.HEAD_CONFIG,
            L.HEAD_CODE, "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "chat_template.jinja",
            "generation_config.json", "processor_config.json", "preprocessor_config.json", "special_tokens_map.json",
            L.RELEASE_HEAD_WEIGHTS, L.RELEASE_HEAD_CONFIG]
    not_read = ["README.md", "LICENSE", ".gitattributes", "recipe.yaml", "vllm_plugin/clef_vllm/__init__.py",
                "scripts/shrink_tables.py", "clef_head/README.md", "assets/logo.png", "logo.png"]
    assert [rel for rel in read if not L.read_at_start(rel)] == []
    assert [rel for rel in not_read if L.read_at_start(rel)] == []


def test_hashing_runs_before_any_weight_is_loaded(source: Path, tmp_path: Path) -> None:
    """The plugin's load hook checks the checkpoint first: a changed weight never reaches the model."""
    from clef_format.vllm.weights import backbone_weights

    root = manifest_folder(source, tmp_path)
    ONE_BYTE["backbone-shard"][1](root)
    with pytest.raises(IncompatibleError) as exc:
        backbone_weights(root, PLUGIN)  # raises when called, before the first tensor is read
    assert exc.value.code == "hash-mismatch"


def test_the_streamed_checks_are_run_again_after_a_change(source: Path, tmp_path: Path) -> None:
    """The table rule and the scale decode are remembered once passed (the plugin's later calls skip
    them), keyed on every file as it is: a table rewritten since is read again, with no reference to
    catch it (a plain folder) and its own recorded digests re-made."""
    from tests.support.header_edit import reseal_digests

    root = tmp_path / "plain"
    shutil.copytree(source, root)
    assert _refusal(root) is None
    hidden = read_header(root / L.TABLES).tensors[L.EMBED_TOKENS].shape[1]
    poke(root / L.TABLES, L.EMBED_TOKENS, hidden * 6 + 1, b"\x80")  # -128: outside the format
    reseal_digests(root / L.TABLES)
    exc = _refusal(root)
    assert exc is not None and exc.code == "table-value-range"


# ---------------------------------------------------------------- fixes that fix


def _command_in(fix: str, prefix: str) -> list[str]:
    """The backquoted command starting with ``prefix`` in a fix, split as a shell would."""
    import re
    import shlex

    found = [c for c in re.findall(r"`([^`]+)`", fix) if c.startswith(prefix)]
    assert found, fix
    return shlex.split(found[0])


@pytest.mark.parametrize("edit", ["same-size", "size"])
def test_a_manifest_mismatch_fix_names_the_real_path_and_force_and_works(
        source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: str) -> None:
    """The intended-change half of a manifest mismatch's fix, run as printed from another folder,
    records the files (manifest refuses a checkpoint that fails its manifest without --force) and the
    gate then serves: the path is the checkpoint's own, in both the same-size and the size variant."""
    root = manifest_folder(source, tmp_path)
    if edit == "same-size":
        ONE_BYTE["config"][1](root)
    else:
        with open(root / "generation_config.json", "a") as fh:
            fh.write("\n")
    exc = _refusal(root)
    assert exc is not None and exc.code == "hash-mismatch", exc
    argv = _command_in(exc.fix, "clef-format manifest")
    assert argv[2] == str(root.resolve()) and "--force" in argv, exc.fix
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(argv[1:]) == 0
    content.forget_verified()
    assert _refusal(root) is None


def test_two_edited_files_in_one_snapshot_are_both_named(source: Path, tmp_path: Path) -> None:
    """Two files of one cache snapshot changed (in the blob store): the refusal's message names both."""
    root = cache_checkout(source, tmp_path)
    for kind in ("config", "tokenizer"):
        ONE_BYTE[kind][1](root)
    exc = _refusal(root)
    assert exc is not None and exc.code == "hash-mismatch"
    assert {f.file for f in exc.findings if f.code == "hash-mismatch"} == {L.CONFIG, "tokenizer.json"}
    assert L.CONFIG in exc.reason and "tokenizer.json" in exc.reason, exc.reason


def test_an_unchecked_file_in_a_snapshot_gets_a_fix_that_works_in_a_cache(
        source: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A snapshot entry that is a plain file (no blob name to check it against): the warning's fix is a
    re-download or a copy out of the cache, never ``clef-format manifest`` (refused inside a cache)."""
    root = cache_checkout(source, tmp_path)
    entry = root / "tokenizer.json"
    data = entry.read_bytes()
    entry.unlink()
    entry.write_bytes(data)
    with caplog.at_level(logging.WARNING, logger="clef_format.gate"):
        assert _refusal(root) is None
    (warning,) = [r for r in caplog.records if "not checked" in r.getMessage()]
    text = warning.getMessage()
    assert "tokenizer.json" in text and "clef-format manifest" not in text
    assert "hf download org/clef-tiny" in text and "--force-download" in text and "--local-dir" in text


def test_the_unchecked_log_line_is_capped(source: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Hundreds of unchecked files read at start: the gate's one log line names 20 and counts the rest."""
    root = tmp_path / "plain"
    shutil.copytree(source, root)
    for i in range(300):  # top-level files: a loader may open any of them
        (root / f"added_{i:04d}.json").write_text("{}\n")
    with caplog.at_level(logging.WARNING, logger="clef_format.gate"):
        assert _refusal(root) is None
    (warning,) = [r for r in caplog.records if "not checked" in r.getMessage()]
    text = warning.getMessage()
    n = int(text.split("clef-format gate: ", 1)[1].split(" ", 1)[0])
    assert n > content.LOGGED_NAMES and f"and {n - content.LOGGED_NAMES} more" in text, text[:300]
    assert len(text) < 4000


def test_corrupt_local_dir_metadata_is_said_to_be_corrupt(source: Path, tmp_path: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """A --local-dir download whose metadata for config.json is garbage: logged as corrupt, not as absent."""
    root = local_dir_download(source, tmp_path)
    (root / ".cache/huggingface/download/config.json.metadata").write_bytes(b"\x00garbage")
    with caplog.at_level(logging.WARNING, logger="clef_format.gate"):
        assert _refusal(root) is None
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "config.json.metadata is corrupt or unreadable" in text, text
    # verify --deep says it too, and its fix is a command with its one placeholder explained
    from clef_format.verify.run import verify

    (hit,) = [f for f in verify(str(root), deep=True).findings if f.file == "config.json"]
    assert hit.code == "manifest-missing" and "corrupt or unreadable" in hit.message
    assert f"hf download ORG/NAME config.json --local-dir {root} --force-download" in hit.fix
    assert "ORG/NAME is the repo it was downloaded from" in hit.fix and "rewrites the metadata" in hit.fix


@pytest.mark.parametrize("bogus", ["clef_head/../tokenizer.json", "./tokenizer.json"])
def test_a_non_normalized_manifest_entry_is_a_finding_of_the_manifest(
        source: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, bogus: str) -> None:
    """A manifest entry that normalizes onto another file's (a second entry for tokenizer.json): a finding
    of the manifest, never a stand-in for the real entry (a bogus hash-mismatch of the good file)."""
    import json

    from clef_format.verify.run import verify

    root = manifest_folder(source, tmp_path)
    manifest = json.loads((root / "clef_manifest.json").read_text())
    manifest["files"][bogus] = {"size": manifest["files"]["tokenizer.json"]["size"], "blake3": "0" * 64}
    (root / "clef_manifest.json").write_text(json.dumps(manifest))
    report = verify(str(root), plugin_version=PLUGIN, deep=True)
    assert not any(f.code == "hash-mismatch" for f in report.findings), report.findings
    (bad,) = [f for f in report.findings if f.code == "bad-config" and f.file == "clef_manifest.json"]
    assert bogus in bad.message and "two entries for one file" in bad.message and bad.severity == "error"
    with caplog.at_level(logging.WARNING, logger="clef_format.gate"):
        assert _refusal(root) is None  # the engine never reads the manifest: logged, as any unusable reference
    assert any(bogus in r.getMessage() for r in caplog.records)
