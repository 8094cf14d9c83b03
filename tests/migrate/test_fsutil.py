"""fsutil on real files and folders: the atomic exchange, directory fsync, modes of new files, carrying
files out of place without ever sharing an inode with the source."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from clef_format.migrate import fsutil


def test_exchange_swaps_two_folders_in_one_step(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "from-a").write_text("a")
    (b / "from-b").write_text("b")
    fsutil.exchange(str(a), str(b))
    assert sorted(os.listdir(a)) == ["from-b"] and sorted(os.listdir(b)) == ["from-a"]


def test_exchange_with_a_missing_side_raises_the_cause(tmp_path: Path) -> None:
    a = tmp_path / "a"
    a.mkdir()
    missing = tmp_path / "missing"
    with pytest.raises(OSError) as err:
        fsutil.exchange(str(missing), str(a))
    assert err.value.errno == errno.ENOENT
    assert err.value.strerror == os.strerror(errno.ENOENT) and err.value.filename == str(missing)
    assert a.is_dir()


def test_fsync_dir_refuses_a_file(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    fsutil.fsync_dir(str(tmp_path))
    with pytest.raises(NotADirectoryError):
        fsutil.fsync_dir(str(f))


def test_a_new_file_without_predecessor_takes_what_the_umask_gives(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        assert fsutil.mode_for(str(tmp_path / "absent")) == 0o644
    finally:
        os.umask(old)
    f = tmp_path / "f"
    f.write_text("x")
    f.chmod(0o640)
    assert fsutil.mode_for(str(f)) == 0o640


def test_out_of_place_a_symlinked_file_is_copied_never_hard_linked(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "weights").mkdir(parents=True)
    (src / "weights" / "real.bin").write_bytes(b"\x01" * 1000)
    (src / "alias.bin").symlink_to("weights/real.bin")
    how = fsutil.replicate(str(src), str(dst), set(), in_place=False, allowed_real=[str(src)], snapshot=False)
    assert how["alias.bin"] in ("reflink", "copy") and how["weights/real.bin"] in ("reflink", "copy")
    out = dst / "alias.bin"
    assert not out.is_symlink() and out.read_bytes() == b"\x01" * 1000
    assert out.stat().st_ino != (src / "weights" / "real.bin").stat().st_ino
    assert stat.S_ISREG(out.lstat().st_mode) and out.stat().st_nlink == 1
