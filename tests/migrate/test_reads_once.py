"""migrate reads, walks and verifies each tree once: every open and every listing of a real run, counted.

The counts come from the interpreter's own audit events (``open`` for ``open()`` and ``os.open``,
``os.scandir`` / ``os.listdir`` for a listing: PEP 578), recorded while the real CLI entry point
migrates a real checkpoint on disk; the crash points of ``migrate.crash`` (its ``adversary`` hook)
tell the moments apart. Nothing is stubbed: a second read of a tree, a verify after the swap or a
journal read twice is an extra event here.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import pytest

from clef_format.migrate import crash
from clef_format.spec import layouts as L
from tests.support.migrate import run_json

_events: list[tuple[str, str, str]] | None = None  # (moment, kind, path) while a run is recorded
_moment = ["before"]
_hooked = False


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if _events is None or not args or not isinstance(args[0], (str, bytes)):
        return
    if event == "open":
        flags = args[2] if isinstance(args[2], int) else 0
        mode = args[1] if isinstance(args[1], str) else ""
        writes = bool(flags & (os.O_WRONLY | os.O_RDWR)) or any(c in mode for c in "wa+x")
        _events.append((_moment[0], "write" if writes else "read", os.fsdecode(args[0])))
    elif event in ("os.scandir", "os.listdir"):
        _events.append((_moment[0], "list", os.fsdecode(args[0])))


def _record(run: Callable[[], Any]) -> tuple[Any, Counter[tuple[str, str, str]]]:
    """Run ``run`` with every open and listing recorded; the moment turns "after-swap" at the first
    crash point of the cleanup, which follows the swap."""
    global _events, _hooked
    if not _hooked:
        sys.addaudithook(_hook)  # cannot be removed: inert while _events is None
        _hooked = True

    def adversary(phase: str, n: int) -> None:
        if phase == "cleanup":
            _moment[0] = "after-swap"

    _moment[0] = "before"
    _events = []
    try:
        with crash.adversary(adversary):
            out = run()
        return out, Counter(_events)
    finally:
        _events = None


def _under(counts: Counter[tuple[str, str, str]], moment: str, kind: str, root: Path) -> dict[str, int]:
    """rel path -> count of ``kind`` events at ``moment`` under ``root`` (``.`` is the folder itself)."""
    real = os.path.realpath(root)
    out: dict[str, int] = {}
    for (m, k, path), n in counts.items():
        full = os.path.realpath(path) if os.path.isabs(path) else os.path.realpath(os.path.join(os.getcwd(), path))
        if m == moment and k == kind and (full == real or full.startswith(real + os.sep)):
            rel = os.path.relpath(full, real).replace(os.sep, "/")
            out[rel] = out.get(rel, 0) + n
    return out


def _source_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_an_in_place_run_reads_each_tree_once_and_nothing_after_the_swap(fresh, capsys) -> None:
    root = fresh("layout-1")
    files = _source_files(root)
    ws = root.parent / f".{root.name}.clef-migrate"
    (rc, report), counts = _record(lambda: run_json(capsys, str(root)))
    assert rc == 0 and report["ok"] and report["layout"] == "layout-2", report["findings"]

    # after the swap (a rename: the staged tree, verified, is what T now holds) nothing of T is opened or
    # listed: the staged tree's verify report is the final report
    assert _under(counts, "after-swap", "read", root) == {}
    assert _under(counts, "after-swap", "list", root) == {}

    # the source, before the swap: every file opened once by the survey (it proves each readable) and
    # once by the reader (the checkpoint read once); the backbone besides by the two outputs made from
    # it and once by verify's scale checks (a few bytes each; the global-scale check reuses what the
    # scalar check read); nothing else
    reads = _under(counts, "before", "read", root)
    expect = {rel: 2 for rel in files}
    expect[L.BACKBONE_SINGLE] += 2 + 1
    assert reads == expect
    # the source folder listed four times: the survey (which also takes the state the swap is guarded
    # by and finds mounts), the reader, the staging (links every kept file) and the recheck right before
    # the swap (proves the tree unchanged since the survey)
    assert _under(counts, "before", "list", root) == {".": 4, "clef_head": 4}

    # the staged tree: listed once by its verify, once by the check that every entry was carried and
    # once by the walk that fsyncs its folders and takes the state its journal records; each file read
    # once by its verify (the written tables and backbone more: the writer's own proof of the tables,
    # verify's scalar reads)
    staged = _under(counts, "before", "list", ws / "new")
    assert staged == {".": 3, "clef_head": 3}
    staged_reads = _under(counts, "before", "read", ws / "new")
    for rel in files:
        if rel not in (L.BACKBONE_SINGLE, L.HEAD_CONFIG):
            assert staged_reads.pop(rel) == 1, rel
    assert staged_reads.pop(L.HEAD_CONFIG) == 1
    assert staged_reads.pop(L.BACKBONE_SINGLE) == 1 + 1  # verify's reader, then its scale reads (once)
    assert staged_reads.pop(L.TABLES) == 2 + 3
    assert staged_reads == {"clef_head": 1, ".": 1}  # folders opened to be fsynced

    # the journal: read once (under the lock), written at each step of the run
    assert _under(counts, "before", "read", ws).get("journal.json") == 1


@pytest.mark.parametrize("flag", ["--dry-run", "--output"])
def test_the_journal_is_read_once_per_call(fresh, capsys, tmp_path: Path, flag: str) -> None:
    root = fresh("layout-1")
    out = tmp_path / "out"
    args = [str(root), flag] + ([str(out)] if flag == "--output" else [])
    target = out if flag == "--output" else root
    ws = target.parent / f".{target.name}.clef-migrate"
    (rc, report), counts = _record(lambda: run_json(capsys, *args))
    assert rc == 0 and report["ok"], report["findings"]
    reads = Counter()
    for moment in ("before", "after-swap"):
        reads.update(_under(counts, moment, "read", ws))
    assert reads["journal.json"] == 1
    if flag == "--output":  # the output after the swap: neither read nor listed again
        assert _under(counts, "after-swap", "read", out) == {}
        assert _under(counts, "after-swap", "list", out) == {}
        assert _under(counts, "before", "list", root)["."] == 4  # as in place: survey, reader, staging, recheck
