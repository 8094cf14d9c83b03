"""Durability ordering, observed through the filesystem calls migrate and manifest really make.

A SIGKILL test cannot see a missing fsync: the kernel still writes the page cache. A power cut can.
What survives one is decided by the order of calls, so this suite records them (``os.open``,
``builtins.open``, ``os.fsync``, ``os.mkdir``, ``os.link``, ``os.unlink``, ``os.rename`` /
``os.replace`` and ``renameat2``) during a real run, and checks the rules of a crash-safe publish on the trace:

1. data before the name: every file written in the run is fsynced after it was opened for writing
   and before the rename (or exchange, or link) that publishes it or a directory holding it;
2. entries before the name: every directory that gained an entry (a created file, a directory, a
   link) inside a tree being published is fsynced after that entry appeared and before the publish;
3. the name itself: after each publish, the directory holding the new name is fsynced before the
   command returns, and after a rename or exchange before the next one (a journal that says
   "swapped" must never be durable before the swap it records).

The rules are read from the trace, not from the code, so a refactor that drops or reorders an
fsync fails here whatever function it moved to.
"""

from __future__ import annotations

import builtins
import ctypes
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from clef_format.cli.main import main
from tests.support.migrate import verified
from tests.support.libc_wrap import Libc

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _norm(p: Any) -> str:
    return os.path.normpath(os.path.abspath(os.fsdecode(p)))


@dataclass
class Trace:
    """The calls of one run, in order: (kind, path, other path)."""

    events: list[tuple[str, str, str | None]] = field(default_factory=list)
    fds: dict[int, str] = field(default_factory=dict)
    active: bool = False

    def add(self, kind: str, path: str, other: str | None = None) -> None:
        if self.active:
            self.events.append((kind, path, other))


def _install(monkeypatch: pytest.MonkeyPatch, trace: Trace) -> None:
    real_open, real_bopen, real_fsync = os.open, builtins.open, os.fsync
    real_mkdir, real_link, real_rename, real_replace = os.mkdir, os.link, os.rename, os.replace
    real_unlink, real_remove = os.unlink, os.remove

    def t_open(path: Any, flags: int, *a: Any, **k: Any) -> int:
        fd = real_open(path, flags, *a, **k)
        if isinstance(path, (str, bytes, os.PathLike)) and "dir_fd" not in k:
            trace.fds[fd] = _norm(path)
            if flags & os.O_CREAT:
                trace.add("create", _norm(path))
            if flags & _WRITE_FLAGS:
                trace.add("write", _norm(path))
        return fd

    def t_bopen(file: Any, mode: str = "r", *a: Any, **k: Any) -> Any:
        fh = real_bopen(file, mode, *a, **k)
        if isinstance(file, (str, bytes, os.PathLike)):
            trace.fds[fh.fileno()] = _norm(file)
            if any(c in mode for c in "wax+"):
                if any(c in mode for c in "wax"):
                    trace.add("create", _norm(file))
                trace.add("write", _norm(file))
        return fh

    def t_fsync(fd: Any) -> None:
        real_fsync(fd)
        n = fd if isinstance(fd, int) else fd.fileno()
        if n in trace.fds:
            trace.add("fsync", trace.fds[n])

    def t_mkdir(path: Any, *a: Any, **k: Any) -> None:
        real_mkdir(path, *a, **k)
        trace.add("create", _norm(path))

    def t_link(src: Any, dst: Any, *a: Any, **k: Any) -> None:
        real_link(src, dst, *a, **k)
        trace.add("create", _norm(dst))
        trace.add("link", _norm(src), _norm(dst))

    def t_unlink(path: Any, *a: Any, **k: Any) -> None:
        real_unlink(path, *a, **k)
        if "dir_fd" not in k:
            trace.add("remove", _norm(path))

    def t_remove(path: Any, *a: Any, **k: Any) -> None:
        real_remove(path, *a, **k)
        if "dir_fd" not in k:
            trace.add("remove", _norm(path))

    def t_rename(src: Any, dst: Any, *a: Any, **k: Any) -> None:
        real_rename(src, dst, *a, **k)
        trace.add("publish", _norm(src), _norm(dst))

    def t_replace(src: Any, dst: Any, *a: Any, **k: Any) -> None:
        real_replace(src, dst, *a, **k)
        trace.add("publish", _norm(src), _norm(dst))

    def recording_renameat2(real: Callable[..., int]) -> Callable[..., int]:
        def renameat2(olddir: int, old: bytes, newdir: int, new: bytes, flags: int) -> int:
            rc = real(olddir, old, newdir, new, flags)
            if rc == 0:  # an exchange publishes both names at once
                trace.add("exchange", _norm(old), _norm(new))
            return rc

        return renameat2

    real_cdll = ctypes.CDLL
    monkeypatch.setattr(os, "open", t_open)
    monkeypatch.setattr(builtins, "open", t_bopen)
    monkeypatch.setattr(os, "fsync", t_fsync)
    monkeypatch.setattr(os, "mkdir", t_mkdir)
    monkeypatch.setattr(os, "link", t_link)
    monkeypatch.setattr(os, "rename", t_rename)
    monkeypatch.setattr(os, "unlink", t_unlink)
    monkeypatch.setattr(os, "remove", t_remove)
    monkeypatch.setattr(os, "replace", t_replace)
    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **k: Libc(real_cdll(*a, **k), recording_renameat2))


