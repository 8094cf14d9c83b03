"""The CLI contract, enforced for every command x every failure class (README, "Exit status").

0 ok (warnings allowed); 1 errors found or refused; 2 could not run (usage error, path missing,
permission denied, unreadable file or unlistable directory, interrupted). With ``--json`` exactly one
JSON object on stdout in every case, with the same leading keys for every command. The matrix is
built from ``COMMANDS``: a command added without its cases fails ``test_every_command_is_covered``.

Permissions are enforced for root too: each run drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH
(``setpriv``), so a mode-000 file is unreadable to the process as it would be to a plain user.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from clef_format.cli.commands import COMMANDS
from clef_format.report import ENVELOPE_KEYS
from clef_format.spec import layouts as L

CLI = [sys.executable, "-m", "clef_format"]
SETPRIV = shutil.which("setpriv")
UNPRIVILEGED = ([SETPRIV, "--bounding-set=-dac_override,-dac_read_search", "--"]
                if SETPRIV and os.geteuid() == 0 else [])

#: Failure class -> the exit status the contract demands.
CLASSES = {"ok": 0, "errors": 1, "usage": 2, "path-missing": 2, "permission-denied": 2, "unreadable-file": 2,
           "interrupted": 2}

#: Cases that cannot exist, with the reason (everything else must have a case below).
NOT_APPLICABLE = {
    ("example", "errors"): "example builds a valid checkpoint by construction",
    ("example", "path-missing"): "example creates its directory",
    ("example", "unreadable-file"): "example reads nothing it did not write",
    ("example", "interrupted"): "covered by verify: example's verify is verify's code",
    ("codes", "errors"): "codes reads nothing",
    ("codes", "path-missing"): "codes takes no path",
    ("codes", "permission-denied"): "codes takes no path",
    ("codes", "unreadable-file"): "codes takes no path",
    ("codes", "interrupted"): "codes finishes before a signal can arrive",
    ("layers", "interrupted"): "layers reads two JSON files and finishes before a signal can arrive",
    ("scan", "unreadable-file"): "a copy whose file cannot be read is a row (verdict unreadable, finding "
                                 "copy-unreadable) and the scan goes on: tests/verify/test_scan.py",
}

Setup = Callable[[Path], "list[str] | tuple[list[str], dict[str, str]]"]


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _chmod000(path: Path) -> None:
    path.chmod(0)


def cases(built: Callable[..., Path]) -> dict[tuple[str, str], Setup]:
    """(command, class) -> a function that prepares a directory and returns the argv (and extra env)."""
    def good(tmp: Path, layout: str = "layout-2") -> Path:
        return _copy(built(layout), tmp / "ck")

    def unreadable_dir(tmp: Path) -> Path:
        ck = good(tmp)
        _chmod000(ck)
        return ck

    def unreadable_head_config(tmp: Path) -> Path:
        ck = good(tmp, "layout-1")
        _chmod000(ck / L.HEAD_CONFIG)
        return ck

    def unreadable_config(tmp: Path) -> Path:
        ck = good(tmp)
        _chmod000(ck / L.CONFIG)
        return ck

    def broken(tmp: Path) -> Path:
        ck = good(tmp)
        (ck / L.TABLES).unlink()
        (ck / L.HEAD_CONFIG).write_text(json.dumps({"hidden_size": 1}))
        return ck

    def truncated(tmp: Path) -> Path:
        ck = good(tmp)
        with open(ck / L.BACKBONE_SINGLE, "r+b") as fh:
            fh.truncate(1000)
        return ck

    def bad_quant(tmp: Path) -> Path:
        ck = good(tmp)
        cfg = json.loads((ck / L.CONFIG).read_text())
        cfg["quantization_config"]["config_groups"] = {"g": {"targets": ["Linear"], "weights": {"num_bits": 3}}}
        (ck / L.CONFIG).write_text(json.dumps(cfg))
        return ck

    def full(tmp: Path) -> Path:
        """The full-size checkpoint as hard links: hashing it takes seconds; nothing rewrites its files."""
        dst = tmp / "full"
        subprocess.run(["cp", "-al", str(built("layout-2", full_size=True)), str(dst)], check=True)
        return dst

    def fulls(tmp: Path) -> Path:
        """Three full-size copies as hard links: scan --deep hashes them one after the other (seconds each)."""
        dst = tmp / "copies"
        dst.mkdir()
        for name in ("a", "b", "c"):
            subprocess.run(["cp", "-al", str(built("layout-2", full_size=True)), str(dst / name)], check=True)
        return dst

    missing = lambda tmp: tmp / "absent"  # noqa: E731
    c: dict[tuple[str, str], Setup] = {
        ("verify", "ok"): lambda t: ["verify", str(good(t))],
        ("verify", "errors"): lambda t: ["verify", str(broken(t))],
        ("verify", "usage"): lambda t: ["verify", str(good(t)), "--plugin-version", "notaversion"],
        ("verify", "path-missing"): lambda t: ["verify", str(missing(t))],
        ("verify", "permission-denied"): lambda t: ["verify", str(unreadable_dir(t))],
        ("verify", "unreadable-file"): lambda t: ["verify", str(unreadable_head_config(t))],
        ("verify", "interrupted"): lambda t: ["verify", str(full(t)), "--deep"],
        ("migrate", "ok"): lambda t: ["migrate", str(good(t, "layout-1")), "--to", "layout-2"],
        ("migrate", "errors"): lambda t: ["migrate", str(broken(t)), "--to", "layout-1"],
        ("migrate", "usage"): lambda t: ["migrate", str(good(t)), "--to", "layout-9"],
        ("migrate", "path-missing"): lambda t: ["migrate", str(missing(t))],
        ("migrate", "permission-denied"): lambda t: ["migrate", str(unreadable_dir(t))],
        ("migrate", "unreadable-file"): lambda t: ["migrate", str(unreadable_head_config(t))],
        ("migrate", "interrupted"): lambda t: (["migrate", str(good(t, "layout-1"))],
                                              {"CLEF_FORMAT_CRASH_AT": "journal:1:INT"}),
        ("layers", "ok"): lambda t: ["layers", str(good(t))],
        ("layers", "errors"): lambda t: ["layers", str(bad_quant(t))],
        ("layers", "usage"): lambda t: ["layers", str(good(t)), "--bogus"],
        ("layers", "path-missing"): lambda t: ["layers", str(missing(t))],
        ("layers", "permission-denied"): lambda t: ["layers", str(unreadable_dir(t))],
        ("layers", "unreadable-file"): lambda t: ["layers", str(unreadable_config(t))],
        ("manifest", "ok"): lambda t: ["manifest", str(good(t))],
        ("manifest", "errors"): lambda t: ["manifest", str(truncated(t))],
        ("manifest", "usage"): lambda t: ["manifest"],
        ("manifest", "path-missing"): lambda t: ["manifest", str(missing(t))],
        ("manifest", "permission-denied"): lambda t: ["manifest", str(unreadable_dir(t))],
        ("manifest", "unreadable-file"): lambda t: ["manifest", str(unreadable_head_config(t))],
        ("manifest", "interrupted"): lambda t: ["manifest", str(full(t))],
        ("example", "ok"): lambda t: ["example", str(t / "new")],
        ("example", "usage"): lambda t: ["example", str(good(t))],  # exists and is not empty
        ("example", "permission-denied"): lambda t: (t / "ro").mkdir(mode=0o555) or ["example", str(t / "ro" / "x")],
        ("scan", "ok"): lambda t: ["scan", str(good(t).parent)],
        ("scan", "errors"): lambda t: ["scan", str(broken(t).parent)],
        ("scan", "usage"): lambda t: ["scan", str(t), "--jobs", "0"],
        ("scan", "path-missing"): lambda t: ["scan", str(missing(t))],
        ("scan", "permission-denied"): lambda t: ["scan", str(unreadable_dir(t))],
        ("scan", "interrupted"): lambda t: ["scan", str(fulls(t)), "--deep"],
        ("codes", "ok"): lambda t: ["codes"],
        ("codes", "usage"): lambda t: ["codes", "extra-argument"],
    }
    return c


def _default_sigint() -> None:
    """A command starts as from a shell: Ctrl-C raises (a test runner may have it ignored, and it is inherited)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its threads so far (``/proc/PID/stat`` fields 14 and 15)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_until_working(proc: subprocess.Popen[str], cpu: float = 1.0, timeout: float = 120.0) -> None:
    """Until the command has spent ``cpu`` seconds of CPU: well past Python's start and the imports (about
    0.2 s), inside the hashing (tens of seconds of CPU), whatever the machine's load."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline and _cpu_seconds(proc.pid) < cpu:
        time.sleep(0.02)


def _run(argv: list[str], env: dict[str, str], interrupt: bool) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **env}
    if not interrupt or "CLEF_FORMAT_CRASH_AT" in env:
        return subprocess.run([*UNPRIVILEGED, *CLI, *argv], capture_output=True, text=True, env=full_env, timeout=600,
                              preexec_fn=_default_sigint)
    proc = subprocess.Popen([*UNPRIVILEGED, *CLI, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full_env, preexec_fn=_default_sigint)
    _wait_until_working(proc)  # inside hashing 10.7 GB, past the imports (a fixed sleep raced a loaded machine)
    assert proc.poll() is None, "the command finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_every_command_is_covered(built: Callable[..., Path]) -> None:
    have = set(cases(built)) | set(NOT_APPLICABLE)
    want = {(cmd, cls) for cmd in COMMANDS for cls in CLASSES}
    assert want - have == set(), f"commands x classes without a case or a reason: {sorted(want - have)}"


def _matrix() -> list[tuple[str, str]]:
    return [(cmd, cls) for cmd in COMMANDS for cls in CLASSES if (cmd, cls) not in NOT_APPLICABLE]


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "text"])
@pytest.mark.parametrize("command, cls", _matrix())
def test_contract(command: str, cls: str, as_json: bool, built: Callable[..., Path], tmp_path: Path) -> None:
    if cls in ("permission-denied", "unreadable-file") and os.geteuid() == 0 and not UNPRIVILEGED:
        pytest.skip("running as root without setpriv: permissions cannot be enforced")
    tmp_path.chmod(0o755)
    made = cases(built)[(command, cls)](tmp_path)
    argv, env = made if isinstance(made, tuple) else (made, {})
    proc = _run(argv + (["--json"] if as_json else []), env, cls == "interrupted")
    try:
        assert proc.returncode == CLASSES[cls], (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
        assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
        if as_json:
            payload = json.loads(proc.stdout)  # exactly one object: json.loads refuses trailing data
            assert list(payload)[:len(ENVELOPE_KEYS)] == list(ENVELOPE_KEYS)
            assert payload["command"] == command
            assert payload["ok"] is (cls == "ok")
            codes = {f["code"] for f in payload["findings"]}
            expected = {"usage": "usage-error", "path-missing": "path-not-found", "permission-denied": "unreadable",
                        "unreadable-file": "unreadable", "interrupted": "interrupted"}.get(cls)
            if command == "example" and cls == "permission-denied":
                expected = "unwritable"
            if expected:
                assert expected in codes, payload["findings"]
            if cls in ("unreadable-file", "permission-denied"):  # access, never a statement about content
                assert not codes & {"marker-missing", "missing-file", "bad-config", "unknown-layout"}, codes
        else:
            assert proc.stdout.strip() or proc.stderr.strip()
    finally:
        for p in tmp_path.rglob("*"):  # let pytest clean up what the case made unreadable
            if not p.is_symlink():
                p.chmod(0o755)


@pytest.mark.parametrize("command", ["verify", "layers", "manifest", "migrate"])
def test_a_path_under_a_folder_that_cannot_be_entered_is_unreadable_not_missing(command: str, built, tmp_path: Path
                                                                               ) -> None:
    """``verify /proc/1/root/...`` or ``ck`` under a mode-000 folder: the path may well be there, only
    not ours to see: ``unreadable`` (permission denied) with its fix, never "no such directory"."""
    if os.geteuid() == 0 and not UNPRIVILEGED:
        pytest.skip("running as root without setpriv: permissions cannot be enforced")
    tmp_path.chmod(0o755)
    locked = tmp_path / "locked"
    shutil.copytree(built("layout-2"), locked / "ck")
    locked.chmod(0)
    try:
        proc = _run([command, str(locked / "ck"), "--json"], {}, False)
    finally:
        locked.chmod(0o755)
    payload = json.loads(proc.stdout)
    assert proc.returncode == 2 and [f["code"] for f in payload["findings"]] == ["unreadable"], payload
    assert "Permission denied" in payload["error"] and payload["findings"][0]["fix"], payload
