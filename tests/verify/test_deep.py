"""verify --deep and clef-format manifest: hashing, the manifest file, references, the fast path kept light."""

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
from clef_format.read import hashing
from clef_format.read.checkpoint import read_checkpoint
from clef_format.read.hashing import HashTask, hash_file, hash_many
from clef_format.read.manifest import MANIFEST_NAME
from clef_format.verify.deep import deep_findings
from tests.support.hostile_cases import fresh_copy, pristine


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    capsys.readouterr()
    rc = main([*args, "--json"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, json.loads(out)


# ------------------------------------------------------------------ hashing

@pytest.mark.parametrize("size", [0, 1, 999, 1000, 1001, 4096 + 17])
def test_hash_file_matches_reference_implementations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     size: int) -> None:
    import blake3

    monkeypatch.setattr(hashing, "CHUNK", 1000)  # cross chunk boundaries with small files
    data = os.urandom(size)
    p = tmp_path / "f"
    p.write_bytes(data)
    assert hash_file(str(p), "sha256") == hashlib.sha256(data).hexdigest()
    assert hash_file(str(p), "git-sha1") == hashlib.sha1(b"blob %d\0" % size + data).hexdigest()
    assert hash_file(str(p), "blake3") == blake3.blake3(data).hexdigest()
    assert hashing.git_blob_sha1(data) == hash_file(str(p), "git-sha1")


def test_hash_many_concurrent_equals_sequential(tmp_path: Path) -> None:
    import sys as _sys

    switch = _sys.getswitchinterval()
    tasks = []
    for i, size in enumerate([10, 300_000, 0, 5_000_000, 123]):
        p = tmp_path / f"f{i}"
        p.write_bytes(os.urandom(size))
        for alg in hashing.ALGORITHMS:
            tasks.append(HashTask(f"{alg}:{i}", str(p), alg, size))
    tasks.append(HashTask("gone", str(tmp_path / "absent"), "sha256", 10**9))
    seen: list[int] = []
    results = hash_many(tasks, progress=seen.append, workers=3)
    assert results[0].key == "gone"  # largest first
    by_key = {r.key: r for r in results}
    assert by_key["gone"].digest is None and by_key["gone"].error
    for t in tasks[:-1]:
        assert by_key[t.key].digest == hash_file(t.path, t.algorithm)
    assert sum(seen) == sum(t.size for t in tasks[:-1])
    assert _sys.getswitchinterval() == switch


# ------------------------------------------------------------------ manifest

def test_manifest_write_and_deep_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = fresh_copy(tmp_path / "ck")
    rc, out = _run(["manifest", str(root)], capsys)
    assert rc == 0 and out["ok"] and out["algorithm"] == "blake3"
    manifest = json.loads((root / MANIFEST_NAME).read_text())
    assert manifest["clef_manifest"] == 1 and MANIFEST_NAME not in manifest["files"]
    ck = read_checkpoint(root)
    assert set(manifest["files"]) == set(ck.files) - {MANIFEST_NAME}
    for rel, entry in manifest["files"].items():
        assert entry["size"] == ck.files[rel] and entry["blake3"] == hash_file(ck.path(rel), "blake3")
    assert not list(root.glob(".clef_manifest.*"))  # no temp file left behind
    rc, report = _run(["verify", str(root), "--deep"], capsys)
    codes = [f["code"] for f in report["findings"]]
    assert rc == 0 and codes == ["deep-verified"], report["findings"]


def test_file_added_after_the_manifest_is_manifest_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = fresh_copy(tmp_path / "ck")
    assert _run(["manifest", str(root)], capsys)[0] == 0
    (root / "README.md").write_text("added later\n")
    rc, report = _run(["verify", str(root), "--deep"], capsys)
    missing = [f for f in report["findings"] if f["code"] == "manifest-missing"]
    assert rc == 0 and [f["file"] for f in missing] == ["README.md"]
    assert missing[0]["severity"] == "warning" and "clef-format manifest" in missing[0]["fix"]


def test_no_reference_at_all_is_one_warning_with_the_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = fresh_copy(tmp_path / "ck")
    rc, report = _run(["verify", str(root), "--deep"], capsys)
    (f,) = report["findings"]
    assert rc == 0 and f["code"] == "manifest-missing" and f["severity"] == "warning"
    assert f["fix"].startswith("clef-format manifest")


def test_manifest_refuses_a_broken_checkpoint_unless_forced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = fresh_copy(tmp_path / "ck")
    with open(root / "model.safetensors", "r+b") as fh:
        fh.truncate(1000)
    rc, out = _run(["manifest", str(root)], capsys)
    codes = [f["code"] for f in out["findings"]]
    assert rc == 1 and out["written"] is None and codes[0] == "manifest-refused" and "bad-header" in codes
    assert not (root / MANIFEST_NAME).exists()
    assert _run(["manifest", str(root), "--force"], capsys)[0] == 0
    assert (root / MANIFEST_NAME).exists()


def test_manifest_missing_path_exits_2(tmp_path: Path) -> None:
    assert main(["manifest", str(tmp_path / "absent")]) == 2


def test_deep_findings_library_call(tmp_path: Path) -> None:
    """The library entry point verify uses: a manifest mismatch names file, expected and actual."""
    root = fresh_copy(tmp_path / "ck")
    assert main(["manifest", str(root)]) == 0
    (root / "generation_config.json").write_text('{"do_sample": true}\n')
    (root / "generation_config.json").write_bytes((root / "generation_config.json").read_bytes()[:73].ljust(73))
    expected = json.loads((root / MANIFEST_NAME).read_text())["files"]["generation_config.json"]["blake3"]
    findings = deep_findings(read_checkpoint(root))
    (hit,) = [f for f in findings if f.code == "hash-mismatch"]
    assert hit.file == "generation_config.json" and expected in hit.message
    assert hash_file(str(root / "generation_config.json"), "blake3") in hit.message


# ------------------------------------------------------------------ the fast path stays light

def test_plain_verify_imports_nothing_heavy() -> None:
    code = (
        "import sys; from clef_format.cli import main\n"
        f"rc = main(['verify', {str(pristine())!r}])\n"
        "heavy = [m for m in ('torch', 'huggingface_hub', 'blake3', 'tqdm', 'rich', 'safetensors', 'compressed_tensors',"
        " 'clef_format.verify.deep', 'clef_format.read.hashing') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout


def test_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    """tqdm draws the bar on stderr when it is a terminal (forced here), and stdout stays one JSON object."""
    root = fresh_copy(tmp_path / "ck")
    assert main(["manifest", str(root)]) == 0
    env = {**os.environ, "TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1", "COLUMNS": "120"}
    proc = subprocess.run([sys.executable, "-m", "clef_format.cli", "verify", str(root), "--deep", "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    json.loads(proc.stdout)
    assert "hashing" in proc.stderr


def test_deep_does_not_modify_the_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = fresh_copy(tmp_path / "ck")
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in root.rglob("*") if p.is_file()}
    _run(["verify", str(root), "--deep"], capsys)
    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in root.rglob("*") if p.is_file()}
    assert before == after
    shutil.rmtree(root)


@pytest.mark.parametrize("where", ["last", "first"])
def test_a_digest_differing_in_one_character_is_a_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          where: str) -> None:
    """Digests are compared whole: a reference differing only in its last (or first) hex digit fails."""
    root = fresh_copy(tmp_path / "ck")
    assert _run(["manifest", str(root)], capsys)[0] == 0
    manifest = json.loads((root / MANIFEST_NAME).read_text())
    rel = "config.json"
    d = manifest["files"][rel]["blake3"]
    i = len(d) - 1 if where == "last" else 0
    manifest["files"][rel]["blake3"] = d[:i] + ("0" if d[i] != "0" else "1") + d[i + 1:]
    (root / MANIFEST_NAME).write_text(json.dumps(manifest))
    rc, report = _run(["verify", str(root), "--deep"], capsys)
    assert rc == 1 and [f["code"] for f in report["findings"] if f["severity"] == "error"] == ["hash-mismatch"]
    assert report["findings"][0]["file"] == rel


def test_a_file_unreadable_while_hashing_is_unreadable_not_a_verdict(tmp_path: Path) -> None:
    """Reading failed: that says nothing about the content, so it is ``unreadable`` (exit 2, with "error").
    Root reads any file, so the run drops the capabilities that let it ignore file modes."""
    exe = shutil.which("clef-format") or os.path.join(os.path.dirname(sys.executable), "clef-format")
    root = fresh_copy(tmp_path / "ck")
    assert subprocess.run([exe, "manifest", str(root)], capture_output=True).returncode == 0
    (root / "tokenizer.json").chmod(0)
    proc = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--", exe, "verify", str(root),
                           "--deep", "--json"], capture_output=True, text=True)
    out = json.loads(proc.stdout)
    assert proc.returncode == 2, out
    assert "unreadable" in [f["code"] for f in out["findings"]] and out["error"]


