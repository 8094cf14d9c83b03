"""fileio and writer on real files: byte ranges copied exactly where they belong (with and without
copy_file_range), short writes continued at the right offset, and the files a migration writes (index,
tables metadata, modes)."""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import stat
from pathlib import Path

import pytest

from clef_format.migrate import fileio
from clef_format.read.safetensors import read_header
from clef_format.spec import layouts as L
from tests.support.migrate import run_json


@pytest.mark.parametrize("kernel_copy", [True, False])
def test_copy_range_copies_exactly_its_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel_copy: bool) -> None:
    monkeypatch.setattr(fileio, "FALLBACK_BUFFER", 4096)
    monkeypatch.setattr(fileio, "COPY_CHUNK", 4096)
    if not kernel_copy:
        monkeypatch.delattr(os, "copy_file_range", raising=False)  # a platform without it
    data = bytes(range(256)) * 80  # 20480 bytes
    (tmp_path / "src").write_bytes(data)
    (tmp_path / "dst").write_bytes(b"\xee" * 20000)
    ticks: list[int] = []
    with open(tmp_path / "src", "rb") as s, open(tmp_path / "dst", "r+b") as d:
        fileio.copy_range(s.fileno(), d.fileno(), 100, 10000, ticks.append, dst_offset=50)
    out = (tmp_path / "dst").read_bytes()
    assert len(out) == 20000 and out[50:10050] == data[100:10100]
    assert out[:50] == b"\xee" * 50 and out[10050:] == b"\xee" * 9950
    assert sum(ticks) == 10000


def test_write_all_at_continues_a_short_write_right_after_it(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    data = bytes(range(256)) * 32  # 8192 bytes
    with open(tmp_path / "f", "wb") as fh:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))  # the first write stops at 4096
        try:
            with pytest.raises(OSError) as err:
                fileio.write_all_at(fh.fileno(), data, 1000)
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            signal.signal(signal.SIGXFSZ, old)
    assert err.value.errno == errno.EFBIG
    assert (tmp_path / "f").read_bytes()[1000:] == data[:3096]


def test_a_migration_writes_an_indented_index_and_sorted_quality(fresh, capsys) -> None:
    root = fresh("layout-1", shards=3)
    rc, out = run_json(capsys, str(root))
    assert rc == 0 and out["layout"] == "layout-2", out
    text = (root / L.BACKBONE_INDEX).read_text()
    assert text == json.dumps(json.loads(text), indent=2) + "\n"
    quality = read_header(root / L.TABLES).metadata["quality"]
    assert quality == json.dumps(json.loads(quality), sort_keys=True)  # the same bytes whichever table ends first


def test_replaced_files_keep_their_mode_and_new_ones_take_the_umask(fresh, capsys) -> None:
    root = fresh("layout-1")
    for p in root.rglob("*"):
        if p.is_file():
            p.chmod(0o640)
    old = os.umask(0o022)
    try:
        rc, out = run_json(capsys, str(root))
    finally:
        os.umask(old)
    assert rc == 0, out
    modes = {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in root.rglob("*") if p.is_file()}
    assert modes.pop(L.TABLES) == 0o644  # new: 0o666 less the umask
    assert modes and set(modes.values()) == {0o640}, modes
