"""Nothing lost under any fault (issue 11): each known way a migrate lost data or lied, as a test.

Runs where permissions matter drop CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH with ``setpriv`` (as
tests/cli/test_contract.py does), so a mode-000 folder is unlistable for root too.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from clef_format.cli.main import main
from tests.support.hub_cache import build_hub_cache, build_local_dir
from clef_format.read.manifest import MANIFEST_NAME
from tests.support.migrate import ROOT, siblings, verified

SETPRIV = shutil.which("setpriv")
UNPRIVILEGED = ([SETPRIV, "--bounding-set=-dac_override,-dac_read_search", "--"]
                if SETPRIV and os.geteuid() == 0 else [])
needs_unprivileged = pytest.mark.skipif(os.geteuid() == 0 and not UNPRIVILEGED,
                                        reason="root without setpriv: permissions are not enforced")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    capsys.readouterr()
    try:
        rc = main([*argv, "--json"])
    except SystemExit as exc:
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, json.loads(out)


def cli_unprivileged(*argv: str) -> tuple[int, dict, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([*UNPRIVILEGED, sys.executable, "-m", "clef_format.cli", *argv, "--json"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def tree(root: Path) -> dict[str, tuple[int, str]]:
    """Every entry: mode and content hash / link target (to prove a tree unchanged)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            st = p.lstat()
            what = os.readlink(p) if p.is_symlink() else (p.read_bytes().hex()[:64] + str(st.st_size)
                                                          if stat.S_ISREG(st.st_mode) else "")
            out[str(p.relative_to(root))] = (st.st_mode, what)
    return out


# ---- 1. the Hugging Face cache boundary, on resolved paths ---------------------------------------

@pytest.fixture
def snapshot(built, tmp_path: Path) -> Path:
    return build_hub_cache(tmp_path / "hub", "acme/clef-flash-NVFP4", built("layout-1"))


def test_cache_boundary_decides_on_resolved_paths(snapshot: Path, tmp_path: Path) -> None:
    from clef_format.read.hf_cache import cache_area, in_hf_cache, is_hf_snapshot

    repo = snapshot.parent.parent
    link = tmp_path / "my-model"
    link.symlink_to(snapshot)
    assert is_hf_snapshot(str(link)) and cache_area(str(link)) == "snapshot"
    assert cache_area(str(link / "new-folder")) == "snapshot"
    assert cache_area(str(repo / "blobs")) == "blobs" and cache_area(str(repo / "refs" / "main")) == "refs"
    assert cache_area(str(repo)) == "repo"
    assert not in_hf_cache(str(tmp_path / "elsewhere")) and not in_hf_cache(str(tmp_path))
    # a folder whose name only starts like the snapshot's is not inside it (whole components)
    twin = snapshot.parent / (snapshot.name + "-copy")
    assert cache_area(str(twin)) == "snapshot"  # still under snapshots/: a cache folder
    sibling = tmp_path / "hub-not"
    sibling.mkdir()
    assert not in_hf_cache(str(sibling))


def test_symlinked_snapshot_is_verified_as_the_snapshot(snapshot: Path, tmp_path: Path, capsys) -> None:
    link = tmp_path / "my-model"
    link.symlink_to(snapshot)
    rc_real, real = run(capsys, "verify", str(snapshot))
    rc, out = run(capsys, "verify", str(link))
    assert rc == rc_real and out["layout"] == real["layout"] == "layout-1"
    assert not [f for f in out["findings"] if f["code"] == "path-escape"], out["findings"]
    rc, out = run(capsys, "verify", str(link), "--deep")
    assert not [f for f in out["findings"] if f["severity"] == "error"], out["findings"]


