"""The CLI contract: exit codes, one JSON object, human output, --plugin-version, repo ids in the cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from clef_format.cli.main import main
from tests.support.hub_cache import build_hub_cache

CLI = [sys.executable, "-m", "clef_format"]


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env={**os.environ, **(env or {})})


def test_ok_checkpoint_exits_0_with_one_json_object(built):
    proc = run_cli("verify", str(built()), "--json")
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(proc.stdout)  # exactly one object: json.loads refuses trailing data
    assert payload["ok"] is True and payload["layout"] == "layout-2" and payload["findings"] == []
    assert "Traceback" not in proc.stderr


def test_human_output_names_layout_and_fix(built):
    proc = run_cli("verify", str(built("layout-2-unmarked")))
    assert proc.returncode == 1
    assert "layout-2-unmarked" in proc.stdout
    assert "marker-missing" in proc.stdout and "fix: clef-format migrate" in proc.stdout


@pytest.mark.parametrize("args", [["verify", "/definitely/not/here"], ["verify", "/definitely/not/here", "--json"]])
def test_missing_path_exits_2(args):
    proc = run_cli(*args)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    if "--json" in args:
        assert json.loads(proc.stdout)["ok"] is False


def test_file_instead_of_directory_exits_2(tmp_path):
    f = tmp_path / "x.safetensors"
    f.write_bytes(b"")
    assert run_cli("verify", str(f)).returncode == 2


def test_bad_usage_exits_2():
    assert run_cli("verify").returncode == 2
    assert run_cli("no-such-command").returncode == 2


@pytest.mark.parametrize(
    "layout, plugin, ok",
    [
        ("layout-2", "0.2.0", True),
        ("layout-2", "0.3.1", True),
        ("layout-2", "0.1.4", False),
        ("layout-1", "0.1.4", True),
        ("layout-1", "0.2.0", False),
        ("layout-2-unmarked", "0.2.0", False),
        ("layout-2-unmarked", "0.1.0", False),
        ("original-release", "0.2.0", False),
    ],
)
def test_plugin_version(built, capsys, layout, plugin, ok):
    status = main(["verify", str(built(layout)), "--json", "--plugin-version", plugin])
    payload = json.loads(capsys.readouterr().out)
    incompatible = [f for f in payload["findings"] if f["code"] == "plugin-incompatible"]
    assert (not incompatible) == ok
    if not ok:
        assert status == 1 and incompatible[0]["fix"]


def test_plugin_version_honours_the_marker(fresh, capsys):
    root = fresh("layout-2")
    cfg = root / "clef_head" / "joint_head_config.json"
    obj = json.loads(cfg.read_text())
    obj["requires_clef_vllm"] = "0.3.0"  # a bare version reads as >=0.3.0
    cfg.write_text(json.dumps(obj))
    assert main(["verify", str(root), "--plugin-version", "0.2.5"]) == 1
    capsys.readouterr()
    assert main(["verify", str(root), "--plugin-version", "0.3.0"]) == 0


def test_repo_id_in_the_local_cache(built, tmp_path):
    cache = tmp_path / "hub"
    snap = build_hub_cache(cache, "someone/clef-flash-NVFP4", built("layout-1"))
    before = {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()}
    proc = run_cli("verify", "someone/clef-flash-NVFP4", "--json", env={"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    payload = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stderr
    assert payload["layout"] == "layout-1" and payload["hf_snapshot"] is True
    legacy = next(f for f in payload["findings"] if f["code"] == "legacy-layout")
    assert "--output" in legacy["fix"]  # a cache snapshot is never migrated in place
    assert {p: p.stat().st_mtime_ns for p in cache.rglob("*") if p.is_file()} == before
    assert snap.is_dir()


def test_repo_id_not_in_cache_exits_2(tmp_path):
    proc = run_cli("verify", "nobody/nothing", "--json", env={"HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2
    assert "hf download" in json.loads(proc.stdout)["error"]


def test_codes_lists_every_code(capsys):
    from clef_format.spec.findings import CODES

    assert main(["codes", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["codes"] == CODES


def test_example_command_builds_and_verifies(tmp_path):
    proc = run_cli("example", str(tmp_path / "ex"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["layout"] == "layout-2"
    assert run_cli("example", str(tmp_path / "ex")).returncode == 2  # never builds over existing files


def test_verify_layers_view_in_json(built, capsys):
    assert main(["verify", str(built("layout-2", "hybrid")), "--json", "--layers"]) == 0
    layers = json.loads(capsys.readouterr().out)["layers"]
    schemes = {g for row in layers["rows"] for g in row["groups"].values()}
    assert {"fp8-w8a8", "nvfp4-w4a4"} <= schemes  # the Hybrid split is visible per layer


def test_output_to_a_closed_pipe_is_not_a_traceback(built):
    proc = subprocess.run(f"{sys.executable} -m clef_format verify {built('layout-1')} | head -1", shell=True,
                          capture_output=True, text=True)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


def test_vllm_version_option(built, capsys):
    root = str(built("layout-2", "hybrid"))
    assert main(["verify", root, "--json", "--vllm-version", "0.33", "--layers"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["vllm_version"] == "0.33" and payload["findings"] == []
    assert main(["layers", root, "--json", "--vllm-version", "0.33"]) == 0
    assert json.loads(capsys.readouterr().out)["vllm_version"] == "0.33"
    assert main(["layers", root, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["vllm_version"] == "0.28"  # the version the plugin pins
    proc = run_cli("verify", root, "--json", "--vllm-version", "0.1")
    assert proc.returncode == 2 and "older than any version" in proc.stdout + proc.stderr


@pytest.mark.parametrize("command", ["verify", "layers"])
@pytest.mark.parametrize("version", ["0.28", "0.33.1", "0.30", "0.34"])
def test_an_unproven_vllm_version_is_accepted_and_said_so(built, capsys, command: str, version: str) -> None:
    """Versions past 0.28 all have rules (the version table), but only names.PROVEN are proven: verify and
    layers alike say so in an info finding (exit 0), and say nothing for a proven one."""
    from clef_format.vllm_rules.names import PROVEN

    assert main([command, str(built("layout-2", "hybrid")), "--json", "--vllm-version", version]) == 0
    payload = json.loads(capsys.readouterr().out)
    notes = [f for f in payload["findings"] if f["code"] == "vllm-unproven"]
    if version.rsplit(".", 1)[0] in PROVEN or version in PROVEN:
        assert notes == []
    else:
        (note,) = notes
        assert note["severity"] == "info" and version in note["message"] and "not proven" in note["message"]
        assert payload["ok"] and all(p in note["message"] for p in PROVEN)


def test_ctrl_c_after_the_outcome_is_printed_cannot_change_the_exit_status(built) -> None:
    """The console script keeps SIGINT ignored once it has printed its one outcome, so a late Ctrl-C
    cannot turn an exit 0 with ``"ok": true`` into 130; an in-process caller (argv given) gets its
    handler back."""
    code = ("import signal, sys\n"
            "from clef_format.cli import main\n"
            f"sys.argv = ['clef-format', 'verify', {str(built('layout-2', 'hybrid'))!r}, '--json']\n"
            "rc = main()\n"
            "ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN\n"
            "before = signal.getsignal(signal.SIGINT)\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            f"main(['verify', {str(built('layout-2', 'hybrid'))!r}, '--json'])\n"
            "restored = signal.getsignal(signal.SIGINT) is signal.default_int_handler\n"
            "print('RESULT', rc, ignored, restored, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "RESULT 0 True True" in proc.stderr, proc.stderr[-2000:]


def test_an_in_process_caller_gets_its_gc_thresholds_back(built, capsys):
    """main() collects less often while it runs (a 9B header is thousands of long-lived records), and
    restores the caller's thresholds however it ends."""
    import gc

    before = gc.get_threshold()
    try:
        gc.set_threshold(701, 11, 12)
        assert main(["verify", str(built()), "--json"]) == 0
        assert gc.get_threshold() == (701, 11, 12)
        assert main(["verify", "/definitely/not/here", "--json"]) == 2
        assert gc.get_threshold() == (701, 11, 12)
    finally:
        gc.set_threshold(*before)


