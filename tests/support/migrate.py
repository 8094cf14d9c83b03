"""Helpers of the migrate tests (no tests here): run the real CLI, read tensor bytes straight from safetensors files."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from clef_format.read.checkpoint import read_checkpoint
from clef_format.read.safetensors import read_header
from clef_format.spec import layouts as L
from clef_format.verify.run import verify_checkpoint

ROOT = Path(__file__).resolve().parents[2]
TABLES = set(L.TABLE_NAMES)


def cli(*args: str, env: dict[str, str] | None = None, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run ``clef-format`` in a real subprocess."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "clef_format.cli", *args], capture_output=True, text=True,
                          env=full_env, cwd=ROOT, **kw)


def migrate_json(*args: str, **kw: Any) -> tuple[int, dict[str, Any]]:
    proc = cli("migrate", *args, "--json", **kw)
    return proc.returncode, json.loads(proc.stdout)


def backbone_digests(root: Path) -> dict[str, str]:
    """sha256 of every non-table backbone tensor's bytes, read by header offsets."""
    ck = read_checkpoint(root)
    out = {}
    for rel in ck.backbone_files:
        h = read_header(root / rel)
        with open(root / rel, "rb") as fh:
            for name, info in h.tensors.items():
                if name in TABLES:
                    continue
                fh.seek(h.data_start + info.begin)
                out[name] = hashlib.sha256(fh.read(info.nbytes)).hexdigest()
    return out


def file_digests(root: Path) -> dict[str, str]:
    """sha256 of every regular file under root (symlinks followed)."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def table_bytes(root: Path) -> dict[str, bytes]:
    """Raw bytes of the BF16 tables in a layout-1 backbone."""
    ck = read_checkpoint(root)
    out = {}
    for name in ck.tables:
        rel = ck.tensor_file[name]
        h = read_header(root / rel)
        info = h.tensors[name]
        with open(root / rel, "rb") as fh:
            fh.seek(h.data_start + info.begin)
            out[name] = fh.read(info.nbytes)
    return out


def verified(root: Path) -> tuple[str, bool, list[str]]:
    report = verify_checkpoint(read_checkpoint(root), str(root))
    return report.layout, report.ok, sorted(f.code for f in report.findings if f.severity == "error")


def siblings(root: Path) -> list[str]:
    """Leftovers of migrate beside the checkpoint (workspace, lock)."""
    return sorted(p.name for p in root.parent.iterdir() if ".clef-migrate" in p.name)


def run_json(capsys: Any, *args: str) -> tuple[int, dict[str, Any]]:
    """``clef-format migrate ARGS --json`` through the real CLI entry point, in-process (saves a torch
    import per call): the exit status and its one JSON object (output captured before is dropped)."""
    from clef_format.cli.main import main

    capsys.readouterr()
    try:
        rc = main(["migrate", *args, "--json"])
    except SystemExit as exc:
        rc = int(exc.code or 0)
    return rc, json.loads(capsys.readouterr().out)