def test_symlinked_snapshot_is_never_written(snapshot: Path, tmp_path: Path, capsys) -> None:
    repo = snapshot.parent.parent
    before = tree(repo)
    link = tmp_path / "my-model"
    link.symlink_to(snapshot)
    rc, out = run(capsys, "migrate", str(link))
    assert rc == 1 and out["findings"][0]["code"] == "migrate-refused" and "--output" in out["findings"][0]["fix"]
    rc, out = run(capsys, "migrate", str(link), "--dry-run")
    assert rc == 1 and out["findings"][0]["code"] == "migrate-refused"
    rc, out = run(capsys, "manifest", str(link), "--force")
    assert rc == 1 and out["findings"][0]["code"] == "manifest-refused"
    # an --output inside the cache (directly, or through a symlink) is refused too
    rc, out = run(capsys, "migrate", str(link), "--output", str(snapshot.parent / "migrated"))
    assert rc == 1 and "Hugging Face cache" in out["findings"][0]["message"]
    into = tmp_path / "into-cache"
    into.symlink_to(repo / "snapshots")
    rc, out = run(capsys, "migrate", str(link), "--output", str(into / "x"))
    assert rc == 1 and "Hugging Face cache" in out["findings"][0]["message"]
    assert tree(repo) == before  # no lock, no workspace, no manifest, no journal
    dest = tmp_path / "out"
    rc, out = run(capsys, "migrate", str(link), "--output", str(dest))
    assert rc == 0 and out["layout"] == "layout-2" and tree(repo) == before


# ---- 2. every entry carried, or nothing written ---------------------------------------------------

@needs_unprivileged
@pytest.mark.parametrize("folder", [".cache/huggingface", ".git", "runs/2026"])
def test_unlistable_folder_refuses_before_writing(fresh, folder: str) -> None:
    root = fresh("layout-1")
    blocked = root / folder
    blocked.mkdir(parents=True)
    (blocked / "keep.txt").write_text("user data\n")
    blocked.chmod(0)
    try:
        before = tree(root)
        rc, out, _ = cli_unprivileged("migrate", str(root), "--dry-run")
        assert rc == 2 and out["findings"][0]["code"] == "unreadable" and folder.split("/")[0] in out["error"]
        rc, out, _ = cli_unprivileged("migrate", str(root))
        assert rc == 2 and out["findings"][0]["code"] == "unreadable", out
        assert tree(root) == before and siblings(root) == []
    finally:
        blocked.chmod(0o755)
    rc, out, _ = cli_unprivileged("migrate", str(root))  # once readable, it is carried
    assert rc == 0 and out["layout"] == "layout-2", out
    assert (root / folder / "keep.txt").read_text() == "user data\n" and siblings(root) == []
    entries = out["steps"][0]["entries"]
    assert entries["after"] >= entries["before"] - entries["removed"]


@needs_unprivileged
def test_unreadable_file_refuses_before_writing_naming_the_cause(fresh) -> None:
    root = fresh("layout-1")
    secret = root / "notes" / "private.txt"
    secret.parent.mkdir()
    secret.write_text("user data\n")
    secret.chmod(0)
    try:
        before = tree(root)
        rc, out, _ = cli_unprivileged("migrate", str(root))
        assert rc == 2 and out["findings"][0]["code"] == "unreadable", out
        assert "notes/private.txt cannot be read: Permission denied; nothing was written" in out["error"], out
        assert tree(root) == before and siblings(root) == []
    finally:
        secret.chmod(0o644)


def test_fifo_is_refused_before_writing(fresh, capsys) -> None:
    root = fresh("layout-1")
    os.mkfifo(root / "pipe")
    before = tree(root)
    for extra in (["--dry-run"], []):
        rc, out = run(capsys, "migrate", str(root), *extra)
        assert rc == 1 and out["findings"][0]["code"] == "migrate-refused" and "FIFO" in out["findings"][0]["message"]
    assert tree(root) == before and siblings(root) == []


def test_in_place_keeps_every_entry_and_says_so(fresh, capsys) -> None:
    root = fresh("layout-1")
    (root / "runs" / "a").mkdir(parents=True)
    (root / "runs" / "a" / "log.txt").write_text("x")
    (root / "notes-link").symlink_to("runs/a/log.txt")
    (root / "empty").mkdir()
    rc, out = run(capsys, "migrate", str(root))
    assert rc == 0, out
    e = out["steps"][0]["entries"]
    assert e["after"] >= e["before"] - e["removed"]
    assert (root / "empty").is_dir() and os.readlink(root / "notes-link") == "runs/a/log.txt"


