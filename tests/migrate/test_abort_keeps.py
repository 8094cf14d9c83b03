"""``--abort`` after the swap never deletes what was done to the new tree since.

A run killed after its swap leaves the new tree at PATH (in place, or its ``--output``) and the original
parked in the workspace. The user goes on with the new tree: adds a file, edits config.json. ``--abort``
then swapped the original back and deleted the workspace, which held the new tree with those edits. Now
the abort proves the tree at PATH is the one the run swapped in (its journal records it), and refuses
when it is not, with a fix that works when followed; a tree moved away from PATH is left where it is and
the original comes back. Each case is a real run SIGKILLed at its crash point (``CLEF_FORMAT_CRASH_AT``).
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Callable

import pytest

from clef_format.migrate.crash import CRASH_ENV
from tests.support.migrate import cli, file_digests, run_json, siblings, verified

#: after the exchange, the journal still "staged"; then "swapped", the original still parked (cleanup not begun)
STAGED, SWAPPED = "swap:2", "cleanup:1"
REVISION = "0001_int8_tables upgrade"


def _add_file(path: Path) -> None:
    (path / "notes.txt").write_bytes(b"what I found serving it\n")


def _edit_same_size(path: Path) -> None:
    """config.json rewritten in place, same size and inode (a hard link shared with the original in place)."""
    data = (path / "config.json").read_bytes()
    with open(path / "config.json", "r+b") as fh:
        fh.write(data[:1] + b" " + data[2:] if data[1:2] != b" " else data[:1] + b"\n" + data[2:])


def _remove_file(path: Path) -> None:
    (path / "tokenizer.json").unlink()


def _add_folder(path: Path) -> None:
    (path / "runs" / "eval").mkdir(parents=True)
    (path / "runs" / "eval" / "result.json").write_bytes(b'{"accuracy": 0.91}\n')


CHANGES: dict[str, Callable[[Path], None]] = {"file-added": _add_file, "file-edited": _edit_same_size,
                                              "file-removed": _remove_file, "folder-added": _add_folder}
SAID = {"file-added": "notes.txt was created", "file-edited": "config.json was written",
        "file-removed": "tokenizer.json was removed", "folder-added": "runs was created"}


def _killed_at(point: str, *argv: str) -> None:
    """``clef-format migrate ARGV`` run for real and SIGKILLed at its crash point ``point``."""
    proc = cli("migrate", *argv, "--json", env={CRASH_ENV: point})
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)


def _interrupted(fresh, tmp_path: Path, mode: str, point: str) -> tuple[Path, Path, dict[str, str]]:
    """A real run, in place or into a new ``--output``, SIGKILLed at ``point``: (source, PATH, the
    source's digests before)."""
    src = fresh("layout-1")
    original = file_digests(src)
    path = src if mode == "in-place" else tmp_path / "out"
    args = [str(src)] + (["--output", str(path)] if mode == "output" else [])
    _killed_at(point, *args)
    assert verified(path)[:2] == ("layout-2", True)  # the new tree is at PATH, and the user goes on with it
    return src, path, original


def _follow(capsys, command: str) -> tuple[int, dict]:
    """Run a ``clef-format migrate ...`` command a message printed, as the user types it."""
    words = command.split()
    assert words[:2] == ["clef-format", "migrate"], command
    return run_json(capsys, *words[2:])


CASES = [("file-edited", mode, point) for mode in ("in-place", "output") for point in (STAGED, SWAPPED)] + [
    ("file-added", "in-place", STAGED), ("file-added", "output", SWAPPED),
    ("file-removed", "in-place", SWAPPED), ("file-removed", "output", STAGED),
    ("folder-added", "in-place", STAGED), ("folder-added", "output", SWAPPED)]


@pytest.mark.parametrize("kind,mode,point", CASES, ids=["-".join(c) for c in CASES])
def test_an_abort_that_would_delete_changes_is_refused_and_moving_the_tree_away_keeps_both(
        fresh, capsys, tmp_path: Path, kind: str, mode: str, point: str) -> None:
    """The tree at PATH changed since the swap: ``--abort`` is refused (``--dry-run`` and ``--current`` say it
    would be, in the same words), PATH keeps every byte, and the first fix (move PATH away, abort again)
    keeps the changed tree where it was moved and puts the original back (in place) or only removes the
    workspace (--output: the source was never changed)."""
    src, path, original = _interrupted(fresh, tmp_path, mode, point)
    CHANGES[kind](path)
    edited = file_digests(path)

    rc, current = run_json(capsys, str(path), "--current")
    assert rc == 0 and f"clef-format migrate {path} --abort would be refused: " in current["message"], current
    rc, dry = run_json(capsys, str(path), "--abort", "--dry-run")
    assert rc == 1 and dry["message"].startswith("--abort would be refused: "), dry
    rc, out = run_json(capsys, str(path), "--abort")
    assert rc == 1, out
    [refused] = [f for f in out["findings"] if f["severity"] == "error"]
    assert refused["code"] == "migrate-refused" and SAID[kind] in refused["message"], refused
    assert dry["message"] == f"--abort would be refused: {refused['message'].removesuffix('; nothing was changed')}"
    assert f"(fix: {refused['fix']})" in current["message"]
    assert [f["fix"] for f in dry["findings"] if f["severity"] == "error"] == [refused["fix"]]
    assert file_digests(path) == edited and siblings(path), "the refused abort changed something"

    moved = re.search(r"\(mv (\S+) (\S+)\)", refused["fix"])
    abort = re.search(r"then (clef-format migrate \S+ --abort)", refused["fix"])
    assert moved and abort and moved.group(1) == str(path), refused["fix"]
    os.rename(moved.group(1), moved.group(2))
    rc, done = _follow(capsys, abort.group(1))
    assert rc == 0 and done["recovered"], done
    assert file_digests(Path(moved.group(2))) == edited  # the user's tree, every byte, where they put it
    assert siblings(path) == []
    if mode == "in-place":  # the original is back (an in-place edit of a file it shares with the new tree is in both)
        shared = {"config.json"} if kind == "file-edited" else set()
        assert {k: v for k, v in file_digests(path).items() if k not in shared} == \
            {k: v for k, v in original.items() if k not in shared}
        assert verified(path)[:2] == ("layout-1", True)
    else:
        assert not path.exists() and file_digests(src) == original


@pytest.mark.parametrize("mode", ["in-place", "output"])
def test_finishing_the_migration_instead_keeps_the_changed_tree(fresh, capsys, tmp_path: Path, mode: str) -> None:
    """The refusal's other fix: finish the migration. PATH keeps the user's changes, nothing is left beside it."""
    src, path, original = _interrupted(fresh, tmp_path, mode, SWAPPED)
    _add_folder(path)
    _edit_same_size(path)
    edited = file_digests(path)
    rc, out = run_json(capsys, str(path), "--abort")
    [refused] = [f for f in out["findings"] if f["severity"] == "error"]
    assert rc == 1 and refused["code"] == "migrate-refused", out
    finish = refused["fix"].split("or finish the migration instead: ")[1]
    rc, done = _follow(capsys, finish)
    assert rc == 0 and done["recovered"], done
    assert file_digests(path) == edited and siblings(path) == [] and verified(path)[:2] == ("layout-2", True)
    if mode == "output":
        assert file_digests(src) == original


@pytest.mark.parametrize("mode,point", [(m, p) for m in ("in-place", "output") for p in (STAGED, SWAPPED)])
def test_an_abort_after_the_new_tree_was_moved_away_puts_the_original_back(fresh, capsys, tmp_path: Path,
                                                                             mode: str, point: str) -> None:
    """PATH absent: the user moved the new tree elsewhere. Nothing at PATH can be lost: the abort puts the
    original back (in place) or removes only the workspace (--output), and the moved tree is untouched.
    (The journal said staged: the abort took the original parked in the workspace for litter.)"""
    src, path, original = _interrupted(fresh, tmp_path, mode, point)
    mine = path.with_name(path.name + ".mine")
    path.rename(mine)
    new = file_digests(mine)
    rc, dry = run_json(capsys, str(path), "--abort", "--dry-run")
    assert rc == 0, dry
    rc, out = run_json(capsys, str(path), "--abort")
    assert rc == 0 and out["recovered"], out
    assert dry["message"] == f"--abort would do this: {out['message']}"
    assert file_digests(mine) == new and siblings(path) == []
    if mode == "in-place":
        assert file_digests(src) == original and out["layout"] == "layout-1"
    else:
        assert not path.exists() and file_digests(src) == original


@pytest.mark.parametrize("mode,point", [(m, p) for m in ("in-place", "output") for p in (STAGED, SWAPPED)])
def test_an_abort_of_an_unchanged_new_tree_restores_the_original_exactly(fresh, capsys, tmp_path: Path,
                                                                        mode: str, point: str) -> None:
    """Nothing changed since the swap (the tree was only read, as serving it does): the abort rolls back
    as before, byte for byte, and ``--dry-run`` said so in the same words."""
    src, path, original = _interrupted(fresh, tmp_path, mode, point)
    file_digests(path)  # read every file, as a user of the new tree does
    rc, current = run_json(capsys, str(path), "--current")
    assert rc == 0, current
    rc, dry = run_json(capsys, str(path), "--abort", "--dry-run")
    assert rc == 0, dry
    rc, out = run_json(capsys, str(path), "--abort")
    assert rc == 0 and out["message"].startswith(f"rolled back the interrupted migration {REVISION}: "), out
    assert dry["message"] == f"--abort would do this: {out['message']}"
    if mode == "in-place":  # an --output run's says "rolls it back", and the command that resumes it
        assert f"--abort would do this: {out['message']}" in current["message"], current
    assert file_digests(src) == original and siblings(path) == []
    if mode == "output":
        assert not path.exists()


def test_a_run_to_another_layout_that_would_roll_back_a_changed_tree_is_refused(fresh, capsys, tmp_path: Path) -> None:
    """``--to layout-1`` after an interrupted upgrade undoes the step as ``--abort`` does: the same proof,
    the same refusal (the dry run says so too), and following the fix to finish first, it then goes back
    from the new tree with the user's file in it."""
    src, path, _ = _interrupted(fresh, tmp_path, "in-place", SWAPPED)
    _add_file(path)
    edited = file_digests(path)
    rc, dry = run_json(capsys, str(path), "--to", "layout-1", "--dry-run")
    assert rc == 1 and [f["code"] for f in dry["findings"] if f["severity"] == "error"] == ["migrate-refused"], dry
    rc, out = run_json(capsys, str(path), "--to", "layout-1")
    [refused] = [f for f in out["findings"] if f["severity"] == "error"]
    assert rc == 1 and "notes.txt was created" in refused["message"], out
    assert "this run goes to another layout" in refused["message"] and file_digests(path) == edited
    rc, done = _follow(capsys, refused["fix"].split("or finish the migration instead: ")[1])
    assert rc == 0 and file_digests(path) == edited and siblings(path) == []
    rc, back = run_json(capsys, str(path), "--to", "layout-1")
    assert rc == 0 and back["layout"] == "layout-1" and (path / "notes.txt").read_bytes() == b"what I found serving it\n"


# -- an --output someone made or filled after the run was killed, before the swap --------------------------

@pytest.mark.parametrize("point", ["stage:1", "swap:1"])
@pytest.mark.parametrize("what", ["their-checkpoint", "a-notes-file"])
def test_resuming_an_output_run_never_takes_or_deletes_what_is_at_the_output_now(fresh, tmp_path: Path,
                                                                                  point: str, what: str) -> None:
    """Killed while staging (``stage:1``) or staged but not swapped (``swap:1``): the --output was not made
    yet. The user then makes it: their own checkpoint, or a folder with a file. Running the same migrate
    again took the checkpoint for the run's own result and quantized it in place (staging), or swapped the
    staged tree in and deleted the folder with the workspace (staged). Now it is refused as any filled
    --output is, and every byte there is kept; the source is only read."""
    from clef_format.fixtures.builders import build_checkpoint

    src = fresh("layout-1")
    source = file_digests(src)
    out = tmp_path / "out"
    _killed_at(point, str(src), "--output", str(out))
    assert not out.exists()
    if what == "their-checkpoint":
        build_checkpoint(out, "layout-1", "fp8", num_layers=2)
    else:
        out.mkdir()
        (out / "notes.txt").write_bytes(b"precious\n")
    theirs = file_digests(out)
    proc = cli("migrate", str(src), "--to", "layout-2", "--output", str(out), "--json")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "exists and is not an empty directory" in proc.stdout, proc.stdout
    assert file_digests(out) == theirs and file_digests(src) == source
    if point == "stage:1":  # the staged work waits beside the --output: the printed fix removes it
        assert "staged work waits in its workspace" in proc.stdout, proc.stdout
    else:  # rolled back on the way to the refusal, which says so
        assert "rolled back the interrupted migration" in proc.stdout, proc.stdout


@pytest.mark.parametrize("point", ["stage:1", "swap:1"])
def test_dry_run_foretells_the_refusal_of_a_filled_output_and_the_fix_removes_only_the_staged_work(
        fresh, capsys, tmp_path: Path, point: str) -> None:
    """``--dry-run`` planned the step as if the run would go ahead (``ok: true``), though the run then
    stopped at the filled --output. Now it says the refusal, with the same code, exit status and fix, and
    writes nothing; following its fix (``--abort --output OUT`` for the staging that waits) removes the
    interrupted run's workspace and keeps the --output and the source."""
    src = fresh("layout-1")
    source = file_digests(src)
    out = tmp_path / "out"
    _killed_at(point, str(src), "--output", str(out))
    out.mkdir()
    (out / "notes.txt").write_bytes(b"precious\n")
    left = siblings(out)
    rc, dry = run_json(capsys, str(src), "--to", "layout-2", "--output", str(out), "--dry-run")
    assert rc == 2 and dry["ok"] is False and dry["steps"] == [], dry
    [finding] = dry["findings"]
    assert finding["code"] == "usage-error", finding
    assert finding["message"].startswith(f"this run would be refused: --output {out} exists and is not an empty "
                                         "directory"), finding
    assert siblings(out) == left and file_digests(out) == {"notes.txt": file_digests(out)["notes.txt"]}
    rc, real = run_json(capsys, str(src), "--to", "layout-2", "--output", str(out))
    assert rc == 2 and real["findings"][0]["code"] == "usage-error"
    assert real["findings"][0]["fix"] == finding["fix"], (real, finding)
    assert finding["message"].removeprefix("this run would be refused: ").split(";")[0] == \
        real["findings"][0]["message"].split(";")[0]
    if point == "stage:1":
        assert siblings(out), "the staging waits in its workspace"
        fix = finding["fix"].split("; ", 1)[1].removesuffix(" removes the staged work (the --output is kept)")
        rc, done = _follow(capsys, fix)
        assert rc == 0, done
    assert siblings(out) == [] and (out / "notes.txt").read_bytes() == b"precious\n"
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"] and file_digests(src) == source


def test_dry_run_in_text_says_the_recovery_the_run_would_do_first(fresh, capsys) -> None:
    """The JSON of ``--dry-run`` carried the recovery a run would do first (``recovery``); its text said
    nothing of it, and planned the step as if from scratch. Now the text says it, word for word what the
    run then reports having done."""
    from clef_format.cli.main import main

    src = fresh("layout-1")
    _killed_at("swap:1", str(src))
    capsys.readouterr()
    assert main(["migrate", str(src), "--dry-run"]) == 0
    text = capsys.readouterr().out
    rc, out = run_json(capsys, str(src))
    assert rc == 0 and out["recovered"], out
    assert f"  recovery not done yet; the run would do this first: {out['recovered'][0]}\n" in text, text


# -- an interrupted run the user cannot reach from where they are ------------------------------------------

def _unprivileged(*argv: str) -> tuple[int, dict]:
    """``clef-format migrate ARGV --json`` with the permission checks of an ordinary user (root drops
    CAP_DAC_OVERRIDE with setpriv)."""
    import json
    import shutil
    import subprocess
    import sys

    from tests.support.migrate import ROOT

    setpriv = shutil.which("setpriv")
    if os.geteuid() == 0 and not setpriv:
        pytest.skip("root without setpriv: permissions are not enforced")
    prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--"] if os.geteuid() == 0 else []
    proc = subprocess.run([*prefix, sys.executable, "-m", "clef_format.cli", "migrate", *argv, "--json"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.parametrize("args", [(), ("--abort",), ("--abort", "--dry-run"), ("--dry-run",)])
def test_a_read_only_parent_with_an_interrupted_run_says_so_and_its_fix_works(fresh, capsys, args) -> None:
    """Killed while staging in place; then the folder holding the checkpoint became read-only. The run
    (and ``--abort``) said the workspace "cannot be created" and to use ``--output DIR``, which leaves the
    interrupted run where it is, and ``--abort --dry-run`` foretold a rollback the real ``--abort`` refuses.
    Now each names the interrupted run and the fix is to make the folder writable; followed, the same
    command goes on, and nothing of the source is lost."""
    src = fresh("layout-1")
    source = file_digests(src)
    _killed_at("stage:1", str(src))
    left = siblings(src)
    parent = src.parent
    parent.chmod(0o555)
    try:
        rc, out = _unprivileged(str(src), *args)
    finally:
        parent.chmod(0o755)
    assert rc == 1, out
    [refusal] = [f for f in out["findings"] if f["severity"] == "error"]
    assert refusal["code"] == "migrate-refused" and refusal["message"] == (
        f"{parent} is read-only for this user: the interrupted migrate waiting beside {src.name} (its workspace "
        f"{parent}/.{src.name}.clef-migrate) can be neither resumed nor rolled back; nothing was written"), refusal
    assert refusal["fix"] == (f"make {parent} writable for this user (as its owner: chmod u+w {parent}), then run "
                              "the same command again"), refusal
    assert siblings(src) == left and file_digests(src) == source
    rc, done = _unprivileged(str(src), *args)  # the folder is writable again: the fix followed
    assert rc == 0 and not [f for f in done["findings"] if f["severity"] == "error"], done
    if args == ("--abort",):
        assert siblings(src) == [] and file_digests(src) == source
    elif args == ():
        assert siblings(src) == [] and verified(src)[:2] == ("layout-2", True)


def test_an_abort_of_another_target_names_the_interrupted_run_and_the_abort_that_rolls_it_back(
        fresh, capsys, tmp_path: Path) -> None:
    """``--abort --output DIR`` (DIR never used) said only "no interrupted migration to roll back", while
    an in-place run of the same checkpoint waited; and the other way round. Now it names the waiting run
    and the command that rolls it back, which does."""
    src = fresh("layout-1")
    _killed_at("stage:1", str(src))
    other = tmp_path / "elsewhere"
    for extra in ((), ("--dry-run",)):
        rc, out = run_json(capsys, str(src), "--abort", "--output", str(other), *extra)
        said, cmd = out["message"].rsplit(": ", 1)
        assert rc == 0 and said.startswith(f"no interrupted migration to roll back into --output {other}; an "
                                           "interrupted migrate in place waits ("), out
        assert cmd == f"clef-format migrate {src} --abort rolls it back" and siblings(src), out
    rc, done = _follow(capsys, cmd.removesuffix(" rolls it back"))
    assert rc == 0 and done["message"].startswith("rolled back the interrupted migration") and siblings(src) == []

    out_dir = tmp_path / "out"
    _killed_at("stage:1", str(src), "--output", str(out_dir))
    rc, out = run_json(capsys, str(src), "--abort")
    said, cmd = out["message"].rsplit(": ", 1)
    assert rc == 0 and said.startswith(f"no interrupted migration to roll back; an interrupted migrate into {out_dir} "
                                       "waits ("), out
    assert cmd == f"clef-format migrate {src} --abort --output {out_dir} rolls it back", out
    rc, done = _follow(capsys, cmd.removesuffix(" rolls it back"))
    assert rc == 0 and siblings(out_dir) == [] and not out_dir.exists(), done


@pytest.mark.parametrize("mode", ["in-place", "output"])
def test_a_run_killed_right_after_its_exchange_is_said_as_swapped(fresh, capsys, tmp_path: Path, mode: str) -> None:
    """Killed after the exchange, before its journal said so (``swap:2``): ``--current`` and ``--dry-run``
    said it waits "staged", while its new tree is at PATH and its recovery treats it as swapped (the abort
    puts the original back; a run finishes its cleanup). Now both say swapped, and that the journal
    still said staged."""
    _, path, _ = _interrupted(fresh, tmp_path, mode, STAGED)
    said = f"{REVISION} (swapped; its journal still said staged)"
    rc, current = run_json(capsys, str(path), "--current")
    assert rc == 0 and current["pending"] == said, current
    assert "staged)" not in current["message"].replace("its journal still said staged", ""), current["message"]
    if mode == "in-place":
        rc, dry = run_json(capsys, str(path), "--dry-run")
        assert rc == 0 and dry["pending"] == said, dry


# -- the parked original is the only exact copy of the BF16 tables: nothing may convert or delete it -------

@pytest.mark.parametrize("point", [STAGED, SWAPPED])
def test_a_run_never_deletes_the_parked_original_when_another_folder_is_at_path(fresh, capsys, tmp_path: Path,
                                                                                point: str) -> None:
    """Killed after the swap; the user sets the new tree aside and puts another folder at PATH. Running
    migrate PATH again "finished the cleanup": it deleted the parked original (the only exact copy of the
    BF16 tables) and then refused, exit 1. Now it refuses first, nothing changed, and the fix (move the
    folder away, then --abort) brings the original back byte for byte, the folder kept."""
    src, path, original = _interrupted(fresh, tmp_path, "in-place", point)
    path.rename(tmp_path / "newtree")
    path.mkdir()
    (path / "f").write_bytes(b"mine\n")
    parked = tmp_path / ".ck.clef-migrate" / "new"  # the exchange put the original there
    assert file_digests(parked) == original
    rc, out = run_json(capsys, str(path))
    assert rc == 1 and [f["code"] for f in out["findings"]] == ["migrate-refused"], out
    assert out["findings"][0]["message"].startswith(f"{path} no longer holds the new tree"), out
    assert file_digests(parked) == original
    fix = out["findings"][0]["fix"]
    mv, abort = fix.removeprefix("move ").split(" away (")[1].split("), then ")
    os.rename(*mv.removeprefix("mv ").split(" "))
    rc, done = _follow(capsys, abort.split(" puts ")[0])
    assert rc == 0 and file_digests(path) == original and siblings(path) == [], done
    assert (tmp_path / "ck.kept" / "f").read_bytes() == b"mine\n"


def test_a_shell_left_in_the_parked_original_cannot_migrate_it(fresh, capsys, tmp_path: Path) -> None:
    """``migrate .`` from inside the checkpoint, killed after the swap: the shell's working directory is now
    the original parked in the workspace (``.ck.clef-migrate/new``). ``migrate .`` from there converted
    the parked original, ``--current`` called it an untouched layout-1, and the Ctrl-C fix said nothing was
    left; ``scan`` listed the workspace as a copy with a migrate fix. Now each is refused or skipped, the
    fix names the real checkpoint, and ``--abort`` puts back the exact original."""
    from tests.support.migrate import ROOT

    src = fresh("layout-1")
    original = file_digests(src)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    import subprocess
    import sys

    def here(*argv: str, cwd: Path, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "clef_format.cli", *argv], capture_output=True, text=True,
                              cwd=cwd, env={**env, **(extra or {})})

    proc = here("migrate", ".", cwd=src, extra={CRASH_ENV: f"{STAGED}:INT"})
    ws = tmp_path / ".ck.clef-migrate"
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert f"your working directory is now inside {ws} (the run swapped the tree it was in): cd {tmp_path}, " \
           f"then clef-format migrate {src} " in proc.stderr, proc.stderr
    parked = ws / "new"  # where a shell that sat in the checkpoint now is
    assert file_digests(parked) == original
    for argv in (["migrate", "."], ["migrate", ".", "--current"], ["migrate", ".", "--to", "layout-1"]):
        proc = here(*argv, "--json", cwd=parked)
        payload = json.loads(proc.stdout)
        assert proc.returncode == 1 and [f["code"] for f in payload["findings"]] == ["migrate-refused"], payload
        assert payload["findings"][0]["fix"] == (f"cd {tmp_path}; clef-format migrate {src} --current says what waits "
                                                 "and the command that finishes or rolls it back"), payload
    assert file_digests(parked) == original
    rows = json.loads(here("scan", str(tmp_path), "--json", cwd=tmp_path).stdout)
    assert ".clef-migrate" not in json.dumps(rows), rows
    rc, done = run_json(capsys, str(src), "--abort")
    assert rc == 0 and file_digests(src) == original and siblings(src) == [], done


def test_abort_of_an_absent_output_under_a_read_only_folder_is_refused_before_it_removes_anything(
        fresh, tmp_path: Path) -> None:
    """``migrate OUT --abort`` (the form the tool prints for an --output that does not exist yet) skipped
    the read-only check: it deleted the journal and the staged files, then failed on the workspace, and
    the next run found a workspace "with no journal". Now it is refused first, as ``SRC --output OUT
    --abort`` is, ``--dry-run`` says so, and after the fix the abort removes the workspace."""
    src = fresh("layout-1")
    folder = tmp_path / "o"
    folder.mkdir()
    out = folder / "out"
    _killed_at("stage:2", str(src), "--output", str(out))
    ws = folder / ".out.clef-migrate"
    held = file_digests(ws)
    folder.chmod(0o555)
    try:
        for extra in (("--dry-run",), ()):
            rc, report = _unprivileged(str(out), "--abort", *extra)
            [f] = report["findings"]
            assert rc == 1 and f["code"] == "migrate-refused" and f["message"].startswith(
                f"{folder} is read-only for this user: the interrupted migrate waiting beside out"), report
            assert f["fix"].startswith(f"make {folder} writable"), f
            assert file_digests(ws) == held
    finally:
        folder.chmod(0o755)
    rc, report = _unprivileged(str(out), "--abort")
    assert rc == 0 and siblings(out) == [] and not out.exists(), report


def test_abort_into_a_filled_folder_names_the_waiting_run_and_a_regular_file_output_is_refused_as_filled(
        fresh, capsys, tmp_path: Path) -> None:
    """``--abort --output FULL`` (a folder with files, nothing waiting there) was refused as a filled
    --output, though --abort writes nothing there; and a resumed run whose --output became a regular file
    was refused as "read-only for this user" (fix: a writable --output) while its --dry-run said filled.
    Now the abort names the waiting run, and both refusals are the filled-output one."""
    src = fresh("layout-1")
    out = tmp_path / "out"
    _killed_at("stage:2", str(src), "--output", str(out))
    full = tmp_path / "full"
    full.mkdir()
    (full / "f").write_bytes(b"x\n")
    rc, report = run_json(capsys, str(src), "--abort", "--output", str(full))
    assert rc == 0 and report["message"].startswith(f"no interrupted migration to roll back into --output {full}; "
                                                    f"an interrupted migrate into {out} waits"), report
    assert (full / "f").read_bytes() == b"x\n" and siblings(out)
    out.write_bytes(b"mine\n")
    for extra in ((), ("--dry-run",)):
        rc, report = run_json(capsys, str(src), "--to", "layout-2", "--output", str(out), *extra)
        [f] = report["findings"]
        assert rc == 2 and f["code"] == "usage-error" and "exists and is not an empty directory" in f["message"], report
    assert out.read_bytes() == b"mine\n"


def test_going_back_after_the_swap_restores_the_exact_original_and_says_so_beforehand(fresh, capsys,
                                                                                      tmp_path: Path) -> None:
    """Killed after the swap, then the user asks for layout-1. ``--dry-run`` said the recovery first, then
    planned a lossy int8 -> BF16 downgrade that the run never does (it puts the exact original back and
    runs no step); an ``--output`` run from the same folder decoded the int8 tables into the output, not a
    word of the exact original waiting. Now the dry run says no step is left, and the --output run is
    refused until the interrupted run is rolled back or finished (its fix, followed, works)."""
    src, path, original = _interrupted(fresh, tmp_path, "in-place", STAGED)
    rc, dry = run_json(capsys, str(src), "--to", "layout-1", "--dry-run")
    assert rc == 0 and dry["steps"] == [], dry
    assert dry["message"] == "already at layout-1 once the recovery above is done: no step left to run", dry
    out = tmp_path / "out"
    for extra in ((), ("--dry-run",)):
        rc, refused = run_json(capsys, str(src), "--to", "layout-1", "--output", str(out), *extra)
        [f] = refused["findings"]
        assert rc == 1 and f["code"] == "migrate-refused" and not out.exists(), refused
    rc, done = _follow(capsys, f["fix"].split(" puts ")[0])
    assert rc == 0 and file_digests(src) == original, done
    rc, real = run_json(capsys, str(src), "--to", "layout-1")
    assert rc == 0 and real["steps"] == [] and file_digests(src) == original, real


def test_a_dry_run_text_with_no_revision_says_the_pending_run_not_revision_none(fresh, capsys) -> None:
    """The text of ``--dry-run`` during an interrupted run printed ``revision None``."""
    from clef_format.cli.main import main

    src = fresh("layout-1")
    _killed_at("stage:1", str(src))
    capsys.readouterr()
    assert main(["migrate", str(src), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "None" not in text and f"  pending  interrupted run: {REVISION} (staging)\n" in text, text
    assert main(["migrate", str(src), "--current"]) == 0  # a revision to name: the pending run on its own line
    text = capsys.readouterr().out
    assert f"  revision base\n  pending  interrupted run: {REVISION} (staging)\n" in text, text


@pytest.mark.parametrize("args", [(), ("--abort",), ("--dry-run",)])
def test_a_read_only_folder_in_the_workspace_is_named_before_anything_changes_and_its_fix_works(
        fresh, capsys, args) -> None:
    """Killed while staging; then a folder of the staged tree became read-only. The resume stopped half-way
    with a bare "Permission denied" (no path, no fix) and discarded the staged work. Now the run, the abort
    and the dry run name the folder before writing, and the fix (u+w on the workspace's folders only: its files
    may be hard links to the checkpoint's), followed, lets
    the same command go on."""
    import shlex
    import subprocess

    src = fresh("layout-1")
    (src / "tokenizer.json").chmod(0o444)  # the user's read-only file: linked, not copied, into the staged tree
    source = file_digests(src)
    _killed_at("stage:1", str(src))
    ws = src.parent / f".{src.name}.clef-migrate"
    locked = ws / "new" / "clef_head"
    staged = sorted(str(p.relative_to(ws)) for p in ws.rglob("*"))
    locked.chmod(0o555)
    try:
        rc, out = _unprivileged(str(src), *args)
    finally:
        locked.chmod(0o755)
    assert rc == 1, out
    [refusal] = [f for f in out["findings"] if f["severity"] == "error"]
    assert refusal["code"] == "migrate-refused" and refusal["message"] == (
        f"{locked} is read-only for this user: the interrupted migrate waiting beside {src.name} (its workspace "
        f"{ws}) can be neither resumed nor rolled back; nothing was written"), refusal
    assert refusal["fix"] == ("make the workspace's folders writable for this user (as its owner: find "
                              f"{ws} -type d -exec chmod u+w {{}} +), then run the same command again"), refusal
    assert sorted(str(p.relative_to(ws)) for p in ws.rglob("*")) == staged and file_digests(src) == source
    locked.chmod(0o555)
    modes = {p: p.stat().st_mode for p in src.rglob("*") if p.is_file()}
    chmod = refusal["fix"].split("(as its owner: ", 1)[1].split("), then", 1)[0]
    subprocess.run(shlex.split(chmod), check=True)  # the fix followed, as printed
    assert {p: p.stat().st_mode for p in src.rglob("*") if p.is_file()} == modes  # hard links: never chmod'ed
    rc, done = _unprivileged(str(src), *args)
    assert rc == 0 and not [f for f in done["findings"] if f["severity"] == "error"], done
    if args == ("--abort",):
        assert siblings(src) == [] and file_digests(src) == source
    elif args == ():
        assert siblings(src) == [] and verified(src)[:2] == ("layout-2", True)


def test_an_output_that_became_a_symlink_keeps_its_interrupted_run_in_view_and_the_fix_works(
        fresh, capsys, tmp_path: Path) -> None:
    """Killed while staging into --output OUT; then OUT was made a symlink to a folder elsewhere. Every
    command looked beside where the link leads, found nothing, and the run's workspace stayed beside OUT
    forever (a new run wrote through the link). Now ``--current`` of OUT and of the source names the run,
    a new run into OUT is refused before writing, and the printed ``--abort`` removes only what the run
    left: the link and its folder are kept, and the command then runs."""
    src = fresh("layout-1")
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    _killed_at("stage:1", str(src), "--output", str(out))
    elsewhere.mkdir()
    out.symlink_to(elsewhere)
    rc, now = run_json(capsys, str(out), "--current")
    assert rc == 0 and now["pending"] and now["message"].startswith(
        f"{out} is now a symlink (to {elsewhere}): an interrupted migrate into it waits beside it"), now
    fix = f"clef-format migrate {out} --abort removes what that run left (the link and what it leads to are kept)"
    assert fix in now["message"], now
    rc, mine = run_json(capsys, str(src), "--current")
    assert rc == 0 and fix in mine["message"], mine
    for argv in ([str(src), "--output", str(out)], [str(src), "--output", str(out), "--dry-run"]):
        rc, refused = run_json(capsys, *argv)
        [f] = [f for f in refused["findings"] if f["severity"] == "error"]
        assert rc == 1 and f["code"] == "migrate-refused" and f["fix"].startswith(fix), refused
        assert list(elsewhere.iterdir()) == []
    rc, aborted = _follow(capsys, f["fix"].split(" removes ", 1)[0])
    assert rc == 0 and out.is_symlink() and os.readlink(out) == str(elsewhere), aborted
    assert siblings(out) == [] and list(elsewhere.iterdir()) == []
    rc, done = run_json(capsys, str(src), "--output", str(out))  # "then run the command again"
    assert rc == 0 and out.is_symlink() and verified(elsewhere)[:2] == ("layout-2", True), done


def test_abort_after_the_swap_keeps_a_symlink_put_at_the_output(fresh, capsys, tmp_path: Path) -> None:
    """Killed after its swap into --output OUT; the user moved the new tree to REAL and left OUT as a link to
    it. ``--abort`` took the link for the output it had created and deleted it; now the link and the tree
    are kept, and only the workspace is removed."""
    src = fresh("layout-1")
    out, real = tmp_path / "out", tmp_path / "real"
    _killed_at(SWAPPED, str(src), "--output", str(out))
    out.rename(real)
    out.symlink_to(real)
    tree = file_digests(real)
    rc, done = run_json(capsys, str(out), "--abort")
    assert rc == 0 and "a symlink is at its path now, kept as it is" in done["message"], done
    assert out.is_symlink() and os.readlink(out) == str(real) and file_digests(real) == tree
    assert siblings(out) == []


def test_current_says_a_filled_output_would_refuse_the_resume_and_its_abort_keeps_the_files(
        fresh, capsys, tmp_path: Path) -> None:
    """Killed while staging into --output OUT; then someone made OUT and put a file in it. ``--current`` (of
    OUT and of the source) said "--output OUT resumes it", a run refused for the filled OUT. Now it says
    so, and gives the abort, which keeps OUT and its file, and the resume once OUT is empty again."""
    src = fresh("layout-1")
    out = tmp_path / "out"
    _killed_at("stage:1", str(src), "--output", str(out))
    out.mkdir()
    (out / "notes.txt").write_bytes(b"mine\n")
    said = (f"{out} holds files now, so resuming it would be refused: clef-format migrate {out} --abort rolls it "
            f"back (the --output and its files are kept); or empty {out}, then clef-format migrate {src} --to "
            f"layout-2 --output {out} resumes it")
    for path in (out, src):
        rc, now = run_json(capsys, str(path), "--current")  # OUT itself is read as what it is: no checkpoint
        assert rc == (1 if path == out else 0) and now["message"].endswith(said), now
    rc, refused = run_json(capsys, str(src), "--output", str(out))
    assert rc == 2 and "exists and is not an empty directory" in refused["findings"][0]["message"], refused
    (out / "notes.txt").unlink()  # "or empty OUT, then ... resumes it"
    rc, done = _follow(capsys, said.split("; or empty ", 1)[1].split(", then ", 1)[1].removesuffix(" resumes it"))
    assert rc == 0 and siblings(out) == [] and verified(out)[:2] == ("layout-2", True), done


def test_abort_of_a_staged_run_into_a_filled_output_keeps_the_files(fresh, capsys, tmp_path: Path) -> None:
    src = fresh("layout-1")
    out = tmp_path / "out"
    _killed_at("stage:1", str(src), "--output", str(out))
    out.mkdir()
    (out / "notes.txt").write_bytes(b"mine\n")
    rc, done = run_json(capsys, str(out), "--abort")
    assert rc == 0 and siblings(out) == [] and (out / "notes.txt").read_bytes() == b"mine\n", done


def test_current_foretells_that_a_read_only_parent_refuses_the_resume_and_the_abort(fresh) -> None:
    """``--current`` gave the resume and the abort of a run killed while staging, both refused while the
    folder holding the checkpoint is read-only; now it says so, with the refusal's own fix."""
    src = fresh("layout-1")
    _killed_at("stage:1", str(src))
    parent = src.parent
    parent.chmod(0o555)
    try:
        rc, out = _unprivileged(str(src), "--current")
        _, refused = _unprivileged(str(src))
    finally:
        parent.chmod(0o755)
    [refusal] = [f for f in refused["findings"] if f["severity"] == "error"]
    assert rc == 0 and out["message"].endswith(
        f"; but both would be refused now: {refusal['message']} (fix: {refusal['fix']})"), out
    rc, out = _unprivileged(str(src), "--current")
    assert rc == 0 and "would be refused" not in out["message"], out


def test_a_trailing_slash_on_a_symlinked_output_finds_the_same_interrupted_run(fresh, capsys, tmp_path: Path) -> None:
    """``OUT/`` (as tab completion writes it) for an --output that became a symlink: ``--current`` saw no
    run and ``--abort`` said there was nothing to roll back, leaving the workspace for good."""
    src = fresh("layout-1")
    out, real = tmp_path / "out", tmp_path / "real"
    _killed_at(SWAPPED, str(src), "--output", str(out))
    out.rename(real)
    out.symlink_to(real)
    rc, now = run_json(capsys, f"{out}/", "--current")
    assert rc == 0 and "is now a symlink" in now["message"], now
    rc, done = run_json(capsys, f"{out}/", "--abort")
    assert rc == 0 and siblings(out) == [] and out.is_symlink() and verified(real)[:2] == ("layout-2", True), done


def test_current_of_an_output_run_foretells_a_read_only_workspace_folder(fresh, tmp_path: Path) -> None:
    """As in place: ``OUT --current`` and ``SRC --current`` of an --output run killed while staging gave its
    resume and abort, both refused while a folder of its workspace is read-only; now they say so."""
    src = fresh("layout-1")
    out = tmp_path / "out"
    _killed_at("stage:1", str(src), "--output", str(out))
    locked = tmp_path / ".out.clef-migrate" / "new" / "clef_head"
    locked.chmod(0o555)
    try:
        said = [_unprivileged(str(path), "--current")[1]["message"] for path in (out, src)]
        _, refused = _unprivileged(str(out), "--abort")
    finally:
        locked.chmod(0o755)
    [refusal] = [f for f in refused["findings"] if f["severity"] == "error"]
    for message in said:
        assert message.endswith(f"; but both would be refused now: {refusal['message']} (fix: {refusal['fix']})"), said


def test_a_checkpoint_replaced_by_a_symlink_after_the_swap_dry_run_and_current_say_the_abort_is_refused(
        fresh, capsys, tmp_path: Path) -> None:
    """In place, killed after the swap; the user moved the checkpoint and left a symlink to it at its path.
    ``--abort --dry-run`` said "would be refused" with exit 0 and no finding, and ``--current`` gave that
    refused ``--abort`` as the way out. Now the dry run refuses as the abort does (exit 1, the same error),
    ``--current`` says the abort is refused with its fix, and the fix followed puts the original back."""
    src = fresh("layout-1")
    original = file_digests(src)
    _killed_at(SWAPPED, str(src))
    moved = tmp_path / "moved"
    src.rename(moved)
    src.symlink_to(moved)
    rc, dry = run_json(capsys, str(src), "--abort", "--dry-run")
    rc_real, real = run_json(capsys, str(src), "--abort")
    [f] = [f for f in real["findings"] if f["severity"] == "error"]
    [g] = [g for g in dry["findings"] if g["severity"] == "error"]
    assert rc_real == 1 and rc == 1 and g["fix"] == f["fix"], (dry, real)
    assert g["message"] == "--abort would be refused: " + f["message"].removesuffix("; nothing was changed"), g
    rc, now = run_json(capsys, str(src), "--current")
    assert rc == 0 and f"{g['message']} (fix: {f['fix']})" in now["message"], now
    src.unlink()  # the fix: move what is at PATH away (here: the link), then --abort
    rc, done = run_json(capsys, str(src), "--abort")
    assert rc == 0 and file_digests(src) == original and siblings(src) == [], done


@pytest.mark.parametrize("to", [(), ("--to", "layout-1")])
def test_dry_run_after_the_swap_foretells_a_read_only_workspace_folder(fresh, to) -> None:
    """In place, killed after the swap; then a folder of the workspace became read-only. The dry runs said
    the recovery would finish (exit 0) and the runs refused; now each dry run gives the run's refusal."""
    src = fresh("layout-1")
    _killed_at(SWAPPED, str(src))
    locked = src.parent / f".{src.name}.clef-migrate" / "new" / "clef_head"
    locked.chmod(0o555)
    try:
        rc_dry, dry = _unprivileged(str(src), *to, "--dry-run")
        rc, real = _unprivileged(str(src), *to)
    finally:
        locked.chmod(0o755)
    errors = [[(f["code"], f["message"], f["fix"]) for f in out["findings"] if f["severity"] == "error"]
              for out in (dry, real)]
    assert rc_dry == rc == 1 and errors[0] == errors[1] and len(errors[0]) == 1, (dry, real)


def test_an_output_replaced_by_a_file_keeps_its_interrupted_run_in_reach(fresh, capsys, tmp_path: Path) -> None:
    """Killed while staging into --output OUT; then a file was written at OUT. ``OUT --current`` and
    ``OUT --abort`` said "OUT is a file, not a folder" (exit 2), the run's workspace unreachable by the form
    the tool prints. Now both reach the run, and the abort keeps the file."""
    src = fresh("layout-1")
    out = tmp_path / "out"
    _killed_at("stage:1", str(src), "--output", str(out))
    out.write_bytes(b"mine\n")
    rc, now = run_json(capsys, str(out), "--current")
    assert rc == 0 and now["message"].startswith(f"{out} is a file now, not a folder: an interrupted migrate"), now
    assert f"clef-format migrate {out} --abort rolls it back (the --output and that file are kept)" in now["message"]
    rc, done = run_json(capsys, str(out), "--abort")
    assert rc == 0 and siblings(out) == [] and out.read_bytes() == b"mine\n", done


def test_abort_with_another_folder_at_path_says_what_the_finishing_run_says(fresh, capsys, tmp_path: Path) -> None:
    """In place, killed after the swap; the new tree moved away and a new folder made at PATH. ``--abort``
    said the new tree had changed and offered "or finish the migration instead", which is refused
    ("another folder is there now"). Now both say the same, and the fix they share works."""
    src = fresh("layout-1")
    original = file_digests(src)
    _killed_at(SWAPPED, str(src))
    src.rename(tmp_path / "moved")
    src.mkdir()
    (src / "notes").write_bytes(b"mine\n")
    rc, aborted = run_json(capsys, str(src), "--abort")
    rc2, finished = run_json(capsys, str(src), "--to", "layout-2")
    errors = [[(f["message"], f["fix"]) for f in out["findings"] if f["severity"] == "error"] for out in (aborted, finished)]
    assert rc == rc2 == 1 and errors[0] == errors[1] and "another folder is there now" in errors[0][0][0], errors
    assert "finish the migration instead" not in errors[0][0][1]
    kept = tmp_path / "kept"
    src.rename(kept)  # the fix: move PATH away, then --abort
    rc, done = run_json(capsys, str(src), "--abort")
    assert rc == 0 and file_digests(src) == original and (kept / "notes").read_bytes() == b"mine\n", done


def test_source_output_abort_reaches_a_run_whose_output_became_a_symlink(fresh, capsys, tmp_path: Path) -> None:
    """``SRC --output OUT --abort`` rolls back like ``OUT --abort`` (docs/MIGRATION.md); with OUT made a symlink
    after the run was killed it was refused, pointing at the other form. Now it rolls the run back."""
    src = fresh("layout-1")
    out, other = tmp_path / "out", tmp_path / "other"
    _killed_at("stage:1", str(src), "--output", str(out))
    other.mkdir()
    out.symlink_to(other)
    rc, done = run_json(capsys, str(src), "--output", str(out), "--abort")
    assert rc == 0 and siblings(out) == [] and out.is_symlink() and list(other.iterdir()) == [], done


@pytest.mark.parametrize("args", [("--abort",), ()])
def test_a_file_the_user_put_in_the_workspace_is_never_removed_by_the_recovery(fresh, capsys, args) -> None:
    """A user's file put inside an interrupted run's workspace (which holds a journal) was deleted with it by
    ``--abort`` or by the run finishing the recovery. Now both refuse, naming it; moved out, the same
    command goes on and the file is kept."""
    src = fresh("layout-1")
    original = file_digests(src)
    _killed_at("stage:1", str(src))
    ws = src.parent / f".{src.name}.clef-migrate"
    (ws / "notes.txt").write_bytes(b"mine\n")
    rc_dry, dry = run_json(capsys, str(src), *args, "--dry-run")
    rc, refused = run_json(capsys, str(src), *args)
    [f] = [f for f in refused["findings"] if f["severity"] == "error"]
    assert rc == rc_dry == 1 and f["code"] == "migrate-refused" and "(notes.txt)" in f["message"], refused
    assert f["fix"] == f"move notes.txt out of {ws} (it may be your data), then run the same command again"
    assert (ws / "notes.txt").read_bytes() == b"mine\n" and file_digests(src) == original
    (ws / "notes.txt").rename(src.parent / "notes.txt")  # the fix followed
    rc, done = run_json(capsys, str(src), *args)
    assert rc == 0 and siblings(src) == [] and (src.parent / "notes.txt").read_bytes() == b"mine\n", done
