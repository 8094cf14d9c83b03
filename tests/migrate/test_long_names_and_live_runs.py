"""Two messages that described something that was not there (issue 24, "Messages").

* A checkpoint folder named near the filesystem's 255-byte limit leaves no room for migrate's
  workspace and lock names beside it (``.NAME.clef-migrate.lock``): the fix told the user to move
  away a lock file that does not exist. It now says the name is too long and by how much to shorten it;
  ``manifest`` (which takes the same lock) writes, since no migrate can run there.
* ``--current`` while a migrate runs called the run interrupted and offered ``--abort``: it now says a
  run is going on (its pid) and to wait.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clef_format.migrate import crash
from clef_format.migrate.session import Options, migrate_path
from tests.support.migrate import file_digests, run_json, siblings, verified


def _long_named(fresh, length: int) -> Path:
    root = fresh("layout-1")
    longer = root.parent / ("c" * length)
    os.rename(root, longer)
    return longer


@pytest.mark.parametrize("extra", [[], ["--dry-run"]], ids=["run", "dry-run"])
def test_a_folder_name_with_no_room_for_the_lock_says_so(fresh, capsys, extra: list[str]) -> None:
    root = _long_named(fresh, 250)
    before = file_digests(root)
    rc, out = run_json(capsys, str(root), "--to", "layout-2", *extra)
    errors = [f for f in out["findings"] if f["severity"] == "error"]
    assert rc == 1 and [f["code"] for f in errors] == ["migrate-refused"], out
    assert "the checkpoint's folder name is 250 bytes long" in errors[0]["message"], errors
    assert "limit of 255 bytes per name" in errors[0]["message"]
    assert errors[0]["fix"] == "rename the folder to a name of at most 236 bytes, then run migrate again"
    assert "lock" not in errors[0]["fix"] and file_digests(root) == before and siblings(root) == []


def test_the_longest_name_that_fits_migrates(fresh, capsys) -> None:
    root = _long_named(fresh, 236)
    rc, out = run_json(capsys, str(root), "--to", "layout-2")
    assert rc == 0 and verified(root)[:2] == ("layout-2", True), out


def test_an_output_name_with_no_room_for_the_lock_says_so(fresh, capsys, tmp_path: Path) -> None:
    root = fresh("layout-1")
    out_dir = tmp_path / ("o" * 240)
    rc, out = run_json(capsys, str(root), "--to", "layout-2", "--output", str(out_dir))
    errors = [f for f in out["findings"] if f["severity"] == "error"]
    assert rc == 1 and [f["code"] for f in errors] == ["migrate-refused"], out
    assert "the --output name is 240 bytes long" in errors[0]["message"]
    assert errors[0]["fix"] == "pick an --output whose name is at most 236 bytes" and not out_dir.exists()


def test_manifest_writes_in_a_folder_whose_name_leaves_no_room_for_the_lock(fresh) -> None:
    from clef_format.migrate.manifest_writer import make_manifest

    root = _long_named(fresh, 250)
    report = make_manifest(str(root))
    assert report.ok and (root / "clef_manifest.json").is_file(), report.findings


@pytest.mark.parametrize("where", ["in-place", "output"])
def test_current_during_a_live_run_says_it_runs_and_offers_no_abort(fresh, capsys, tmp_path: Path, where: str) -> None:
    root = fresh("layout-1")
    out_dir = tmp_path / "out"
    asked = root if where == "in-place" else out_dir
    extra = [] if where == "in-place" else ["--output", str(out_dir)]
    seen = []

    def act(phase: str, n: int) -> None:
        if (phase, n) in (("lock", 1), ("stage", 1), ("swap", 1)):
            seen.append((phase, migrate_path(str(asked), Options(current=True))))

    with crash.adversary(act):
        rc, out = run_json(capsys, str(root), "--to", "layout-2", *extra)
    assert rc == 0, out
    assert [p for p, _ in seen] == ["lock", "stage", "swap"]
    for phase, report in seen:
        message = report.details.message
        assert f"a clef-format migrate (pid {os.getpid()}) is running on {asked} now" in message, (phase, message)
        assert "--abort" not in message and "interrupted" not in message, (phase, message)
        assert "wait for it to finish" in message
        assert report.details.pending is None, (phase, report.details.pending)  # running, not "interrupted ... pending"
    after = migrate_path(str(root if where == "in-place" else out_dir), Options(current=True))
    assert after.details.message is None and after.layout == "layout-2"