def test_an_unreadable_file_with_nothing_to_check_it_against_is_still_unreadable(tmp_path: Path) -> None:
    """No manifest, no cache, no download metadata: --deep hashes nothing, yet it reads every file, so
    one that cannot be opened is ``unreadable`` (exit 2), not passed over with a manifest-missing warning."""
    exe = shutil.which("clef-format") or os.path.join(os.path.dirname(sys.executable), "clef-format")
    root = fresh_copy(tmp_path / "ck")
    (root / "tokenizer.json").chmod(0)
    proc = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--", exe, "verify", str(root),
                           "--deep", "--json"], capture_output=True, text=True)
    out = json.loads(proc.stdout)
    assert proc.returncode == 2 and out["error"], out
    assert [f["file"] for f in out["findings"] if f["code"] == "unreadable"] == ["tokenizer.json"]


@pytest.mark.parametrize("blocked", ["metadata-file", "download-folder"])
def test_unreadable_local_dir_metadata_is_unreadable_not_silence(tmp_path: Path, blocked: str) -> None:
    """A ``snapshot_download(local_dir=...)`` folder whose metadata file (or the folder holding them) cannot
    be read: the reference a file is checked against may exist but was never seen, so ``--deep`` could not
    run (exit 2, ``unreadable`` naming what cannot be read, once), never a pass with a manifest-missing
    warning. Run without the capabilities that let root ignore file modes."""
    from tests.support.hub_cache import build_local_dir

    root = build_local_dir(tmp_path / "ck", pristine())
    download = root / ".cache" / "huggingface" / "download"
    target = download / "model.safetensors.metadata" if blocked == "metadata-file" else download
    rel = str(target.relative_to(root))
    target.chmod(0)
    try:
        proc = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--", sys.executable, "-m",
                               "clef_format", "verify", str(root), "--deep", "--json"], capture_output=True, text=True)
    finally:
        target.chmod(0o755)
    out = json.loads(proc.stdout)
    unreadable = [f for f in out["findings"] if f["code"] == "unreadable"]
    assert proc.returncode == 2 and out["error"], out
    assert [f["file"] for f in unreadable] == [rel] and rel in unreadable[0]["message"] and unreadable[0]["fix"]
    missing = [f for f in out["findings"] if f["code"] == "manifest-missing"]
    assert not any(f.get("file") == "model.safetensors" for f in missing)  # never "nothing to check it against"


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_nonfinite_global_scale_is_named_by_its_value(value: float, tmp_path: Path) -> None:
    """Deep's decode reports a NaN/inf global scale as such, never as "must be positive, got 0.0"."""
    from clef_format.verify.deep import backbone_scale_findings
    from tests.support.hostile_cases import BACKBONE, set_f32

    root = fresh_copy(tmp_path / "ck")
    set_f32(BACKBONE, ".weight_global_scale", value, 0)(root)
    found = [f for f in backbone_scale_findings(read_checkpoint(root)) if f.severity == "error"]
    assert [f.code for f in found] == ["nonfinite-scale"]
    assert "got 0.0" not in found[0].message


