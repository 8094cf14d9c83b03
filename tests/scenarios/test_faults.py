"""Fault injection beyond SIGKILL: every filesystem call migrate (and manifest) makes, failing in turn.

One filesystem-call layer wraps the ``os``, ``builtins.open``, ``fcntl`` and ``ctypes`` (renameat2)
functions for the duration of a run. A call belongs to a *call site* ``(function, file:line)`` when
it is made from ``clef_format/migrate/`` directly, or through ``shutil`` / ``tempfile`` / ``os.walk``
on behalf of a line there (``os.path`` predicates are left alone: they turn errors into answers).

A first run records every call site of a scenario and how often it is hit. Then, for each site,
each errno that call can really return, and its first and last call, the real migrate runs in
process with that one call failing. After each: no traceback, exit 0/1/2; a non-zero exit names
the cause (its strerror); the checkpoint verifies as the original (tables byte-identical) or as the
complete new layout; a rerun without the fault converges and leaves nothing behind. A new call site
in migrate/ is covered without editing this file; the suite prints how many it covered.
"""

from __future__ import annotations

import builtins
import ctypes
import errno as E
import fcntl
import json
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest

from clef_format.cli.main import main
from tests.support.migrate import backbone_digests, siblings, table_bytes, verified
from tests.support.libc_wrap import Libc

MIGRATE_DIR = str(Path(__file__).resolve().parents[2] / "clef_format" / "migrate") + os.sep
#: Library files whose OS calls are made on behalf of the migrate line that called them.
_THROUGH = {"shutil.py", "tempfile.py", "os.py"}

_OPEN = [E.ENOSPC, E.EIO, E.EACCES, E.EPERM, E.EROFS, E.ENOENT]
_RENAME = [E.EACCES, E.EPERM, E.EBUSY, E.EXDEV, E.EROFS, E.ENOENT, E.ENOSPC, E.EIO]
_REMOVE = [E.EACCES, E.EPERM, E.EBUSY, E.EROFS, E.EIO, E.ENOENT]
_STAT = [E.EACCES, E.EIO, E.ENOENT]
#: The filesystem calls of the layer, each with the errnos it can really return (man 2).
ERRNOS: dict[str, list[int]] = {
    "open": _OPEN, "builtins.open": _OPEN,
    "read": [E.EIO], "pread": [E.EIO], "preadv": [E.EIO],
    "write": [E.ENOSPC, E.EIO], "pwrite": [E.ENOSPC, E.EIO],
    "fsync": [E.EIO, E.ENOSPC, E.EROFS],
    "ftruncate": [E.EIO, E.EPERM, E.EROFS],
    "copy_file_range": [E.ENOSPC, E.EIO, E.EXDEV],
    "rename": _RENAME, "replace": _RENAME, "renameat2": _RENAME,
    "link": [E.EPERM, E.EXDEV, E.ENOSPC, E.EACCES, E.EROFS, E.EIO],
    "symlink": [E.ENOSPC, E.EACCES, E.EROFS, E.EIO],
    "unlink": _REMOVE, "remove": _REMOVE, "rmdir": _REMOVE + [E.ENOTEMPTY],
    "mkdir": [E.ENOSPC, E.EACCES, E.EPERM, E.EROFS, E.EIO],
    "chmod": [E.EPERM, E.EROFS, E.EIO], "fchmod": [E.EPERM, E.EROFS, E.EIO],
    "utime": [E.EPERM, E.EROFS, E.EACCES],
    "statvfs": [E.EIO, E.EACCES],
    "listdir": [E.EACCES, E.EIO, E.ENOENT], "scandir": [E.EACCES, E.EIO, E.ENOENT],
    "stat": _STAT, "lstat": _STAT, "fstat": [E.EIO],
    "flock": [E.ENOLCK],
    "ioctl": [E.EXDEV, E.EOPNOTSUPP, E.EIO, E.ENOSPC],
}
_OS_NAMES = [n for n in ERRNOS if n not in ("builtins.open", "flock", "ioctl", "renameat2") and hasattr(os, n)]


@dataclass
class Fault:
    site: tuple[str, str]
    nth: int
    errno: int
    fired: bool = False