# ---- 3. failures of the swap are inside the rollback; the dry run sees them -----------------------

def _mount_tmpfs(path: Path) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "none", str(path)], capture_output=True).returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_mount_point_is_refused_by_the_dry_run_and_the_run(built, tmp_path: Path, capsys) -> None:
    mnt = tmp_path / "mnt"
    if not _mount_tmpfs(mnt):
        pytest.skip("cannot mount a tmpfs here")
    try:
        shutil.copytree(built("layout-1"), mnt / "ck")
        root = mnt / "ck"
        # the checkpoint itself a mount point
        inner = tmp_path / "ckmnt"
        assert _mount_tmpfs(inner)
        try:
            shutil.copytree(built("layout-1"), inner, dirs_exist_ok=True)
            before = tree(inner)
            for extra in (["--dry-run"], [], []):  # the dry run, the run, a rerun: the same answer
                rc, out = run(capsys, "migrate", str(inner), *extra)
                assert rc == 1 and "mount point" in out["findings"][0]["message"], out
            assert tree(inner) == before and siblings(inner) == []
        finally:
            subprocess.run(["umount", str(inner)])
        out_mnt = tmp_path / "outmnt"
        assert _mount_tmpfs(out_mnt)
        try:
            for extra in (["--dry-run"], []):
                rc, out = run(capsys, "migrate", str(root), "--output", str(out_mnt), *extra)
                assert rc == 1 and "mount point" in out["findings"][0]["message"], out
            assert os.listdir(out_mnt) == [] and verified(root)[0] == "layout-1"
        finally:
            subprocess.run(["umount", str(out_mnt)])
    finally:
        subprocess.run(["umount", str(mnt)])


@needs_unprivileged
def test_read_only_empty_output_is_refused_by_dry_run_and_run(fresh, tmp_path: Path) -> None:
    root = fresh("layout-1")
    dest = tmp_path / "ro-out"
    dest.mkdir()
    dest.chmod(0o555)
    try:
        for extra in (["--dry-run"], []):
            rc, out, _ = cli_unprivileged("migrate", str(root), "--output", str(dest), *extra)
            assert rc == 1 and out["findings"][0]["code"] == "migrate-refused" and "read-only" in out["findings"][0]["message"]
        assert os.listdir(dest) == [] and siblings(dest) == []
    finally:
        dest.chmod(0o755)


def test_output_symlink_to_an_empty_folder_lands_in_that_folder(fresh, tmp_path: Path, capsys) -> None:
    root = fresh("layout-1")
    real = tmp_path / "real-out"
    real.mkdir()
    link = tmp_path / "out-link"
    link.symlink_to(real)
    rc, out = run(capsys, "migrate", str(root), "--output", str(link))
    assert rc == 0 and out["layout"] == "layout-2", out
    assert link.is_symlink() and verified(real)[:2] == ("layout-2", True) and siblings(real) == []


# ---- 4. migrate owns the references it invalidates -------------------------------------------------

def test_local_dir_metadata_and_manifest_follow_the_new_files(built, tmp_path: Path, capsys) -> None:
    root = build_local_dir(tmp_path / "dl", built("layout-1"))
    rc, out = run(capsys, "verify", str(root), "--deep")
    assert rc == 0, out
    rc, out = run(capsys, "migrate", str(root))
    assert rc == 0 and out["layout"] == "layout-2"
    rc, out = run(capsys, "verify", str(root), "--deep")
    assert rc == 0, [f for f in out["findings"] if f["severity"] != "info"]
    assert not [f for f in out["findings"] if f["code"] in ("hash-mismatch", "manifest-missing")], out["findings"]
    meta = root / ".cache" / "huggingface" / "download"
    assert not (meta / "model.safetensors.metadata").exists() and (meta / "config.json.metadata").exists()
    assert (root / MANIFEST_NAME).is_file()