# ------------------------------------------------------------------ a file shrinking while it is hashed

def _truncating_progress(path: Path, keep: int):
    """A progress callback that truncates ``path`` to ``keep`` bytes when first called (after the first
    chunk of some file is hashed); a lock makes every other call wait until the truncation is done."""
    import threading

    lock, done = threading.Lock(), []

    def advance(n: int) -> None:
        with lock:
            if not done:
                os.truncate(path, keep)
                done.append(n)

    return advance


@pytest.mark.parametrize("algorithm", hashing.ALGORITHMS)
def test_a_file_truncated_while_hashed_raises_oserror_never_a_signal(tmp_path: Path, algorithm: str) -> None:
    """A memory-mapped file that shrinks under the reader kills the process with SIGBUS; hashing reads
    instead, so a file cut after its first chunk is an ``OSError`` (the caller's ``unreadable`` finding)."""
    p = tmp_path / "big.bin"
    with open(p, "wb") as fh:
        fh.truncate(3 * hashing.BLAKE3_CHUNK + 5)
    with pytest.raises(OSError, match="changed size while it was hashed"):
        hash_file(str(p), algorithm, _truncating_progress(p, 1000))
    assert os.path.getsize(p) == 1000


def test_deep_reports_a_file_truncated_while_hashed_as_unreadable(tmp_path: Path) -> None:
    """``verify --deep`` on a checkpoint whose largest file is cut while it is hashed: an ``unreadable``
    finding naming it (could not run), never a crash or a verdict on the cut bytes."""
    from clef_format.verify.deep import DeepRun

    root = fresh_copy(tmp_path / "ck")
    big = root / "tokenizer.model"
    with open(big, "wb") as fh:
        fh.truncate(16 * hashing.BLAKE3_CHUNK)
    assert main(["manifest", str(root)]) == 0

    class Cutting:
        def add(self, description: str, total: int, unit: str = "B"):
            return _truncating_progress(big, 1000)

    findings = DeepRun(read_checkpoint(str(root)), Cutting()).finish()
    hit = [f for f in findings if f.file == "tokenizer.model"]
    assert [f.code for f in hit] == ["unreadable"], findings
    assert "changed size while it was hashed" in hit[0].message
    # the fix says what helps (wait for the writer), not permissions, which are fine
    assert "permission" not in hit[0].fix and "nothing else writes" in hit[0].fix, hit[0].fix


