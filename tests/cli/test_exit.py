"""The console command's exit: the interpreter's last full collection has nothing to scan.

At exit CPython runs one full collection over every object still alive (for verify of a 9B checkpoint:
the header's records, the modules; 7% of the command, measured with callgrind: benchmarks/RESULTS.md).
``cli.main`` freezes them first when it runs as a command that writes nothing (no ``argv``); a caller
in-process (``main([...])``) and a command that writes keep the collector as it was."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What the command froze: the count at exit less the count before it ran. An interpreter's start-up
# hooks may freeze objects of their own before any clef-format code runs (a site-packages .pth or
# sitecustomize; 375 on one Python 3.12 install), which no command did.
_PROBE = """
import atexit, gc, sys
before = gc.get_freeze_count()
from clef_format.cli.main import main
atexit.register(lambda: sys.__stderr__.write(f"frozen-at-exit={gc.get_freeze_count() - before}\\n"))
sys.argv = ["clef-format", *sys.argv[1:]]
sys.exit(main())
"""


def test_the_command_freezes_what_it_holds_before_the_exit_collection(fresh) -> None:
    root = fresh()
    proc = subprocess.run([sys.executable, "-c", _PROBE, "verify", str(root), "--json"], capture_output=True,
                          text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0 and json.loads(proc.stdout)["ok"], proc
    frozen = int(proc.stderr.split("frozen-at-exit=")[1].split()[0])
    assert frozen > 10_000, proc.stderr  # the modules and the header's records, not a handful


def test_a_command_that_writes_keeps_the_exit_collection(fresh, tmp_path: Path) -> None:
    """``migrate``, ``manifest``, ``example`` write files: they keep CPython's exit as it is."""
    root = fresh()
    proc = subprocess.run([sys.executable, "-c", _PROBE, "manifest", str(root), "--json"], capture_output=True,
                          text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0 and json.loads(proc.stdout)["written"], proc
    assert "frozen-at-exit=0" in proc.stderr, proc.stderr


def test_a_caller_in_process_keeps_its_collector(fresh, capsys) -> None:
    from clef_format.cli.main import main

    root = fresh()
    before = gc.get_freeze_count(), gc.get_threshold(), gc.isenabled()
    assert main(["verify", str(root), "--json"]) == 0
    assert (gc.get_freeze_count(), gc.get_threshold(), gc.isenabled()) == before