def _inside(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree + os.sep)


_NAMING = ("publish", "exchange")  # calls that give a tree or file its final name (a link only adds an entry)


def _publishes(events: list[tuple[str, str, str | None]]) -> list[tuple[int, str, str]]:
    """(index, source, new name) of every publishing call; an exchange names both of its paths."""
    out = []
    for i, (kind, a, b) in enumerate(events):
        if kind in ("publish", "link") and b is not None:
            out.append((i, a, b))
        elif kind == "exchange" and b is not None:
            out += [(i, a, b), (i, b, a)]
    return out


def violations(events: list[tuple[str, str, str | None]]) -> list[str]:
    """Every break of the rules in a trace (empty: the run is crash-safe in its ordering)."""
    out: list[str] = []
    for i, src, dst in _publishes(events):
        before = events[:i]
        # rule 1: data of every file written under src is fsynced after its last write-open
        last_write: dict[str, int] = {}
        for j, (k, p, _) in enumerate(before):
            if k == "write" and _inside(p, src):
                last_write[p] = j
            elif k == "remove":  # a file removed before the publish is not published
                last_write.pop(p, None)
        for p, j in last_write.items():
            if not any(k == "fsync" and q == p for k, q, _ in events[j + 1:i]):
                out.append(f"{p} written, not fsynced before it is published ({src} -> {dst})")
        # rule 2: every directory under src that gained an entry is fsynced after it
        if os.path.isdir(dst) or any(k == "create" and _inside(p, src) and p != src for k, p, _ in before):
            gained: dict[str, int] = {}
            for j, (k, p, _) in enumerate(before):
                if k == "create" and _inside(p, src) and p != src:
                    gained[os.path.dirname(p)] = j
            for d, j in gained.items():
                if not any(k == "fsync" and q == d for k, q, _ in events[j + 1:i]):
                    out.append(f"directory {d} gained entries, not fsynced before {src} is published")
        # rule 3: the directory holding the new name is fsynced after the publish; a rename (or
        # exchange) is durable before the next one, so a journal written after it never runs ahead
        parent = os.path.dirname(dst)
        later = [j for j, (k, _, _) in enumerate(events) if j > i and k in _NAMING]
        until = later[0] if events[i][0] in _NAMING and later else len(events)
        if not any(k == "fsync" and q == parent for k, q, _ in events[i + 1:until]):
            what = "never fsynced after" if until == len(events) else f"not fsynced before the next rename ({events[until][1]})"
            out.append(f"{dst} published, its directory {parent} {what}")
    return out


def _run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, dict, Trace]:
    trace = Trace()
    _install(monkeypatch, trace)
    capsys.readouterr()
    trace.active = True
    try:
        rc = main([*argv, "--json"])
    finally:
        trace.active = False
        monkeypatch.undo()
    return rc, json.loads(capsys.readouterr().out), trace


SCENARIOS: dict[str, Callable[[Path, Path], list[str]]] = {
    "migrate-in-place": lambda ck, out: ["migrate", str(ck)],
    "migrate-output": lambda ck, out: ["migrate", str(ck), "--output", str(out)],
    "manifest": lambda ck, out: ["manifest", str(ck)],
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_publish_order_is_crash_safe(name: str, fresh: Callable[..., Path], tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    ck = fresh("layout-1")
    out = tmp_path / "out"
    rc, report, trace = _run(monkeypatch, capsys, SCENARIOS[name](ck, out))
    assert rc == 0, report
    assert verified(out if name == "migrate-output" else ck)[1]
    publishes = [e for e in trace.events if e[0] == "publish"]
    assert publishes, "no publishing call was seen: the trace is not wired"
    assert any(e[0] == "fsync" for e in trace.events), "no fsync was seen: the trace is not wired"
    assert violations(trace.events) == []


def test_the_rules_catch_each_kind_of_slip() -> None:
    """The checker itself, on hand-written traces: each rule broken once, and a clean publish."""
    clean = [("create", "/d/new", None), ("create", "/d/new/f", None), ("write", "/d/new/f", None),
             ("fsync", "/d/new/f", None), ("fsync", "/d/new", None), ("publish", "/d/new", "/d/ck"),
             ("fsync", "/d", None)]
    assert violations(clean) == []
    no_data = [e for e in clean if e != ("fsync", "/d/new/f", None)]
    assert any("not fsynced before it is published" in v for v in violations(no_data))
    no_dir = [e for e in clean if e != ("fsync", "/d/new", None)]
    assert any("gained entries" in v for v in violations(no_dir))
    no_parent = clean[:-1]
    assert any("never fsynced after" in v for v in violations(no_parent))
    removed = [("create", "/d/new/g", None), ("write", "/d/new/g", None), ("remove", "/d/new/g", None)] + clean
    assert violations(removed) == []
    ahead = [("publish", "/d/new", "/d/ck"), ("create", "/w/j.tmp", None), ("write", "/w/j.tmp", None),
             ("fsync", "/w/j.tmp", None), ("publish", "/w/j.tmp", "/w/j"), ("fsync", "/w", None), ("fsync", "/d", None)]
    assert any("not fsynced before the next rename" in v for v in violations(ahead))
    late_data = [("create", "/d/t", None), ("write", "/d/t", None), ("publish", "/d/t", "/d/f"),
                 ("fsync", "/d/t", None), ("fsync", "/d", None)]
    assert any("/d/t written" in v for v in violations(late_data))
