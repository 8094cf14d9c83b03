"""Crash injection: SIGKILL a real migrating process at points across every phase, then check nothing was lost.

``CLEF_FORMAT_CRASH_AT=<phase>:<n>`` makes ``apply`` kill its own process (SIGKILL: no handler,
no cleanup, no flush) at the n-th crash point of that phase. After each kill the directory must
verify as layout-1 (with the original BF16 tables, byte for byte) or layout-2, every other backbone
tensor byte-identical; and running migrate again must finish the job and leave nothing behind.
"""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest

from clef_format.cli.main import main
from tests.support.migrate import backbone_digests, cli, file_digests, siblings, table_bytes, verified

# (phase, n): lock; journal writes (start, each finished file, staged, swapped); stage ticks and files
# in the middle of writing; verify of the new tree; before / after the atomic swap; the cleanup steps.
POINTS = [("lock", 1), ("journal", 2), ("stage", 1), ("stage", 3), ("stage", 6), ("journal", 4),
          ("verify", 1), ("swap", 1), ("swap", 2), ("cleanup", 2)]


def _rerun(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    rc = main(["migrate", *args, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    return out


def _check_after_kill(root: Path, digests: dict[str, str], tables: dict[str, bytes]) -> str:
    layout, ok, errors = verified(root)
    assert ok, errors
    assert layout in ("layout-1", "layout-2")
    assert backbone_digests(root) == digests
    if layout == "layout-1":
        assert table_bytes(root) == tables  # the BF16 originals, untouched
    return layout


@pytest.mark.parametrize("phase,n", POINTS, ids=[f"{p}:{n}" for p, n in POINTS])
def test_sigkill_then_rerun_finishes(fresh, capsys, phase: str, n: int) -> None:
    root = fresh("layout-1")
    digests, tables = backbone_digests(root), table_bytes(root)
    proc = cli("migrate", str(root), "--json", env={"CLEF_FORMAT_CRASH_AT": f"{phase}:{n}"})
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    _check_after_kill(root, digests, tables)
    out = _rerun(capsys, str(root))
    assert out["layout"] == "layout-2" and out["ok"]
    assert backbone_digests(root) == digests
    assert siblings(root) == []


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_run_killed_in_cleanup_is_named_by_current_and_following_it_leaves_nothing(fresh, capsys, n: int) -> None:
    """Killed in its cleanup steps, a finished run leaves its workspace and lock. With its journal still
    there, ``--current`` shows it pending; after the journal is gone (cleanup:3) it said nothing of
    them. Now it names them and the command that removes them; following it leaves nothing."""
    root = fresh("layout-1")
    proc = cli("migrate", str(root), "--json", env={"CLEF_FORMAT_CRASH_AT": f"cleanup:{n}"})
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    assert siblings(root) == [f".{root.name}.clef-migrate", f".{root.name}.clef-migrate.lock"]
    assert main(["migrate", str(root), "--current", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    if n < 3:
        assert out["pending"] == "0001_int8_tables upgrade (swapped)", out
        assert out["message"].startswith("an interrupted migrate waits") and (
            f"clef-format migrate {root} --to layout-2 would do this: the interrupted migration" in out["message"]), out
        fix = f"clef-format migrate {root} --to layout-2"
    else:
        assert out["pending"] is None, out
        fix = out["message"].rsplit(": ", 1)[1]
        assert fix == f"clef-format migrate {root} --abort removes it", out
        fix = fix.removesuffix(" removes it")
    assert main(fix.split()[1:] + ["--json"]) == 0
    capsys.readouterr()
    assert siblings(root) == [] and verified(root)[:2] == ("layout-2", True)


@pytest.mark.parametrize("then", ["source-migrated-in-place", "other-target"])
def test_a_pending_output_run_that_no_longer_applies_is_rolled_back_by_the_fix(fresh, capsys, tmp_path: Path,
                                                                                then: str) -> None:
    """An --output staging whose source has since changed (migrated in place), or a run to another layout
    into the same OUT: the fix --current printed said "resumes it", the run said "resuming", did
    nothing, and the run stayed pending. Now following the fix rolls the stale staging back, once."""
    src, out = fresh("layout-1"), tmp_path / "out"
    proc = cli("migrate", str(src), "--to", "layout-2", "--output", str(out), "--json",
               env={"CLEF_FORMAT_CRASH_AT": "stage:3"})
    assert proc.returncode == -signal.SIGKILL
    to = "layout-2"
    if then == "source-migrated-in-place":
        _rerun(capsys, str(src), "--to", "layout-2")
        assert main(["migrate", str(src), "--current", "--json"]) == 0
        message = json.loads(capsys.readouterr().out)["message"]
        command = message.split(": ", 1)[1].split(" resumes it")[0]
        assert command == f"clef-format migrate {src} --to layout-2 --output {out}", message
    else:
        to = "layout-1"
    report = _rerun(capsys, str(src), "--to", to, "--output", str(out))
    assert [f["code"] for f in report["findings"] if f["code"] == "migrate-recovered"] == ["migrate-recovered"]
    assert report["recovered"][0].startswith("rolled back the interrupted migration 0001_int8_tables upgrade: "), report
    assert "resuming" not in json.dumps(report)
    assert siblings(out) == [] and not out.exists()
    assert main(["migrate", str(src), "--current", "--json"]) == 0
    assert "message" not in json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("phase", ["verify:1", "swap:1", "swap:2", "cleanup:1"])
def test_going_back_after_an_interrupted_upgrade_restores_the_original_not_a_decoded_copy(fresh, capsys,
                                                                                         phase: str) -> None:
    """``migrate PATH --to layout-1`` after an upgrade killed once staged finished the upgrade (discarding the
    original tree), then downgraded: BF16 tables decoded from int8, not the originals. While the original
    is whole in the workspace, going back now restores it, byte for byte."""
    root = fresh("layout-1")
    before = file_digests(root)
    proc = cli("migrate", str(root), "--json", env={"CLEF_FORMAT_CRASH_AT": phase})
    assert proc.returncode == -signal.SIGKILL
    out = _rerun(capsys, str(root), "--to", "layout-1")
    assert out["steps"] == [] and out["layout"] == "layout-1", out
    assert "(this run goes to another layout)" in out["recovered"][0] or phase == "verify:1", out
    assert file_digests(root) == before and siblings(root) == []


@pytest.mark.parametrize("phase", ["swap:2", "cleanup:1", "cleanup:2"])
def test_an_output_run_killed_after_its_swap_is_finished_and_said_so(fresh, capsys, tmp_path: Path, phase: str) -> None:
    """Resumed after its swap, an --output run reported the layout-1 source as "layout-2 ... already at
    layout-2: nothing to do"; --current of OUT named no command. Both now say what happened."""
    src, out = fresh("layout-1"), tmp_path / "out"
    proc = cli("migrate", str(src), "--to", "layout-2", "--output", str(out), "--json",
               env={"CLEF_FORMAT_CRASH_AT": phase})
    assert proc.returncode == -signal.SIGKILL
    assert main(["migrate", str(out), "--current", "--json"]) == 0
    current = json.loads(capsys.readouterr().out)
    resume = f"clef-format migrate {src} --to layout-2 --output {out} resumes it"
    assert resume in current["message"], current
    assert main(["migrate", str(src), "--to", "layout-2", "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[1] == f"  layout   layout-1 (unchanged); the result in {out} is layout-2", text
    assert "already at" not in text and f"--output {out} holds the layout-2 result; {src} was only read" in text
    assert siblings(out) == [] and verified(out)[:2] == ("layout-2", True) and verified(src)[0] == "layout-1"


@pytest.mark.parametrize("phase,n", [("stage", 2), ("swap", 2)])
def test_sigkill_sharded_downgrade(fresh, capsys, phase: str, n: int) -> None:
    root = fresh("layout-1", shards=3)
    _rerun(capsys, str(root))
    digests = backbone_digests(root)
    proc = cli("migrate", str(root), "--to", "layout-1", "--json", env={"CLEF_FORMAT_CRASH_AT": f"{phase}:{n}"})
    assert proc.returncode == -signal.SIGKILL
    layout, ok, errors = verified(root)
    assert ok and layout in ("layout-1", "layout-2"), errors
    assert backbone_digests(root) == digests
    out = _rerun(capsys, str(root), "--to", "layout-1")
    assert out["layout"] == "layout-1" and backbone_digests(root) == digests and siblings(root) == []


def test_abort_rolls_back_an_interrupted_run(fresh, capsys) -> None:
    root = fresh("layout-1")
    digests, tables = backbone_digests(root), table_bytes(root)
    proc = cli("migrate", str(root), "--json", env={"CLEF_FORMAT_CRASH_AT": "stage:2"})
    assert proc.returncode == -signal.SIGKILL
    rc = main(["migrate", str(root), "--current", "--json"])
    assert rc == 0 and "staging" in json.loads(capsys.readouterr().out)["pending"]
    out = _rerun(capsys, str(root), "--abort")
    assert "rolled back" in out["message"] and out["layout"] == "layout-1"
    assert table_bytes(root) == tables and backbone_digests(root) == digests and siblings(root) == []


def _tree_state(root: Path) -> list[tuple[str, int, int]]:
    """Every path beside and under the checkpoint with its inode and size: what a dry run must not change."""
    out = []
    for p in sorted(root.parent.rglob("*")):
        st = p.lstat()
        out.append((str(p.relative_to(root.parent)), st.st_ino, st.st_size))
    return out


ABORT_POINTS = [*POINTS, ("cleanup", 1), ("cleanup", 3)]


@pytest.mark.parametrize("phase,n", ABORT_POINTS, ids=[f"{p}:{n}" for p, n in ABORT_POINTS])
def test_sigkill_then_abort_restores_the_original(fresh, capsys, phase: str, n: int) -> None:
    """--abort after a kill at any point gives back the original tree, byte for byte, wherever it
    still exists (before the swap, and after it until cleanup starts removing it); once cleanup has
    begun it finishes the migration and says it could not roll back. --abort --dry-run says which,
    and changes nothing."""
    root = fresh("layout-1")
    digests, tables = backbone_digests(root), table_bytes(root)
    proc = cli("migrate", str(root), "--json", env={"CLEF_FORMAT_CRASH_AT": f"{phase}:{n}"})
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    ws = root.parent / f".{root.name}.clef-migrate"
    # the original is gone only once cleanup has removed it: neither at PATH nor parked in the workspace
    parked = (ws / "new").is_dir() or (ws / "old").is_dir()
    gone = verified(root)[0] == "layout-2" and not (parked and (ws / "journal.json").exists())
    before = _tree_state(root)
    dry = _rerun(capsys, str(root), "--abort", "--dry-run")
    assert _tree_state(root) == before, "--abort --dry-run changed the files"
    out = _rerun(capsys, str(root), "--abort")
    assert siblings(root) == []
    assert backbone_digests(root) == digests
    if gone:
        assert out["layout"] == "layout-2"
    else:
        assert out["layout"] == "layout-1" and table_bytes(root) == tables, out
    if siblings_before := [p for p, _, _ in before if ".clef-migrate" in p and not p.endswith(".lock")]:
        assert dry["message"].startswith("--abort would do this:"), (siblings_before[:3], dry["message"])
        assert dry["message"].removeprefix("--abort would do this: ") == out["message"]


@pytest.mark.parametrize("phase,n", [("swap", 2), ("cleanup", 1), ("stage", 2)])
def test_abort_of_an_output_run_leaves_things_as_before(fresh, capsys, tmp_path: Path, phase: str, n: int) -> None:
    """An interrupted ``--output OUT`` run into a new folder, aborted: OUT is gone again (it did not
    exist), the source untouched, nothing left beside OUT."""
    root = fresh("layout-1")
    digests, tables = backbone_digests(root), table_bytes(root)
    out_dir = tmp_path / "out"
    proc = cli("migrate", str(root), "--output", str(out_dir), "--json", env={"CLEF_FORMAT_CRASH_AT": f"{phase}:{n}"})
    assert proc.returncode == -signal.SIGKILL
    out = _rerun(capsys, str(root), "--output", str(out_dir), "--abort")
    assert "rolled back" in out["message"], out["message"]
    assert not out_dir.exists() and siblings(out_dir) == []
    assert table_bytes(root) == tables and backbone_digests(root) == digests


@pytest.mark.parametrize("phase,n", ABORT_POINTS, ids=[f"{p}:{n}" for p, n in ABORT_POINTS])
def test_an_output_run_is_found_by_its_output_path(fresh, capsys, tmp_path: Path, phase: str, n: int) -> None:
    """An interrupted ``--output OUT`` run into a new folder, killed at each point: OUT need not exist, its
    workspace and lock lie beside it. ``migrate OUT --current`` reports the run, ``migrate SRC --current``
    points at it, a plain ``migrate OUT`` says what to run, ``migrate OUT --abort --dry-run`` changes
    nothing and says what ``--abort`` does, ``migrate OUT --abort`` rolls it back: OUT is gone again unless
    the run had finished (then it is the verified layout-2 result), nothing is left beside OUT, and the
    source is byte for byte what it was."""
    root = fresh("layout-1")
    before_src = file_digests(root)
    out_dir = tmp_path / "out"
    proc = cli("migrate", str(root), "--output", str(out_dir), "--json", env={"CLEF_FORMAT_CRASH_AT": f"{phase}:{n}"})
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    assert siblings(out_dir), "the kill left neither workspace nor lock"
    ws = tmp_path / ".out.clef-migrate"
    journal = json.loads((ws / "journal.json").read_text()) if (ws / "journal.json").is_file() else None
    had_workspace = ws.exists()

    current = _rerun(capsys, str(out_dir), "--current")
    if journal is not None:
        assert journal["phase"] in current["pending"], current
    if not out_dir.exists():
        assert current["layout"] is None and "does not exist" in current["message"], current
        assert "--abort" in current["message"] and (journal is None or str(root) in current["message"])
        rc = main(["migrate", str(out_dir), "--json"])
        plain = json.loads(capsys.readouterr().out)
        assert rc == 2 and plain["findings"][0]["code"] == "path-not-found"
        assert f"clef-format migrate {out_dir} --abort" in plain["findings"][0]["fix"], plain
    src_current = _rerun(capsys, str(root), "--current")
    if journal is not None:
        assert src_current["pending_outputs"] == [str(out_dir)] and str(out_dir) in src_current["message"]
    else:
        assert "pending_outputs" not in src_current

    state = _tree_state(root)
    dry = _rerun(capsys, str(out_dir), "--abort", "--dry-run")
    assert _tree_state(root) == state, "--abort --dry-run changed the files"
    out = _rerun(capsys, str(out_dir), "--abort")
    assert siblings(out_dir) == [] and file_digests(root) == before_src
    if out_dir.exists():  # the kill came after the cleanup had removed the journal: the run was complete
        assert journal is None and verified(out_dir)[:2] == ("layout-2", True)
    else:
        assert out["layout"] is None
    if had_workspace:
        assert dry["message"] == f"--abort would do this: {out['message']}", (dry["message"], out["message"])


def test_an_in_place_run_killed_between_the_fallback_renames_is_found_by_its_path(fresh, capsys) -> None:
    """Where the filesystem cannot exchange, the swap is two renames (T -> workspace/old, workspace/new -> T):
    killed between them, T does not exist. ``migrate T --current`` and a plain ``migrate T`` say that
    ``--abort`` puts the original back, and it does, byte for byte. (The state is the one apply leaves
    there, made by hand: the fallback is not reachable on a filesystem that exchanges.)"""
    from clef_format.migrate.workspace import JOURNAL_VERSION

    root = fresh("layout-1")
    before = file_digests(root)
    ws = root.parent / f".{root.name}.clef-migrate"
    ws.mkdir()
    shutil.copytree(root, ws / "new")
    root.rename(ws / "old")
    (ws / "journal.json").write_text(json.dumps({
        "version": JOURNAL_VERSION, "revision": "0001_int8_tables", "direction": "upgrade", "from": "layout-1",
        "to": "layout-2", "source": str(root), "target": str(root), "in_place": True, "phase": "staged",
        "fingerprint": {}, "done": {}, "quality": {}}))
    current = _rerun(capsys, str(root), "--current")
    assert "staged" in current["pending"] and f"clef-format migrate {root} --abort puts the original" in \
        current["message"]
    rc = main(["migrate", str(root), "--json"])
    plain = json.loads(capsys.readouterr().out)
    assert rc == 2 and "--abort puts the original tree back" in plain["findings"][0]["fix"], plain
    out = _rerun(capsys, str(root), "--abort")
    assert out["layout"] == "layout-1" and file_digests(root) == before and siblings(root) == [], out