@dataclass
class Layer:
    """The filesystem-call layer: records call sites, or fails the n-th call of one."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    fault: Fault | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @staticmethod
    def site_of(name: str) -> tuple[str, str] | None:
        f = sys._getframe(2)
        direct = f.f_code.co_filename
        if direct.startswith(MIGRATE_DIR):
            return name, f"{os.path.relpath(direct, MIGRATE_DIR)}:{f.f_lineno}"
        if os.path.basename(direct) not in _THROUGH:
            return None
        for _ in range(12):
            f = f.f_back
            if f is None:
                return None
            fn = f.f_code.co_filename
            if fn.startswith(MIGRATE_DIR):
                return f"{name} via {os.path.basename(direct)}", f"{os.path.relpath(fn, MIGRATE_DIR)}:{f.f_lineno}"
        return None

    def check(self, name: str, site: tuple[str, str] | None) -> int | None:
        if site is None:
            return None
        with self.lock:
            n = self.counts[site] = self.counts.get(site, 0) + 1
            f = self.fault
            if f is not None and not f.fired and f.site == site and f.nth == n:
                f.fired = True
                return f.errno
        return None


ACTIVE: list[Layer] = []


def _wrap(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kw: Any) -> Any:
        if ACTIVE:
            err = ACTIVE[0].check(name, Layer.site_of(name))
            if err is not None:
                path = args[0] if args and isinstance(args[0], (str, bytes, os.PathLike)) else None
                raise OSError(err, os.strerror(err), path)
        return real(*args, **kw)

    call.__wrapped__ = real  # type: ignore[attr-defined]
    return call


def _failing_renameat2(real: Callable[..., int]) -> Callable[..., int]:
    def renameat2(*args: Any) -> int:
        if ACTIVE:
            err = ACTIVE[0].check("renameat2", Layer.site_of("renameat2"))
            if err is not None:
                ctypes.set_errno(err)
                return -1
        return real(*args)

    return renameat2


@pytest.fixture(scope="module")
def layer() -> Any:
    saved: list[tuple[Any, str, Any]] = []

    def patch(mod: Any, attr: str, new: Any) -> None:
        saved.append((mod, attr, getattr(mod, attr)))
        setattr(mod, attr, new)

    for name in _OS_NAMES:
        patch(os, name, _wrap(name, getattr(os, name)))
    patch(builtins, "open", _wrap("builtins.open", builtins.open))
    patch(fcntl, "flock", _wrap("flock", fcntl.flock))
    patch(fcntl, "ioctl", _wrap("ioctl", fcntl.ioctl))
    real_cdll = ctypes.CDLL
    patch(ctypes, "CDLL", lambda *a, **k: Libc(real_cdll(*a, **k), _failing_renameat2))
    try:
        yield Layer
    finally:
        for mod, attr, old in reversed(saved):
            setattr(mod, attr, old)


def _run(capsys: pytest.CaptureFixture[str], argv: list[str], layer: Layer | None) -> tuple[int, dict, str]:
    capsys.readouterr()
    if layer is not None:
        ACTIVE.append(layer)
    try:
        rc = main([*argv, "--json"])
    except SystemExit as exc:
        rc = int(exc.code or 0)
    finally:
        ACTIVE.clear()
    out, err = capsys.readouterr()
    return rc, json.loads(out), out + err


@dataclass
class Scenario:
    name: str
    argv: Callable[[Path, Path], list[str]]
    out_of_place: bool = False
    manifest: bool = False


SCENARIOS = [
    Scenario("in-place", lambda ck, out: ["migrate", str(ck)]),
    Scenario("output", lambda ck, out: ["migrate", str(ck), "--output", str(out)], out_of_place=True),
    Scenario("manifest", lambda ck, out: ["manifest", str(ck)], manifest=True),
]
TOTAL: dict[str, tuple[int, int, float]] = {}


def _faults(counts: dict[tuple[str, str], int]) -> list[Fault]:
    out = []
    for site, n in sorted(counts.items()):
        base = site[0].split(" via ")[0]
        errnos = ERRNOS.get(base, [E.EIO])
        out.extend(Fault(site, 1, err) for err in errnos)  # the first call, with every errno
        if n > 1:
            out.append(Fault(site, n, errnos[0]))  # the last call (a later state), with the first errno

    return out


def _check_state(sc: Scenario, ck: Path, out: Path, digests: dict, tables: dict) -> None:
    layout, ok, errors = verified(ck)
    assert ok, errors
    if sc.out_of_place or sc.manifest:
        assert layout == "layout-1" and table_bytes(ck) == tables  # the source is never touched
    else:
        assert layout in ("layout-1", "layout-2")
        if layout == "layout-1":
            assert table_bytes(ck) == tables
    assert backbone_digests(ck) == digests


@pytest.mark.parametrize("sc", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_every_call_site_failing(sc: Scenario, layer: Any, built, tmp_path: Path, capsys) -> None:
    src = built("layout-1")
    digests, tables = backbone_digests(src), table_bytes(src)

    def fresh(i: int) -> tuple[Path, Path]:
        base = tmp_path / str(i)
        base.mkdir()
        shutil.copytree(src, base / "ck", symlinks=True)
        return base / "ck", base / "out"

    started = time.perf_counter()
    ck, out = fresh(0)
    rec = Layer()
    rc, report, text = _run(capsys, sc.argv(ck, out), rec)
    assert rc == 0, report
    assert rec.counts, "no filesystem call was seen: the layer is not wired"
    faults = _faults(rec.counts)
    problems: list[str] = []
    for i, fault in enumerate(faults, 1):
        ck, out = fresh(i)
        what = f"{fault.site[0]} at {fault.site[1]} (call {fault.nth}) -> {E.errorcode[fault.errno]}"
        try:
            rc, report, text = _run(capsys, sc.argv(ck, out), Layer(fault=fault))
            assert "Traceback" not in text, text
            assert rc in (0, 1, 2), rc
            if rc != 0 and fault.fired:
                assert os.strerror(fault.errno) in text or E.errorcode[fault.errno] in text, \
                    f"the message does not name the cause: {report['findings']}"
            _check_state(sc, ck, out, digests, tables)
            result = out if sc.out_of_place else ck
            left = [p for p in siblings(result) if not p.endswith(".lock")]  # a lock file is never stale (flock)
            if rc != 0 and left:  # the journal tells the truth: work left behind is announced, with what to run
                assert "rerun" in text or "--abort" in text, f"{left} left, but the report says: {report['findings']}"
            done = sc.out_of_place and rc == 0 and verified(out)[:2] == ("layout-2", True)
            if done:  # a complete --output: a rerun would (rightly) refuse a non-empty --output
                # at most the lock file, when removing it failed: never stale (flock), the next run takes it
                assert set(siblings(out)) <= {f".{out.name}.clef-migrate.lock"}, siblings(out)
                continue
            rc2, again, text2 = _run(capsys, sc.argv(ck, out), None)
            assert "Traceback" not in text2
            if sc.manifest:
                assert rc2 == 0, again
            else:
                assert rc2 == 0 and again["layout"] == "layout-2" and again["ok"], again
                assert verified(result)[:2] == ("layout-2", True)
                assert siblings(result) == [] and siblings(ck) == []
            _check_state(sc, ck, out, digests, tables) if sc.out_of_place or sc.manifest else None
        except Exception as exc:  # noqa: BLE001 - collected, reported together below
            problems.append(f"{what}: {type(exc).__name__}: {str(exc)[:600]}")
        finally:
            shutil.rmtree(ck.parent, ignore_errors=True)
    seconds = time.perf_counter() - started
    TOTAL[sc.name] = (len(rec.counts), len(faults), seconds)
    print(f"\nfault injection [{sc.name}]: {len(rec.counts)} call sites, {len(faults)} faults "
          f"(each site's first call x its errnos, plus its last call) in {seconds:.1f}s")
    for site, n in sorted(rec.counts.items()):
        print(f"  {site[0]:<24} {site[1]:<18} x{n}")
    assert not problems, f"{len(problems)} of {len(faults)} faults broke a guarantee:\n" + "\n".join(problems[:40])