def _flip_a_weight_byte(path: Path, tensor: str | None = "model.language_model.layers.0.input_layernorm.weight") -> None:
    """One bit of one tensor's data changed in place, the size kept: a download corrupted in transit."""
    from clef_format.read.safetensors import read_header

    h = read_header(path)
    tensor = tensor or sorted(h.tensors)[0]
    with open(path, "r+b") as fh:
        fh.seek(h.data_start + h.tensors[tensor].begin + 1)
        byte = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([byte[0] ^ 1]))


def _with_reference(kind: str, built, tmp_path: Path, capsys) -> Path:
    if kind == "local_dir":
        return build_local_dir(tmp_path / "dl", built("layout-1"))
    if kind == "manifest":
        root = tmp_path / "ck"
        shutil.copytree(built("layout-1"), root)
        assert run(capsys, "manifest", str(root))[0] == 0
        return root
    return build_hub_cache(tmp_path / "hub", "clef/flash", built("layout-1"))


@pytest.mark.parametrize("kind", ["local_dir", "manifest", "hub_cache"])
def test_a_replaced_file_that_fails_its_reference_is_refused_not_laundered(built, tmp_path: Path, capsys,
                                                                           kind: str) -> None:
    """migrate replaces the backbone and drops its reference (download metadata, manifest entry): it wrote
    a fresh manifest for corrupted bytes, and verify --deep then said "all match". Now the file is
    checked against its reference first; a mismatch refuses, nothing changes, the damage stays findable."""
    root = _with_reference(kind, built, tmp_path, capsys)
    target = os.path.realpath(root / "model.safetensors")  # in a cache snapshot: the blob
    _flip_a_weight_byte(Path(target))
    before = {p: p.read_bytes() for p in Path(os.path.realpath(root)).rglob("*") if p.is_file()}
    outs = [["--output", str(tmp_path / "out")], ["--output", str(tmp_path / "out"), "--dry-run"]]
    if kind != "hub_cache":
        outs += [[], ["--dry-run"], ["--to", "layout-2"]]
    for extra in outs:
        rc, out = run(capsys, "migrate", str(root), *extra)
        errors = [f for f in out["findings"] if f["severity"] == "error"]
        assert rc == 1 and [f["code"] for f in errors] == ["hash-mismatch"], (extra, out)
        assert "model.safetensors" in errors[0]["message"] and errors[0]["fix"].startswith("re-download model.safetensors")
    assert {p: p.read_bytes() for p in Path(os.path.realpath(root)).rglob("*") if p.is_file()} == before
    assert not (tmp_path / "out").exists()
    rc, out = run(capsys, "verify", str(root), "--deep")
    assert rc == 1 and "hash-mismatch" in [f["code"] for f in out["findings"]]


@needs_unprivileged
def test_a_workspace_name_whose_folders_cannot_be_listed_is_never_removed(fresh, tmp_path: Path) -> None:
    """A journal-less workspace with a folder this user cannot list looked empty, and was removed with the
    files in it (the removal opens folders up first). What cannot be looked at is never deleted."""
    root = fresh("layout-1")
    ws = root.parent / f".{root.name}.clef-migrate"
    (ws / "a").mkdir(parents=True)
    (ws / "a" / "NOTES").write_text("mine")
    (ws / "a").chmod(0o000)
    try:
        for extra in ([], ["--abort"], ["--dry-run"]):
            rc, out, _ = cli_unprivileged("migrate", str(root), *extra)
            errors = [f for f in out["findings"] if f["severity"] == "error"]
            assert rc == 1 and errors and "cannot be listed" in errors[0]["message"], (extra, out)
    finally:
        (ws / "a").chmod(0o755)
    assert (ws / "a" / "NOTES").read_text() == "mine"


