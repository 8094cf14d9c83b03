"""Deep and long trees: migrate's walks end in a finding, its deletions reach every depth, never a traceback.

A folder nested 1,100 deep (past ``sys.getrecursionlimit()``) raised ``RecursionError`` from migrate's
mount search, survey, tree state and ``shutil.rmtree``; now every walk is iterative with the reader's
``MAX_DEPTH`` (64) and a deeper tree is ``migrate-refused``, the dry run included. A tree whose absolute
path passes PATH_MAX is built (and inspected) through folder handles (``openat``); the reader cannot
list it (``unreadable``, exit 2), and migrate says the same without writing anything. What migrate
deletes (``workspace.remove_tree``) it deletes folder by folder through handles: any depth, any length,
never below a mount point.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from clef_format.migrate import crash
from clef_format.migrate.workspace import Target, remove_tree
from tests.support.migrate import run_json, siblings, verified

DEEP = 1100
LONG_NAME = "n" * 200
LONG_LEVELS = 25  # 25 * 201 bytes: past PATH_MAX (4096), well inside MAX_DEPTH (64)


def nest(top: Path, levels: int, name: str, leaf: bytes = b"leaf\n") -> None:
    """``top/name/name/.../leaf.txt``, ``levels`` deep, made by handles (no path longer than one name)."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(levels):
            os.mkdir(name, dir_fd=fd)
            new = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = new
        out = os.open("leaf.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(out, leaf)
        os.close(out)
    finally:
        os.close(fd)


def leaf_of(top: Path, levels: int, name: str) -> bytes | None:
    """The leaf of ``nest``, read through handles; None when the chain is broken."""
    try:
        fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        for _ in range(levels):
            new = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = new
        leaf = os.open("leaf.txt", os.O_RDONLY, dir_fd=fd)
        data = os.read(leaf, 100)
        os.close(leaf)
        return data
    except OSError:
        return None
    finally:
        os.close(fd)


def remove(path: Path) -> None:
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=True)


@pytest.fixture(autouse=True)
def _no_deep_tree_left(tmp_path: Path):
    """Whatever happens, no deep tree stays behind: pytest's own cleanup of old temp folders
    (``shutil.rmtree``) would raise RecursionError on it in a later session."""
    yield
    with open("/proc/self/mountinfo") as fh:
        points = [line.split(" ")[4] for line in fh]
    for p in sorted((p for p in points if p.startswith(str(tmp_path))), key=len, reverse=True):
        subprocess.run(["umount", "-l", p], capture_output=True)
    for entry in tmp_path.iterdir():
        remove(entry)


def test_the_deep_tree_is_deeper_than_the_recursion_limit() -> None:
    assert DEEP > sys.getrecursionlimit() and LONG_LEVELS * (len(LONG_NAME) + 1) > os.pathconf("/", "PC_PATH_MAX")


@pytest.mark.parametrize("mode", ["dry-run", "in-place", "output"])
def test_a_folder_nested_past_the_recursion_limit_is_refused(fresh, capsys, tmp_path: Path, mode: str) -> None:
    root = fresh("layout-1")
    nest(root, DEEP, "d")
    try:
        extra = {"dry-run": ["--dry-run"], "in-place": [], "output": ["--output", str(tmp_path / "out")]}[mode]
        rc, out = run_json(capsys, str(root), "--to", "layout-2", *extra)
        errors = [f for f in out["findings"] if f["severity"] == "error"]
        assert rc == 1 and [f["code"] for f in errors] == ["migrate-refused"], out
        assert "d/... nests more than 64 folders deep" in errors[0]["message"], errors
        assert "remove the deeply nested folders" in errors[0]["fix"]
        assert leaf_of(root, DEEP, "d") == b"leaf\n" and siblings(root) == [] and not (tmp_path / "out").exists()
    finally:
        remove(root / "d")
    assert verified(root)[:2] == ("layout-1", True)  # the rest untouched