@pytest.mark.parametrize(("layout", "rel"), [("layout-1", "model.safetensors"), ("layout-2", "model.safetensors"),
                                             ("layout-2", "clef_head/tables_int8.safetensors")])
@pytest.mark.parametrize("with_manifest", [False, True])
@pytest.mark.parametrize("cut", [0, 3])
def test_a_file_cut_during_deep_is_one_unreadable_finding_with_its_fix(fresh, layout: str, rel: str,
                                                                       with_manifest: bool, cut: int) -> None:
    """A file cut after the structure read (while it is hashed, or before its scales or tables are decoded):
    besides the hashing's ``unreadable``, the scale decode said ``bad-header`` once per scale tensor, with
    no fix (or failed on a partial element). Now one finding for the file, ``unreadable`` (could not run),
    whose fix says to run again once nothing writes the checkpoint; never a verdict on the cut bytes."""
    from clef_format.read.safetensors import read_header
    from clef_format.verify.deep import CHANGED_FIX, DeepRun

    root = fresh(layout)
    if with_manifest:
        assert main(["manifest", str(root)]) == 0
    keep = read_header(root / rel).data_start + cut  # 3: inside the first tensor, not a whole element of any dtype
    ck = read_checkpoint(str(root))

    class Cutting:
        def add(self, description: str, total: int, unit: str = "B"):
            return _truncating_progress(root / rel, keep)

    if not with_manifest:  # nothing hashed: cut between the structure read and the deep read
        os.truncate(root / rel, keep)
    findings = DeepRun(ck, Cutting()).finish()
    assert os.path.getsize(root / rel) == keep
    hits = [f for f in findings if f.file == rel]
    assert [(f.code, f.fix) for f in hits] == [("unreadable", CHANGED_FIX)], findings
    assert all(f.fix for f in findings if f.severity in ("error", "warning")), findings


@pytest.mark.parametrize("layout, rel", [("layout-1", "model.safetensors"),
                                         ("layout-2", "clef_head/tables_int8.safetensors")])
def test_verify_of_a_file_cut_after_the_structure_read_keeps_only_the_reading_findings(fresh, layout: str,
                                                                                        rel: str) -> None:
    """The structure read succeeded, then a file was cut before ``--deep`` read it: as when the structure
    read fails, the report is the reader's findings and the ``unreadable`` one (exit 2), not also the
    checks' verdicts beside it ("nothing to check against ... scales were still decoded", legacy-layout)."""
    from clef_format.read.safetensors import read_header
    from clef_format.verify.deep import CHANGED_FIX
    from clef_format.verify.options import VerifyOptions
    from clef_format.verify.run import verify_checkpoint

    root = fresh(layout)
    ck = read_checkpoint(str(root))
    os.truncate(root / rel, read_header(root / rel).data_start + 3)
    report = verify_checkpoint(ck, str(root), VerifyOptions(deep=True), bundled=True)
    assert [(f.code, f.file, f.fix) for f in report.findings] == [("unreadable", rel, CHANGED_FIX)], report.findings
    assert report.could_not_run
