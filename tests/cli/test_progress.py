"""The CLI's progress bars: on stderr, only on a terminal (or when forced), from any thread, gone at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from clef_format.cli.progress import TerminalProgress, stderr_is_terminal


def test_nothing_is_drawn_off_a_terminal(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TTY_COMPATIBLE", "0")
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert not stderr_is_terminal()
    with TerminalProgress() as p:
        advance = p.add("hashing 1 file(s)", 100)
        advance(100)
    assert capsys.readouterr() == ("", "")


def test_bars_from_threads_on_a_forced_terminal(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    with TerminalProgress() as p:
        adv = [p.add(f"part {i}", 4000) for i in range(3)]
        threads = [threading.Thread(target=lambda a=a: [a(1) for _ in range(4000)]) for a in adv]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [bar.n for bar in p._bars] == [4000, 4000, 4000]
    out, err = capsys.readouterr()
    assert out == "" and "part 0" in err and "part 2" in err
    assert p._bars == []


def test_no_tqdm_import_when_not_drawing(tmp_path: Path) -> None:
    """A pipe gets no bar and the process never imports tqdm (start-up stays light)."""
    from clef_format.fixtures.builders import build_checkpoint

    root = build_checkpoint(tmp_path / "ck", layout="layout-1", build="bf16", num_layers=4)
    code = ("import sys, io, contextlib\nfrom clef_format.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    rc = main(['migrate', {str(root)!r}, '--to', 'layout-2', '--json'])\n"
            "print(rc, 'tqdm' in sys.modules)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("TTY_COMPATIBLE", "FORCE_COLOR")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.stdout.strip() == "0 False", proc.stderr
    assert proc.stderr == ""


def test_migrate_draws_on_a_terminal_and_stdout_stays_json(tmp_path: Path) -> None:
    from clef_format.fixtures.builders import build_checkpoint

    root = build_checkpoint(tmp_path / "ck", layout="layout-1", build="bf16", num_layers=4)
    env = {**os.environ, "TTY_COMPATIBLE": "1"}
    proc = subprocess.run([sys.executable, "-m", "clef_format", "migrate", str(root), "--to", "layout-2", "--json"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True
    assert "tables_int8.safetensors" in proc.stderr and "B/s" in proc.stderr