@pytest.mark.parametrize("mode", ["dry-run", "in-place", "output"])
def test_a_path_past_path_max_ends_in_a_finding_with_nothing_written(fresh, capsys, tmp_path: Path, mode: str) -> None:
    root = fresh("layout-1")
    nest(root, LONG_LEVELS, LONG_NAME)
    extra = {"dry-run": ["--dry-run"], "in-place": [], "output": ["--output", str(tmp_path / "out")]}[mode]
    rc, out = run_json(capsys, str(root), "--to", "layout-2", *extra)
    assert rc == 2 and [f["code"] for f in out["findings"]] == ["unreadable"], out
    assert "File name too long" in out["findings"][0]["message"]
    assert leaf_of(root, LONG_LEVELS, LONG_NAME) == b"leaf\n" and siblings(root) == []
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("levels,name", [(DEEP, "d"), (LONG_LEVELS, LONG_NAME), (200, "m" * 120)],
                         ids=["past-recursion-limit", "past-path-max", "both-long-and-deep"])
def test_remove_tree_deletes_any_depth_and_length_through_handles(tmp_path: Path, levels: int, name: str) -> None:
    tree = tmp_path / "made-by-migrate"
    tree.mkdir()
    nest(tree, levels, name)
    (tree / "link-out").symlink_to(tmp_path / "outside")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "theirs.txt").write_text("not migrate's")
    remove_tree(str(tree))
    assert not os.path.lexists(tree)
    assert (tmp_path / "outside" / "theirs.txt").read_text() == "not migrate's"  # a link is never followed


def test_remove_tree_refuses_a_mount_below_a_deep_tree_before_deleting_anything(tmp_path: Path) -> None:
    tree = tmp_path / "made-by-migrate"
    tree.mkdir()
    (tree / "first.txt").write_text("migrate's")
    nest(tree, DEEP, "d")
    fd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)  # the mount point: 1,100 levels down, reached by handle
    try:
        for _ in range(DEEP):
            new = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = new
        os.mkdir("mnt", dir_fd=fd)
        point = f"/proc/self/fd/{fd}/mnt"
        proc = subprocess.run(["mount", "-t", "tmpfs", "none", point], capture_output=True, text=True,
                              pass_fds=(fd,))
        if proc.returncode != 0:
            pytest.skip(f"mount is not permitted here: {proc.stderr.strip()}")
        mounted = os.open("mnt", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        theirs = os.open("theirs.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=mounted)
        os.write(theirs, b"on another filesystem\n")
        os.close(theirs)
        try:
            with pytest.raises(OSError, match="is a mount point: nothing below it is deleted"):
                remove_tree(str(tree))
            assert os.stat("theirs.txt", dir_fd=mounted).st_size == 22
            assert (tree / "first.txt").read_text() == "migrate's"  # refused before anything was deleted
        finally:
            os.close(mounted)
            subprocess.run(["umount", "-l", point], capture_output=True, pass_fds=(fd,))
    finally:
        os.close(fd)
    remove_tree(str(tree))
    assert not tree.exists()


def test_an_old_tree_deepened_after_the_swap_is_still_cleaned_up(fresh, capsys) -> None:
    """A process holding a folder of the old tree writes into it after the exchange: the cleanup deletes
    the old tree whatever it holds by then (shutil.rmtree raised RecursionError, a traceback)."""
    root = fresh("layout-1")
    (root / "data").mkdir()
    held = os.open(root / "data", os.O_RDONLY | os.O_DIRECTORY)
    target = Target(str(root), str(root), True)

    def act(phase: str, n: int) -> None:
        if (phase, n) == ("cleanup", 1):
            assert os.path.isdir(os.path.join(target.ws, "new", "data"))  # the old tree, swapped out
            nest(Path(f"/proc/self/fd/{held}"), DEEP, "d")

    try:
        with crash.adversary(act):
            rc, out = run_json(capsys, str(root), "--to", "layout-2")
    finally:
        os.close(held)
    assert rc == 0 and verified(root)[:2] == ("layout-2", True), out
    assert siblings(root) == [] and (root / "data").is_dir() and os.listdir(root / "data") == []