def test_codes_text_lists_every_code_with_its_meaning_one_per_line(capsys):
    """`clef-format codes` (text): one line per finding code, the code padded to a column, then its
    meaning, in the order of the JSON list."""
    assert main(["codes", "--json"]) == 0
    codes = json.loads(capsys.readouterr().out)["codes"]
    assert main(["codes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{code:24} {meaning}" for code, meaning in codes.items()]


def test_codes_help_says_what_json_does(capsys):
    assert main(["codes", "--help"]) == 0
    out = capsys.readouterr().out
    assert any(line.split() == ["--json", "print", "one", "JSON", "object", "on", "stdout"] for line in out.splitlines())


@pytest.mark.parametrize("name", ["7", "0.28", "1.2.3.4"])
def test_an_output_folder_given_twice_with_and_without_slash_is_one_folder(built, tmp_path, monkeypatch, capsys, name):
    """`--output 7 --output 7/` names one folder, however digit-like its name: not "given twice"."""
    monkeypatch.chdir(tmp_path)
    rc = main(["migrate", str(built("layout-1")), "--to", "layout-2", "--output", name, "--output", f"{name}/",
               "--dry-run", "--json"])
    payload = json.loads(capsys.readouterr().out)
    assert rc == 0, payload["findings"]
    assert os.path.abspath(payload["output"]) == str(tmp_path / name)


def test_a_version_given_twice_in_two_spellings_is_one_version(built, capsys):
    rc = main(["verify", str(built()), "--vllm-version", "0.33", "--vllm-version", "0.33.0", "--json"])
    assert rc == 0, json.loads(capsys.readouterr().out)["findings"]
    capsys.readouterr()
    for first, second in (("0.2.0", "0.2.0.0"), ("0.2", "0.2.0.0"), ("0.2.1", "0.2.1.0")):  # equal under PEP 440
        rc = main(["verify", str(built()), "--plugin-version", first, "--plugin-version", second, "--json"])
        payload = json.loads(capsys.readouterr().out)
        assert rc == 0, payload["findings"]
        assert payload["plugins"][-1]["version"] == second  # the value given last
    rc = main(["verify", str(built()), "--plugin-version", "0.2.0", "--plugin-version", "0.2.0.1", "--json"])
    assert rc == 2 and "given twice" in json.loads(capsys.readouterr().out)["findings"][0]["message"]


def test_an_option_given_twice_with_different_values_is_a_usage_error(built, capsys):
    rc = main(["migrate", str(built("layout-1")), "--to", "layout-2", "--to", "layout-1", "--dry-run", "--json"])
    payload = json.loads(capsys.readouterr().out)
    assert rc == 2 and "--to given twice (layout-2, then layout-1): give it once" in payload["findings"][0]["message"]