@pytest.mark.parametrize("kind", ["local_dir", "manifest"])
def test_manifest_refuses_to_vouch_for_a_file_that_fails_its_reference(built, tmp_path: Path, capsys, kind: str) -> None:
    """``manifest`` recorded damaged bytes over failing download metadata (or over the manifest they fail),
    and verify --deep then said "all match": the laundering in two commands. Refused now; --force writes."""
    root = _with_reference(kind, built, tmp_path, capsys)
    _flip_a_weight_byte(root / "model.safetensors")
    before = (root / MANIFEST_NAME).read_bytes() if kind == "manifest" else None
    rc, out = run(capsys, "manifest", str(root))
    codes = [f["code"] for f in out["findings"]]
    assert rc == 1 and codes == ["manifest-refused", "hash-mismatch"], out
    assert ((root / MANIFEST_NAME).read_bytes() if kind == "manifest" else (root / MANIFEST_NAME).exists()) == (
        before if kind == "manifest" else False)
    rc, out = run(capsys, "verify", str(root), "--deep")
    assert rc == 1 and "hash-mismatch" in [f["code"] for f in out["findings"]]
    rc, out = run(capsys, "manifest", str(root), "--force")
    assert rc == 0 and out["written"], out
    # written, and never silently: the file it recorded as it is stays in the report, a warning now
    assert [(f["code"], f["severity"], f["file"]) for f in out["findings"]] == [
        ("hash-mismatch", "warning", "model.safetensors")], out
    assert "--force" in out["findings"][0]["message"] and out["findings"][0]["fix"]


@pytest.mark.parametrize("kind", ["local_dir", "manifest"])
def test_a_good_copy_put_back_after_manifest_force_is_told_the_truth(built, tmp_path: Path, capsys, kind: str) -> None:
    """``manifest --force`` recorded damaged bytes; the user put the good file back (re-downloaded it). A
    plain ``manifest`` then refused, calling the good bytes damaged, and only --force got out. Now a file
    that differs from the present manifest is checked against its download metadata: what was downloaded
    is recorded without --force; with nothing else to tell (no metadata), the refusal says the file
    differs from what the manifest recorded and gives the exact command that records it as it is."""
    root = _with_reference(kind, built, tmp_path, capsys)
    good = (root / "model.safetensors").read_bytes()
    _flip_a_weight_byte(root / "model.safetensors")
    assert run(capsys, "manifest", str(root), "--force")[0] == 0
    (root / "model.safetensors").write_bytes(good)  # downloaded again
    rc, out = run(capsys, "manifest", str(root))
    if kind == "local_dir":
        assert rc == 0 and out["written"] and not out["findings"], out
        rc, out = run(capsys, "verify", str(root), "--deep")
        assert rc == 0 and "deep-verified" in [f["code"] for f in out["findings"]], out
        # bytes that fail the manifest and the download metadata alike: damage, said against the download
        _flip_a_weight_byte(root / "model.safetensors")
        rc, out = run(capsys, "manifest", str(root))
        assert rc == 1 and [f["code"] for f in out["findings"]] == ["manifest-refused", "hash-mismatch"], out
        assert "not the bytes that were downloaded" in out["findings"][0]["message"], out
        assert "local_dir download metadata" in out["findings"][1]["message"], out
        return
    refusal, mismatch = out["findings"]
    assert rc == 1 and (refusal["code"], mismatch["code"]) == ("manifest-refused", "hash-mismatch"), out
    assert f"differ from what {MANIFEST_NAME} recorded" in refusal["message"], refusal
    assert "damaged bytes" not in refusal["message"] and "downloaded" not in mismatch["message"], out
    command = f"`clef-format manifest {root.resolve()} --force`"
    assert command in refusal["fix"] and command in mismatch["fix"], out
    assert run(capsys, *command.strip("`").split()[1:])[0] == 0
    rc, out = run(capsys, "verify", str(root), "--deep")
    assert rc == 0 and "deep-verified" in [f["code"] for f in out["findings"]], out


