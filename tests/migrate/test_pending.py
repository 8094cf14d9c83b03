"""pending in-process: an interrupted ``migrate SRC --output OUT`` (or a fallback swap killed between its
renames) found through OUT's path where OUT does not exist: what ``--current`` reports, what a plain
``migrate OUT`` says to run, what ``--abort [--dry-run]`` does, and the runs ``migrate SRC --current`` lists.

The interrupted runs are real workspace folders and journals, written the way apply writes them (or left
by the crash hook in a real run)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from clef_format.migrate import crash, workspace
from clef_format.migrate.crash import CRASH_ENV
from clef_format.migrate.workspace import Lock, Target, make_target, write_journal
from tests.support.migrate import file_digests, run_json, siblings

REVISION = "0001_int8_tables"


def _journal(target: Target, phase: str, **extra: object) -> dict:
    """The journal of a run into ``target`` at ``phase``, in its workspace (as apply writes it)."""
    journal = {"version": workspace.JOURNAL_VERSION, "revision": REVISION, "direction": "upgrade", "from": "layout-1",
               "to": "layout-2", "source": target.source, "target": target.path, "in_place": target.in_place,
               "phase": phase, "fingerprint": {}, "done": {}, "quality": {}, **extra}
    os.makedirs(target.ws, exist_ok=True)
    write_journal(target, workspace.Journal.from_json(journal))
    return journal


def _output_run(fresh, tmp_path: Path, phase: str = "staging") -> tuple[Path, Path, Target]:
    """A layout-1 source and an interrupted ``--output`` run from it into ``tmp_path/out`` (absent)."""
    src = fresh("layout-1")
    out = tmp_path / "out"
    target = make_target(str(src), str(out))
    _journal(target, phase)
    Path(target.lock_path).write_text("12345\n")  # a killed run's lock file stays (the kernel drops the flock)
    return src, out, target


# ---- migrate OUT --current ---------------------------------------------------------------------------

def test_current_of_a_missing_output_reports_the_run_waiting_beside_it(fresh, tmp_path: Path, capsys) -> None:
    src, out, _ = _output_run(fresh, tmp_path)
    rc, report = run_json(capsys, str(out), "--current")
    assert rc == 0, report
    assert (report["command"], report["path"], report["layout"], report["ok"], report["findings"]) == \
        ("migrate", str(out), None, True, [])
    assert {k: report[k] for k in ("from", "to", "dry_run", "steps", "output", "recovered", "revision", "pending")} == {
        "from": "layout-1", "to": "layout-2", "dry_run": False, "steps": [], "output": None, "recovered": [],
        "revision": None, "pending": f"{REVISION} upgrade (staging)"}
    assert report["message"] == (
        f"{out} does not exist: an interrupted migrate into it waits beside it ({REVISION} upgrade from {src}, "
        f"staging); clef-format migrate {src} --to layout-2 --output {out} resumes it; "
        f"clef-format migrate {out} --abort rolls it back")
    assert not out.exists() and siblings(out) == [".out.clef-migrate", ".out.clef-migrate.lock"]  # only reported


def test_current_of_a_missing_output_whose_workspace_holds_no_journal(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    (tmp_path / ".out.clef-migrate").mkdir()
    rc, report = run_json(capsys, str(out), "--current")
    assert rc == 0 and report["pending"] is None and report["from"] is None and report["to"] is None, report
    assert report["message"] == (
        f"{out} does not exist: an interrupted migrate into it waits beside it (its workspace holds no journal: "
        f"nothing in it was needed); clef-format migrate {out} --abort removes what it left (nothing in it is needed); "
        "then run the migration again")


def test_a_missing_output_with_only_a_lock_left_is_reported_then_cleared_by_abort(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    lock = tmp_path / ".out.clef-migrate.lock"
    lock.write_text("12345\n")
    rc, report = run_json(capsys, str(out), "--current")
    assert rc == 0 and report["pending"] is None, report
    assert report["message"] == (f"{out} does not exist; only the lock of a killed migrate into it is left ({lock}): "
                                 f"clef-format migrate {out} --abort removes it")

    rc, report = run_json(capsys, str(out), "--abort")
    assert rc == 0 and report["command"] == "migrate" and report["findings"] == [], report
    assert report["message"] == "no interrupted migration to roll back; removed the lock a killed run had left"
    assert report["recovered"] == [] and siblings(out) == [] and not out.exists()


# ---- a plain migrate OUT -----------------------------------------------------------------------------

def test_a_plain_migrate_of_a_missing_output_says_what_resumes_or_rolls_back(fresh, tmp_path: Path, capsys) -> None:
    src, out, _ = _output_run(fresh, tmp_path)
    rc, report = run_json(capsys, str(out))
    assert rc == 2, report
    (finding,) = report["findings"]
    assert finding["code"] == "path-not-found"
    assert finding["message"].endswith(f"{out} does not exist: an interrupted migrate into it waits beside it "
                                       f"({REVISION} upgrade from {src}, staging)"), finding
    assert finding["fix"] == (f"clef-format migrate {src} --to layout-2 --output {out} resumes it; "
                              f"clef-format migrate {out} --abort rolls it back")
    assert siblings(out) == [".out.clef-migrate", ".out.clef-migrate.lock"]  # nothing was touched


def test_a_run_interrupted_by_the_crash_hook_is_found_by_its_output_path(fresh, tmp_path: Path, capsys,
                                                                       monkeypatch) -> None:
    """The workspace a real ``--output`` run had at its first staging point (copied there, as a SIGKILL would
    leave it), its output removed: ``migrate OUT`` names the command that resumes it, and that command does."""
    src = fresh("layout-1")
    out = tmp_path / "out"
    target = make_target(str(src), str(out))
    saved = tmp_path / "saved-ws"
    monkeypatch.setattr(crash, "_crash_counts", {})
    monkeypatch.setenv(CRASH_ENV, "stage:1:INT")
    old = signal.signal(signal.SIGINT, lambda s, f: shutil.copytree(target.ws, saved, symlinks=True))
    try:
        rc, _ = run_json(capsys, str(src), "--output", str(out))
    finally:
        signal.signal(signal.SIGINT, old)
    monkeypatch.delenv(CRASH_ENV)
    assert rc == 0 and saved.is_dir()
    shutil.rmtree(out)
    shutil.copytree(saved, target.ws, symlinks=True)

    rc, report = run_json(capsys, str(out))
    assert rc == 2, report
    fix = report["findings"][0]["fix"]
    assert fix == (f"clef-format migrate {src} --to layout-2 --output {out} resumes it; "
                   f"clef-format migrate {out} --abort rolls it back"), fix
    rc, report = run_json(capsys, str(src), "--to", "layout-2", "--output", str(out))
    assert rc == 0 and report["layout"] == "layout-2" and siblings(out) == [], report


# ---- migrate OUT --abort [--dry-run] -----------------------------------------------------------------

def test_abort_of_a_missing_output_rolls_the_run_back_and_says_so(fresh, tmp_path: Path, capsys) -> None:
    src, out, _ = _output_run(fresh, tmp_path)
    before = file_digests(src)
    note = f"rolled back the interrupted migration {REVISION} upgrade; the checkpoint was never changed"

    rc, dry = run_json(capsys, str(out), "--abort", "--dry-run")
    assert rc == 0 and dry["command"] == "migrate" and dry["path"] == str(out), dry
    assert dry["dry_run"] is True and dry["recovery"] == note and dry["message"] == f"--abort would do this: {note}"
    assert siblings(out) == [".out.clef-migrate", ".out.clef-migrate.lock"]  # the dry run changed nothing

    rc, report = run_json(capsys, str(out), "--abort")
    assert rc == 0 and report["command"] == "migrate" and report["layout"] is None, report
    assert report["findings"] == [{"code": "migrate-recovered", "severity": "info", "message": note}]
    assert report["message"] == note and report["recovered"] == [note]
    assert siblings(out) == [] and not out.exists() and file_digests(src) == before


def test_abort_dry_run_with_nothing_beside_a_missing_output_says_so(tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    (tmp_path / ".out.clef-migrate.lock").write_text("")
    rc, dry = run_json(capsys, str(out), "--abort", "--dry-run")
    assert rc == 0 and dry["command"] == "migrate" and dry["recovery"] is None, dry
    assert dry["message"] == "no interrupted migration to roll back"


def test_abort_is_refused_while_the_interrupted_run_still_holds_its_lock(fresh, tmp_path: Path, capsys) -> None:
    _, out, target = _output_run(fresh, tmp_path)
    with Lock(target):  # the run is alive: its flock is held
        rc, report = run_json(capsys, str(out), "--abort")
    assert rc == 1, report
    (finding,) = report["findings"]
    assert finding["code"] == "migrate-refused" and finding["severity"] == "error", finding
    assert f"another clef-format migrate (pid {os.getpid()}) is working on {out}" == finding["message"]
    assert os.path.isfile(target.journal_path)  # nothing was rolled back


def test_abort_that_cannot_remove_the_workspace_says_the_rollback_failed(fresh, tmp_path: Path, capsys) -> None:
    _, out, target = _output_run(fresh, tmp_path)
    mnt = Path(target.new) / "mnt"  # a mount inside the staged tree: its folder cannot be deleted
    mnt.mkdir(parents=True)  # (at the workspace's top, a name no run makes is refused before anything is removed)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    try:
        rc, report = run_json(capsys, str(out), "--abort")
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
    assert rc == 1, report
    (finding,) = report["findings"]
    assert finding["code"] == "migrate-failed" and finding["severity"] == "error", finding
    assert finding["message"] == (f"rolling back the interrupted migration failed: {mnt} is a mount point: nothing "
                                  "below it is deleted (unmount it, then run again)")  # nothing deleted through it
    assert finding["fix"] == f"clef-format migrate {out} --abort (after freeing the cause above)"


# ---- an in-place fallback swap killed between its two renames ----------------------------------------

def test_an_in_place_run_killed_between_the_fallback_renames_is_put_back_by_abort(fresh, capsys) -> None:
    root = fresh("layout-1")
    before = file_digests(root)
    target = make_target(str(root), None)
    os.makedirs(target.ws)
    shutil.copytree(root, target.new, symlinks=True)
    os.rename(root, target.old)
    _journal(target, "staged")

    rc, current = run_json(capsys, str(root), "--current")
    assert rc == 0 and current["pending"] == f"{REVISION} upgrade (staged)", current
    assert current["message"].endswith(f"; clef-format migrate {root} --abort puts the original tree back (it is "
                                       f"complete in {target.ws})"), current["message"]

    rc, report = run_json(capsys, str(root), "--abort")
    assert rc == 0 and report["layout"] == "layout-1", report
    assert report["message"] == f"rolled back the interrupted migration {REVISION} upgrade: the original tree is " \
                                f"back at {root}"
    assert file_digests(root) == before and siblings(root) == []


# ---- migrate SRC --current: the --output runs from SRC beside it -------------------------------------

def test_current_of_the_source_lists_each_interrupted_output_run_from_it_once(fresh, tmp_path: Path, capsys) -> None:
    """Only a workspace (``.NAME.clef-migrate``) counts, and only of an --output run from this source: a hidden
    file that merely starts with a dot, another source's --output run, the source's own in-place run are not."""
    src, out, _ = _output_run(fresh, tmp_path)
    (tmp_path / ".out_journal_copy").write_text("{}")  # hidden, not a workspace
    (tmp_path / "xout.clef-migrate").mkdir()  # not hidden: not a workspace either
    other = tmp_path / "other-src"
    other.mkdir()
    _journal(make_target(str(other), str(tmp_path / "other-out")), "staging")  # from another source
    rc, report = run_json(capsys, str(src), "--current")
    assert rc == 0, report
    assert report["pending_outputs"] == [str(out)]
    assert report["message"] == (
        f"an interrupted migrate from here into --output {out} waits ({REVISION} upgrade from {src}, staging): "
        f"clef-format migrate {src} --to layout-2 --output {out} resumes it; clef-format migrate {out} --abort "
        "rolls it back")


def test_current_of_the_source_does_not_list_its_own_in_place_run(fresh, capsys) -> None:
    src = fresh("layout-1")
    _journal(make_target(str(src), None), "staging")
    rc, report = run_json(capsys, str(src), "--current")
    assert rc == 0 and report["pending"] == f"{REVISION} upgrade (staging)" and "pending_outputs" not in report, report


def test_the_journal_of_a_run_found_beside_its_output_is_read(tmp_path: Path) -> None:
    """``interrupted_at`` on a path that does not exist: the run's target and the source its journal names."""
    from clef_format.migrate.pending import interrupted_at

    src = tmp_path / "src"
    src.mkdir()
    target = make_target(str(src), str(tmp_path / "out"))
    journal = _journal(target, "staging")
    found = interrupted_at(str(tmp_path / "out"))
    assert found is not None and found[1].to_json() == journal
    assert (found[0].path, found[0].source) == (str(tmp_path / "out"), str(src))
    assert interrupted_at(str(tmp_path / "nothing-here")) is None


@pytest.mark.parametrize("point", ["stage:1", "swap:1"])
def test_a_checkpoint_moved_away_from_a_staged_run_is_not_said_to_come_back(fresh, capsys, tmp_path: Path,
                                                                           point: str) -> None:
    """Killed before its swap, then the checkpoint moved away: ``--current`` said ``--abort puts the original
    tree back (it is complete in the workspace)``, but the workspace holds only the staged tree, and the
    abort brings nothing back. Now it says the abort removes the staged work, which it does, and the
    moved checkpoint is untouched."""
    from tests.support.migrate import cli

    root = fresh("layout-1")
    before = file_digests(root)
    proc = cli("migrate", str(root), "--json", env={CRASH_ENV: point})
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    moved = tmp_path / "moved"
    root.rename(moved)
    rc, current = run_json(capsys, str(root), "--current")
    assert rc == 0 and current["message"].endswith(
        f"clef-format migrate {root} --abort removes its workspace (it holds only the run's staged work; the "
        "checkpoint, wherever it is now, was never changed)"), current["message"]
    rc, report = run_json(capsys, str(root), "--abort")
    assert rc == 0 and siblings(root) == [] and not root.exists() and file_digests(moved) == before, report
