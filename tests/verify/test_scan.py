"""clef-format scan: every Clef copy of a real-layout Hugging Face cache and of folders, judged as verify judges it.

The cache is built in huggingface_hub's own layout (its ``scan_cache_dir`` must accept it and agree with
every repo, revision, ref and size scan reports); each verdict is compared with what ``clef-format verify``
says of the same copy, and every fix ``scan --fixable`` prints is run and the result rescanned.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.broken import build_broken
from clef_format.fixtures.builders import build_checkpoint
from tests.support.hub_cache import build_hub_cache, build_local_dir, fake_commit

ROOT = Path(__file__).resolve().parents[2]
SETPRIV = shutil.which("setpriv")
UNPRIVILEGED = ([SETPRIV, "--bounding-set=-dac_override,-dac_read_search", "--"]
                if SETPRIV and os.geteuid() == 0 else [])

#: repo id -> [(ref or None, how the revision is built)]: each of the five states across repos and revisions.
REVISIONS = {
    "kurcontko/clef-flash-NVFP4-Hybrid": [("v1", "layout-1"), ("main", "layout-2"), (None, "unmarked")],
    "Cloudflare/clef-flash": [("main", "original-release")],
    "alpha-x-ai/clef-flash-NVFP4": [("main", "marker-invalid"), ("refs/pr/1", "no-head-at-all"), (None, "legacy")],
}


def _state(directory: Path, kind: str) -> Path:
    if kind in ("layout-1", "layout-2", "original-release"):
        return build_checkpoint(directory, kind)
    return build_broken(directory, kind)


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}


def cli(env: dict[str, str], *argv: str, prefix: list[str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*(prefix or []), sys.executable, "-m", "clef_format", *argv], capture_output=True, text=True,
                          env=env, cwd=cwd)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("scan")
    cache = base / "hub"
    for repo_id, revisions in REVISIONS.items():
        for i, (ref, kind) in enumerate(revisions):
            src = _state(base / "src" / f"{repo_id.replace('/', '--')}-{i}", kind)
            build_hub_cache(cache, repo_id, src, revision=ref or f"unreferenced-{i}", commit=fake_commit(f"{repo_id}{i}"))
            if ref is None:  # a revision no ref points to (an older download whose ref moved on)
                (cache / f"models--{repo_id.replace('/', '--')}" / "refs" / f"unreferenced-{i}").unlink()
    # unrelated repos: a model without a Clef head, a dataset
    plain = base / "src" / "plain"
    plain.mkdir(parents=True)
    (plain / "config.json").write_text('{"model_type": "bert"}')
    (plain / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    for i in range(3):
        build_hub_cache(cache, f"someone/unrelated-{i}", plain)
    data = cache / "datasets--someone--data" / "snapshots" / fake_commit("d")
    data.mkdir(parents=True)
    (data / "train.jsonl").write_text("{}\n")
    # folders: a local_dir download, a server's models folder, a symlink that must not be followed
    folders = base / "models"
    build_local_dir(folders / "clef-local", _state(base / "src" / "local", "layout-1"))
    _state(folders / "deep" / "er" / "clef-unmarked", "unmarked")
    (folders / "link-to-cache").symlink_to(cache, target_is_directory=True)
    return {"cache": cache, "folders": folders, "base": base}


def _scan(env: dict[str, str], *argv: str) -> tuple[int, dict]:
    proc = cli(env, "scan", *argv, "--json")
    assert proc.stderr == "" or "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_the_fixture_cache_is_huggingface_hubs_own_layout_and_scan_lists_what_it_lists(world: dict[str, Path]) -> None:
    from huggingface_hub import scan_cache_dir

    info = scan_cache_dir(world["cache"])
    assert not info.warnings
    _, out = _scan(_env(world["cache"]))
    got = {(r["repo_id"], r["revision"]): r for r in out["rows"]}
    expected = {}
    for repo in info.repos:
        if repo.repo_type != "model" or repo.repo_id not in REVISIONS:
            continue
        for rev in repo.revisions:
            expected[(repo.repo_id, rev.commit_hash)] = rev
    assert set(got) == set(expected)  # every Clef revision, referenced or not; no unrelated repo
    for key, rev in expected.items():
        assert sorted(got[key]["refs"]) == sorted(rev.refs)
        assert got[key]["size_on_disk"] == rev.size_on_disk
    assert out["totals"]["copies"] == sum(len(v) for v in REVISIONS.values())


def test_each_rows_verdict_is_verifys(world: dict[str, Path]) -> None:
    env = _env(world["cache"])
    code, out = _scan(env, )
    roots_code, roots_out = _scan(env, str(world["folders"]))
    rows = out["rows"] + roots_out["rows"]
    assert len(roots_out["rows"]) == 2  # the local_dir copy and the deep one; the symlink to the cache not followed
    for row in rows:
        proc = cli(env, "verify", row["where"], "--json")
        verified = json.loads(proc.stdout)
        assert (row["layout"], row["ok"], row["findings"]) == (verified["layout"], verified["ok"], verified["findings"])
        assert row["verdict"] == ("BROKEN" if proc.returncode == 1 else "unreadable" if proc.returncode == 2 else
                                  "warnings" if any(f["severity"] == "warning" for f in verified["findings"]) else "OK")
    assert code == 1 and not out["ok"]  # broken copies are errors of the scan
    states = {(r["layout"], r["verdict"]) for r in rows}
    assert {("layout-1", "warnings"), ("layout-2", "OK"), ("layout-2-unmarked", "BROKEN"),
            ("unknown", "BROKEN")} <= states and any(layout == "original-release" for layout, _ in states)
    verdicts = [r["verdict"] for r in out["rows"]]
    assert verdicts == sorted(verdicts, key=["BROKEN", "unreadable", "warnings", "OK"].index)  # worst first


def test_text_table_and_summary(world: dict[str, Path]) -> None:
    proc = cli(_env(world["cache"]), "scan")
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["WHERE", "LAYOUT", "VERDICT", "SERVES", "WITH", "SIZE", "FIX"]
    n = sum(len(v) for v in REVISIONS.values())
    assert len([x for x in lines[1:] if x.strip()]) == n + 1  # one line per copy, then the summary
    assert lines[-1].startswith(f"{n} copies: ") and "to migrate" in lines[-1] and "to re-download" in lines[-1]
    assert "kurcontko/clef-flash-NVFP4-Hybrid@" in proc.stdout and "(main)" in proc.stdout and "(v1)" in proc.stdout
    # the column of plugins: the one pair rule
    layout1 = next(x for x in lines if "(v1)" in x)
    assert "clef-vllm 0.1.x" in layout1
    layout2 = next(x for x in lines if "Hybrid" in x and "(main)" in x)
    assert "clef-vllm>=0.2.0" in layout2


def _tree(root: Path) -> dict[str, tuple[bool, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            out[str(p.relative_to(root))] = (p.is_symlink(), p.lstat().st_mtime_ns)
    return out


def test_fixable_prints_commands_that_fix_each_broken_copy_and_never_write_the_cache(world: dict[str, Path],
                                                                                      tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    shutil.copytree(world["cache"], cache, symlinks=True)
    folders = tmp_path / "models"
    shutil.copytree(world["folders"], folders, symlinks=True)
    env = _env(cache)
    before = _tree(cache)
    into = tmp_path / "fixed"
    into.mkdir()
    script = cli(env, "scan", "--fixable", "--into", str(into)).stdout + "\n" + \
        cli(env, "scan", str(folders), "--fixable").stdout
    commands = [x for x in script.splitlines() if x and not x.startswith("#")]
    # one line per BROKEN copy: a command where a migration fixes it, else a comment with the advice
    _, cached = _scan(env)
    _, local = _scan(env, str(folders))
    broken = [r for r in cached["rows"] + local["rows"] if r["verdict"] == "BROKEN"]
    assert len([x for x in script.splitlines() if x]) == len(broken)
    assert commands and all(c.startswith("clef-format migrate ") for c in commands)
    assert all("--output" in c for c in commands if "@" in c)  # a cached snapshot: never in place
    for command in commands:
        argv = shlex.split(command)[1:]
        proc = cli(env, *argv, cwd=tmp_path)
        assert proc.returncode == 0, (command, proc.stdout, proc.stderr)
    assert _tree(cache) == before  # the cache was never written
    _, rescanned = _scan(env, str(into), str(folders))
    verdicts = {r["where"]: r["verdict"] for r in rescanned["rows"]}
    fixed_here = [shlex.split(c)[2] for c in commands if "@" not in c]
    outputs = [r for r in verdicts if r.startswith(str(into))]
    assert len(outputs) == len([c for c in commands if "@" in c])
    assert all(verdicts[w] == "OK" for w in outputs + fixed_here), verdicts


def test_a_snapshot_given_as_root_is_named_as_in_the_cache(world: dict[str, Path], tmp_path: Path) -> None:
    """A ROOT that is itself a cached snapshot (or its ``snapshots/`` folder): --fixable proposed an output
    named after the commit folder, not ``<org>--<name>-<commit12>-<layout>`` as for the same snapshot found
    in the cache, and the row lost its repo, revision and refs. One name, one identity, either way."""
    env = _env(world["cache"])
    _, cached = _scan(env, "--fixable", "--into", str(tmp_path))
    outputs = {c["where"]: c["command"].split(" --output ", 1)[1] for c in cached["commands"] if "command" in c}
    assert outputs
    for where, output in outputs.items():
        row = next(r for r in cached["rows"] if r["where"] == where)
        snapshot = world["cache"] / f"models--{row['repo_id'].replace('/', '--')}" / "snapshots" / row["revision"]
        for root in (snapshot, snapshot.parent):
            _, given = _scan(env, str(root), "--fixable", "--into", str(tmp_path))
            mine = next(r for r in given["rows"] if r["where"] == str(snapshot))
            assert (mine["repo_id"], mine["revision"], mine["refs"]) == (row["repo_id"], row["revision"], row["refs"])
            command = next(c["command"] for c in given["commands"] if c["where"] == str(snapshot))
            assert command.split(" --output ", 1)[1] == output, (command, output)


def test_fixable_never_prints_a_live_line_a_folder_name_could_inject(world: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "models"
    evil = root / "a\ntouch PWNED #"
    _state(evil, "unmarked")
    spaced = root / "b c;$(touch PWNED2)"
    _state(spaced, "unmarked")
    proc = cli(_env(world["cache"]), "scan", str(root), "--fixable")
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and sum(x.startswith("#") for x in lines) == 1  # the newline: a comment, one line
    subprocess.run(["sh", "-c", proc.stdout.replace("clef-format", f"{sys.executable} -m clef_format")],
                   cwd=tmp_path, env=_env(world["cache"]), capture_output=True)
    assert not (tmp_path / "PWNED").exists() and not (tmp_path / "PWNED2").exists()
    assert cli(_env(world["cache"]), "verify", str(spaced)).returncode == 0  # the quoted command fixed it
    table = cli(_env(world["cache"]), "scan", str(root)).stdout.splitlines()
    assert len(table) == 5  # header, two rows, blank line and summary: the newline does not break a row


def test_scan_checks_the_plugins_verify_checks(world: dict[str, Path], tmp_path: Path) -> None:
    from clef_format.fixtures.release import write_vllm_plugin

    root = tmp_path / "models"
    ck = build_checkpoint(root / "apart", "layout-2")
    write_vllm_plugin(ck, "0.1.4")  # weights of one day, plugin of another: the 2026-10-07 failure
    env = _env(world["cache"])
    verified = json.loads(cli(env, "verify", str(ck), "--json").stdout)
    code, out = _scan(env, str(root))
    assert code == 1 and out["rows"][0]["findings"] == verified["findings"]
    assert out["rows"][0]["plugins"] == verified["plugins"]
    assert "bundled-plugin-mismatch" in {f["code"] for f in verified["findings"]}


def test_an_unlistable_folder_is_a_row_not_an_abort(world: dict[str, Path], tmp_path: Path) -> None:
    if os.geteuid() == 0 and not UNPRIVILEGED:
        pytest.skip("root without setpriv: permissions are not enforced")
    root = tmp_path / "models"
    build_checkpoint(root / "good", "layout-2")
    closed = root / "closed"
    closed.mkdir()
    closed.chmod(0)
    try:
        proc = cli(_env(world["cache"]), "scan", str(root), "--json", prefix=UNPRIVILEGED)
    finally:
        closed.chmod(0o755)
    out = json.loads(proc.stdout)
    verdicts = {r["where"]: r["verdict"] for r in out["rows"]}
    assert verdicts == {str(closed): "unreadable", str(root / "good"): "OK"}
    assert proc.returncode == 0 and [f["code"] for f in out["findings"]] == ["copy-unreadable"]


def test_depth_cap_is_a_finding_not_a_traceback(tmp_path: Path, world: dict[str, Path]) -> None:
    from clef_format.read.copies import MAX_DEPTH

    deep = tmp_path.joinpath(*["d"] * (MAX_DEPTH + 3))
    deep.mkdir(parents=True)
    code, out = _scan(_env(world["cache"]), str(tmp_path))
    assert code == 0 and [f["code"] for f in out["findings"]] == ["scan-limit"]


def test_usage(world: dict[str, Path], tmp_path: Path) -> None:
    env = _env(world["cache"])
    for argv, code in ((["scan", str(tmp_path / "nope")], "path-not-found"), (["scan", ""], "usage-error"),
                       (["scan", "--into", str(tmp_path)], "usage-error"),
                       (["scan", "--fixable", "--into", str(tmp_path / "absent")], "usage-error")):
        proc = cli(env, *argv, "--json")
        assert proc.returncode == 2 and json.loads(proc.stdout)["findings"][0]["code"] == code
    empty = tmp_path / "empty-cache"
    empty.mkdir()
    proc = cli(_env(empty), "scan")
    assert proc.returncode == 0 and "no Clef copy found" in proc.stdout
    assert cli(_env(empty), "scan", "--fixable").stdout == ""  # nothing broken: nothing printed
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    proc = cli(_env(a_file), "scan", "--json")  # a cache that cannot be listed: could not run
    assert proc.returncode == 2 and json.loads(proc.stdout)["findings"][0]["code"] == "unreadable"


def test_fixable_into_a_folder_inside_the_cache_is_refused(world: dict[str, Path]) -> None:
    """``--into`` inside the Hugging Face cache: every migrate command printed would be refused (clef-format
    never writes into a cache), so scan refuses first, a usage error with a fix, printing no command."""
    env = _env(world["cache"])
    inside = world["cache"] / "my-migrated"
    inside.mkdir(exist_ok=True)
    try:
        proc = cli(env, "scan", "--fixable", "--into", str(inside), "--json")
        out = json.loads(proc.stdout)
        assert proc.returncode == 2 and out["findings"][0]["code"] == "usage-error", out
        assert "Hugging Face cache" in out["findings"][0]["message"] and out["findings"][0]["fix"]
        text = cli(env, "scan", "--fixable", "--into", str(inside))
        assert text.returncode == 2 and "migrate" not in text.stdout
        # no --into: the current folder is where the copies would go, and it is inside the cache too
        for argv in (["--json"], []):
            proc = cli(env, "scan", "--fixable", *argv, cwd=inside)
            assert proc.returncode == 2 and (not proc.stdout if not argv else
                                             not json.loads(proc.stdout).get("commands")), proc
            said = json.loads(proc.stdout)["findings"][0] if argv else {"message": proc.stderr, "fix": proc.stderr}
            assert "current folder" in said["message"] and "Hugging Face cache" in said["message"], said
            assert "--into" in said["fix"]
        # from inside the cache, copies fixed in place (folders outside it) write nothing here: not refused
        proc = cli(env, "scan", "--fixable", str(world["folders"]), cwd=inside)
        assert proc.returncode == 1 and "clef-format migrate" in proc.stdout and "--output" not in proc.stdout, proc
    finally:
        inside.rmdir()