def test_migrate_refuses_a_manifest_it_cannot_check_against(fresh, capsys) -> None:
    """A duplicate key made the manifest unusable: migrate skipped the check and left the stale manifest."""
    root = fresh("layout-1")
    assert run(capsys, "manifest", str(root))[0] == 0
    text = (root / MANIFEST_NAME).read_text()
    first = text.index('"files": {') + len('"files": {')
    entry_end = text.index("}", first) + 1
    (root / MANIFEST_NAME).write_text(text[:first] + text[first:entry_end] + "," + text[first:])
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    for extra in ([], ["--dry-run"], ["--output", str(root.parent / "out")]):
        rc, out = run(capsys, "migrate", str(root), *extra)
        errors = [f for f in out["findings"] if f["severity"] == "error"]
        assert rc == 1 and errors[0]["code"] == "migrate-refused" and MANIFEST_NAME in errors[0]["message"], out
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("kind", ["local_dir", "hub_cache"])
def test_an_output_keeps_a_record_of_the_download_and_refuses_a_damaged_carried_file(built, tmp_path: Path, capsys,
                                                                                    kind: str) -> None:
    """Download metadata and cache blob names stay with the source: an --output came out with nothing to
    check it against, and a carried file damaged in transit passed verify --deep OUT. Every file is now
    checked first; the output gets a manifest of bytes that matched."""
    root = _with_reference(kind, built, tmp_path, capsys)
    out = tmp_path / "out"
    rc, report = run(capsys, "migrate", str(root), "--output", str(out))
    assert rc == 0 and (out / MANIFEST_NAME).is_file(), report
    rc, deep = run(capsys, "verify", str(out), "--deep")
    assert rc == 0 and any(f["code"] == "deep-verified" for f in deep["findings"]), deep
    shutil.rmtree(out)
    _flip_a_weight_byte(Path(os.path.realpath(root / "clef_head" / "joint_head.safetensors")), tensor=None)
    for extra in ([], ["--dry-run"]):
        rc, report = run(capsys, "migrate", str(root), "--output", str(out), *extra)
        errors = [f for f in report["findings"] if f["severity"] == "error"]
        assert rc == 1 and [f["code"] for f in errors] == ["hash-mismatch"], report
        assert "clef_head/joint_head.safetensors" in errors[0]["message"] and "copy" in errors[0]["message"]
    assert not out.exists()


def test_a_carried_file_that_fails_its_reference_stays_findable_after_migrate(built, tmp_path: Path, capsys) -> None:
    """A file migrate carries unchanged keeps its reference: its damage is still found by --deep after."""
    root = build_local_dir(tmp_path / "dl", built("layout-1"))
    _flip_a_weight_byte(root / "clef_head" / "joint_head.safetensors", tensor=None)
    rc, out = run(capsys, "migrate", str(root))
    assert rc == 0 and out["layout"] == "layout-2", out
    rc, out = run(capsys, "verify", str(root), "--deep")
    assert rc == 1 and [f["file"] for f in out["findings"] if f["code"] == "hash-mismatch"] == [
        "clef_head/joint_head.safetensors"], out


def test_manifest_is_rewritten_after_in_place_migrate(fresh, capsys) -> None:
    root = fresh("layout-1")
    rc, _ = run(capsys, "manifest", str(root))
    assert rc == 0
    for to in ("layout-2", "layout-1"):
        rc, out = run(capsys, "migrate", str(root), "--to", to)
        assert rc == 0, out
        rc, out = run(capsys, "verify", str(root), "--deep")
        assert rc == 0 and not [f for f in out["findings"] if f["severity"] != "info" and f["code"] != "legacy-layout"]


# ---- 5. modes, and the working directory ----------------------------------------------------------

def test_new_files_take_the_mode_they_replace_and_the_umask(fresh, capsys) -> None:
    root = fresh("layout-1")
    for p in root.rglob("*"):
        if p.is_file():
            p.chmod(0o600)
    rc, _ = run(capsys, "manifest", str(root))
    assert rc == 0
    (root / MANIFEST_NAME).chmod(0o600)
    old = os.umask(0o077)
    try:
        rc, out = run(capsys, "migrate", str(root))
    finally:
        os.umask(old)
    assert rc == 0, out
    modes = {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*") if p.is_file()}
    assert set(modes.values()) == {0o600}, modes


def test_migrate_dot_from_inside_says_so(fresh, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    root = fresh("layout-1")
    monkeypatch.chdir(root)
    rc, out = run(capsys, "migrate", ".")
    assert rc == 0 and out["layout"] == "layout-2"
    assert any(f["code"] == "workdir-replaced" for f in out["findings"])
    assert os.path.samefile(os.getcwd(), root)  # this process is in the new tree
    assert verified(root)[:2] == ("layout-2", True)
