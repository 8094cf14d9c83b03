"""Repo ids resolved offline from a real-format Hugging Face cache; partial downloads; the cache is never written."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clef_format.cli.main import main
from tests.support.hub_cache import blob_of, build_hub_cache, build_local_dir, fake_commit, repo_folder
from clef_format.read.hashing import hash_file
from clef_format.read.hf_cache import (PathNotFound, cache_roots, incomplete_downloads, local_dir_etag, locate_checkpoint,
                                       snapshot_blob)
from tests.support.hostile_cases import pristine

REPO = "clef-test/clef-flash-NVFP4"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache holding one snapshot of the pristine checkpoint; huggingface_hub pointed at it."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    build_hub_cache(cache, REPO, pristine())
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def _verify(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    capsys.readouterr()
    rc = main(["verify", *args, "--json"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, json.loads(out)


def _tree_state(root: Path) -> dict[str, tuple[str, int, str]]:
    """Every entry under ``root``: kind, mtime, and content hash or link target (to prove nothing changed)."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st = p.lstat()
            if p.is_symlink():
                state[str(p)] = ("link", st.st_mtime_ns, os.readlink(p))
            elif p.is_file():
                state[str(p)] = ("file", st.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            else:
                state[str(p)] = ("dir", 0, "")
    return state


def test_fixture_cache_is_real_format(cache: Path) -> None:
    """huggingface_hub's own readers understand the fake cache."""
    from huggingface_hub import scan_cache_dir, try_to_load_from_cache

    info = scan_cache_dir(cache)
    assert not info.warnings
    (repo,) = info.repos
    assert repo.repo_id == REPO and repo.nb_files == len(os.listdir(repo_folder(cache, REPO) / "blobs"))
    (rev,) = repo.revisions
    assert rev.commit_hash == fake_commit(f"{REPO}@main") and "main" in rev.refs
    found = try_to_load_from_cache(REPO, "config.json", cache_dir=str(cache))
    assert isinstance(found, str) and os.path.dirname(found) == locate_checkpoint(REPO)


def test_blob_names_are_the_hub_etags(cache: Path) -> None:
    """sha256 for LFS files, git's blob id for small ones (cross-checked with real git when present)."""
    snap = Path(locate_checkpoint(REPO))
    big = blob_of(snap, "model.safetensors")
    assert big.name == hashlib.sha256(big.read_bytes()).hexdigest()
    small = blob_of(snap, "config.json")
    assert small.name == hash_file(str(small), "git-sha1")
    git = shutil.which("git")
    if git:
        out = subprocess.run([git, "hash-object", str(small)], capture_output=True, text=True, check=True).stdout
        assert out.strip() == small.name


def test_verify_repo_id(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, report = _verify([REPO], capsys)
    assert rc == 0 and report["layout"] == "layout-2" and report["hf_snapshot"], report["findings"]
    commit = fake_commit(f"{REPO}@main")
    assert _verify([f"{REPO}@main"], capsys)[0] == 0
    assert _verify([f"{REPO}@{commit}"], capsys)[0] == 0


@pytest.mark.parametrize("rev", ["nope", "../../../etc", "main/../main", "./main", "/abs", "0" * 40])
def test_unknown_or_path_like_revision_is_not_found(cache: Path, rev: str) -> None:
    with pytest.raises(PathNotFound):
        locate_checkpoint(f"{REPO}@{rev}")


def test_unknown_repo_exits_2(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "clef-test/absent", "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["error"] and [f["code"] for f in out["findings"]] == ["path-not-found"]


def test_snapshot_missing_config_is_verified_not_unfound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from huggingface_hub import constants

    src = tmp_path / "src"
    shutil.copytree(pristine(), src)
    (src / "config.json").unlink()
    build_hub_cache(tmp_path / "hub", REPO, src)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    rc, report = _verify([REPO], capsys)
    assert rc == 1 and "missing-file" in {f["code"] for f in report["findings"]}


def test_partial_download_with_missing_file_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The state an interrupted `hf download` leaves: the blob is .incomplete, the snapshot lacks its link."""
    from huggingface_hub import constants

    src = tmp_path / "src"
    shutil.copytree(pristine(), src)
    data = (src / "clef_head" / "tables_int8.safetensors").read_bytes()
    (src / "clef_head" / "tables_int8.safetensors").unlink()
    build_hub_cache(tmp_path / "hub", REPO, src)
    blobs = repo_folder(tmp_path / "hub", REPO) / "blobs"
    (blobs / (hashlib.sha256(data).hexdigest() + ".incomplete")).write_bytes(data[:1000])
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    rc, report = _verify([REPO], capsys)
    partial = [f for f in report["findings"] if f["code"] == "partial-download"]
    assert rc == 1 and partial and partial[0]["severity"] == "error"
    assert "missing-file" in {f["code"] for f in report["findings"]}


def test_stale_incomplete_blob_beside_a_complete_snapshot_is_a_warning(cache: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    (repo_folder(cache, REPO) / "blobs" / ("ab" * 32 + ".incomplete")).write_bytes(b"\0" * 10)
    rc, report = _verify([REPO], capsys)
    partial = [f for f in report["findings"] if f["code"] == "partial-download"]
    assert rc == 0 and partial and partial[0]["severity"] == "warning"


def test_dangling_snapshot_link_is_missing_file(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blob_of(Path(locate_checkpoint(REPO)), "tokenizer.json").unlink()  # a blob deleted by hand from the store
    rc, report = _verify([REPO], capsys)
    about = [f for f in report["findings"] if f.get("file") == "tokenizer.json" or "tokenizer.json" in f["message"]]
    assert [f["code"] for f in about] == ["missing-file"], about  # one file, one finding


def test_deep_checks_every_blob_against_its_name(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, report = _verify([REPO, "--deep"], capsys)
    codes = [f["code"] for f in report["findings"]]
    assert rc == 0 and "deep-verified" in codes and "manifest-missing" not in codes, report["findings"]


@pytest.mark.parametrize("rel,algorithm", [("model.safetensors", "sha256"), ("config.json", "git-sha1"),
                                           ("clef_head/tables_int8.safetensors", "sha256")])
def test_deep_reports_blob_whose_content_does_not_match_its_name(cache: Path, capsys: pytest.CaptureFixture[str],
                                                                 rel: str, algorithm: str) -> None:
    blob = blob_of(Path(locate_checkpoint(REPO)), rel)
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit rotted in the blob store; the name still claims the old content
    blob.write_bytes(bytes(data))
    rc, report = _verify([REPO, "--deep"], capsys)
    (hit,) = [f for f in report["findings"] if f["code"] == "hash-mismatch"]
    assert rc == 1 and hit["file"] == rel
    assert blob.name in hit["message"] and hash_file(str(blob), algorithm) in hit["message"]
    assert algorithm in hit["message"]


def test_verify_deep_and_manifest_never_write_the_cache(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = _tree_state(cache)
    assert _verify([REPO, "--deep"], capsys)[0] == 0
    capsys.readouterr()
    assert main(["manifest", REPO, "--json"]) == 1
    refusal = json.loads(capsys.readouterr().out)
    assert refusal["written"] is None and refusal["findings"][0]["code"] == "manifest-refused"
    assert "never writes" in refusal["findings"][0]["message"]
    assert _tree_state(cache) == before


def test_manifest_shipped_in_a_repo_is_used_and_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A publisher's clef_manifest.json: files checked by BLAKE3, the manifest itself by its blob name."""
    from huggingface_hub import constants

    src = tmp_path / "src"
    shutil.copytree(pristine(), src)
    assert main(["manifest", str(src)]) == 0
    build_hub_cache(tmp_path / "hub", REPO, src)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    rc, report = _verify([REPO, "--deep"], capsys)
    (ok,) = [f for f in report["findings"] if f["code"] == "deep-verified"]
    assert rc == 0 and "clef_manifest.json" in ok["message"] and "blob name" in ok["message"]


def test_local_dir_metadata_etags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = build_local_dir(tmp_path / "local", pristine())
    rc, report = _verify([str(root), "--deep"], capsys)
    codes = [f["code"] for f in report["findings"]]
    assert rc == 0 and "deep-verified" in codes and "manifest-missing" not in codes, report["findings"]
    with open(root / "model.safetensors", "r+b") as fh:
        fh.seek(-3, 2)
        fh.write(b"xyz")
    rc, report = _verify([str(root), "--deep"], capsys)
    assert rc == 1 and [f["file"] for f in report["findings"] if f["code"] == "hash-mismatch"] == ["model.safetensors"]


def test_local_dir_incomplete_download(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = build_local_dir(tmp_path / "local", pristine())
    (root / ".cache" / "huggingface" / "download" / "Xy1z.abcdef.incomplete").write_bytes(b"\0" * 100)
    rc, report = _verify([str(root)], capsys)
    assert "partial-download" in {f["code"] for f in report["findings"]}


@pytest.mark.parametrize("arg", ["scanroot/-d", "a/-b", "a/b.", "a/" + "x" * 100, "a/b--c@main"])
def test_a_path_shaped_like_an_invalid_repo_id_is_not_found_every_command(cache: Path, arg: str,
                                                                         tmp_path: Path) -> None:
    """``org/name`` that huggingface_hub refuses as a repo id (a leading or trailing ``-`` or ``.``,
    ``--``, over 96 characters) and that is no folder: ``path-not-found``, exit 2, one JSON object, with
    hub's own reason, from every command that takes a PATH (not hub's validation traceback)."""
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    for argv in (["verify", arg], ["layers", arg], ["manifest", arg], ["migrate", arg], ["migrate", arg, "--current"]):
        proc = subprocess.run([sys.executable, "-m", "clef_format.cli", *argv, "--json"], cwd=tmp_path,
                              capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (argv, proc.stderr)
        out = json.loads(proc.stdout)
        assert [f["code"] for f in out["findings"]] == ["path-not-found"], (argv, out)
        assert "repo id" in out["error"], out["error"]


def test_repo_id_through_the_console_script_offline(cache: Path) -> None:
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "clef_format.cli", "verify", REPO, "--deep", "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "deep-verified" in {f["code"] for f in json.loads(proc.stdout)["findings"]}


@pytest.mark.parametrize("rev", ["../outside", "../../outside", "main/../../outside"])
def test_a_revision_is_never_a_path_even_to_a_file_holding_a_commit(cache: Path, rev: str) -> None:
    """A file outside ``refs/`` that holds a real commit hash is not a ref: ``REPO@../outside`` is
    not found, although following it as a path would reach an existing snapshot."""
    repo = repo_folder(cache, REPO)
    commit = (repo / "refs" / "main").read_text().strip()
    (repo / "outside").write_text(commit)
    (cache / "outside").write_text(commit)
    with pytest.raises(PathNotFound):
        locate_checkpoint(f"{REPO}@{rev}")


@pytest.mark.parametrize("arg, message", [
    ("clef-test/absent", "clef-test/absent: no directory of that name, and no cached snapshot of clef-test/absent in the "
                         "Hugging Face cache (download it first: hf download clef-test/absent)"),
    (f"{REPO}@nope", f"{REPO}@nope: no directory of that name, and no cached snapshot of {REPO}@nope in the "
                     f"Hugging Face cache (download it first: hf download {REPO})"),
])
def test_a_repo_id_not_in_the_cache_says_how_to_get_it(cache: Path, arg: str, message: str) -> None:
    with pytest.raises(PathNotFound) as exc:
        locate_checkpoint(arg)
    assert str(exc.value) == message


def test_cache_roots_follow_xdg_cache_home_when_hf_home_is_unset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_roots() == [os.path.realpath(tmp_path / "xdg" / "huggingface" / "hub")]
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_roots() == [os.path.realpath(tmp_path / "home" / ".cache" / "huggingface" / "hub")]


def test_snapshot_blob_is_only_a_file_directly_in_the_repos_blobs(cache: Path) -> None:
    snap = Path(locate_checkpoint(REPO))
    assert snapshot_blob(str(snap), str(snap / "config.json")) == str(blob_of(snap, "config.json"))
    (snap / "ref.txt").symlink_to(Path("..", "..", "refs", "main"))  # a link into the repo, not to a blob
    assert snapshot_blob(str(snap), str(snap / "ref.txt")) is None
    (snap / "real.txt").write_text("x")
    (snap / "alias.txt").symlink_to("real.txt")
    assert snapshot_blob(str(snap), str(snap / "alias.txt")) is None
    assert snapshot_blob(str(snap), str(snap / "real.txt")) is None  # not a link at all


def test_local_dir_metadata_with_undecodable_bytes_still_gives_its_etag(tmp_path: Path) -> None:
    meta = tmp_path / ".cache" / "huggingface" / "download" / "config.json.metadata"
    meta.parent.mkdir(parents=True)
    meta.write_bytes(b"\xff\xfecommit\n" + b"ab" * 20 + b"\n1700000000.0\n")
    assert local_dir_etag(str(tmp_path), "config.json") == "ab" * 20


def test_listing_unfinished_downloads_stops_after_ten_thousand_names(tmp_path: Path) -> None:
    """A hostile blob store cannot make verify walk forever: the folder that passes the limit is the last listed."""
    for i in range(10_001):
        (tmp_path / f"f{i}").touch()
    (tmp_path / "a.incomplete").touch()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.incomplete").touch()
    assert incomplete_downloads(str(tmp_path), recursive=True) == ["a.incomplete"]
    (tmp_path / "f0").unlink()
    (tmp_path / "f1").unlink()
    assert incomplete_downloads(str(tmp_path), recursive=True) == ["a.incomplete", "sub/b.incomplete"]
