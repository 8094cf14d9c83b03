"""What `migrate --dry-run` and `migrate --history` show of each migration step, checked against the
step modules' own attributes and the checkpoint's real files (sizes from the filesystem, not from the
reader): the plan a user approves before anything is written must name the step, its direction, the
layouts, every file read with its size, and the step's note; the history must carry every field of
every step under its documented key.

Written for the survivors of the unsampled mutmut run (docs/TESTING.md): the marker repair's plan
fields (revision, direction, layouts, read sizes, note) and every key of the history survived, since
no test looked at them. Run in-process (``main``) so that mutmut's record sees them.
"""

from __future__ import annotations

import importlib
import json
import os

import pytest

from clef_format.cli.main import main
from clef_format.spec import layouts as L

STEPS = [importlib.import_module(f"clef_format.migrations.{name}")
         for name in ("v0001_int8_tables", "v0002_repair_marker")]


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    rc = main([*argv, "--json"])
    return rc, json.loads(capsys.readouterr().out)


def _text(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = main(list(argv))
    return rc, capsys.readouterr().out


def test_history_carries_every_field_of_every_step_under_its_key(capsys: pytest.CaptureFixture[str]) -> None:
    rc, payload = _json(capsys, "migrate", "--history")
    assert rc == 0
    expected = [{"revision": s.revision, "down_revision": s.down_revision, "from": s.from_layout, "to": s.to_layout,
                 "reversible": not getattr(s, "repair", False), "description": s.description} for s in STEPS]
    assert payload["history"] == expected


def test_history_text_names_every_step(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out = _text(capsys, "migrate", "--history")
    assert rc == 0
    for s in STEPS:
        assert s.revision in out and s.description in out


@pytest.mark.parametrize("json_output", [True, False], ids=["json", "text"])
def test_marker_repair_plan_names_the_step_the_files_and_the_note(built, capsys: pytest.CaptureFixture[str],
                                                                   json_output: bool) -> None:
    """layout-2-unmarked -> layout-2: the dry run shows step 0002 as an upgrade, reading the head config
    and the tables (their real sizes), writing only the head config, with the step's note."""
    root = built("layout-2-unmarked")
    step = STEPS[1]
    sizes = {rel: os.path.getsize(root / rel) for rel in (L.HEAD_CONFIG, L.TABLES)}
    assert all(sizes.values())
    argv = ("migrate", str(root), "--to", "layout-2", "--dry-run")
    if json_output:
        rc, payload = _json(capsys, *argv)
        assert rc == 0 and payload["dry_run"] is True
        (only,) = payload["steps"]
        plan = only["plan"]
        assert (plan["revision"], plan["direction"], plan["from"], plan["to"]) == (
            step.revision, "upgrade", step.from_layout, step.to_layout)
        assert plan["read"] == sizes and plan["bytes_read"] == sum(sizes.values())
        assert list(plan["written"]) == [L.HEAD_CONFIG]
        assert plan["notes"] == [
            "writes only the marker; the int8 tables are checked in full first and kept as they are"]
    else:
        rc, out = _text(capsys, *argv)
        assert rc == 0
        assert f"step {step.revision} (upgrade): {step.from_layout} -> {step.to_layout}" in out
        for rel in sizes:
            assert f"read     {rel}" in out
        assert "note     writes only the marker; the int8 tables are checked in full first" in out


def test_layout1_plan_names_the_int8_step_as_an_upgrade(built, capsys: pytest.CaptureFixture[str]) -> None:
    rc, payload = _json(capsys, "migrate", str(built("layout-1")), "--to", "layout-2", "--dry-run")
    assert rc == 0
    (only,) = payload["steps"]
    plan = only["plan"]
    step = STEPS[0]
    assert (plan["revision"], plan["direction"], plan["from"], plan["to"]) == (
        step.revision, "upgrade", step.from_layout, step.to_layout)


@pytest.mark.parametrize("json_output", [True, False], ids=["json", "text"])
def test_marker_repair_without_head_config_is_refused_naming_the_file(fresh, capsys: pytest.CaptureFixture[str],
                                                                      json_output: bool) -> None:
    """A download with the int8 tables but no head config reads as layout-2-unmarked; the repair step
    refuses it, and the user is told which file is missing (not a bare refusal), with verify as the fix."""
    root = fresh("layout-2-unmarked")
    (root / L.HEAD_CONFIG).unlink()
    argv = ("migrate", str(root), "--to", "layout-2", "--dry-run")
    if json_output:
        rc, payload = _json(capsys, *argv)
        assert rc == 1 and payload["layout"] == "layout-2-unmarked"
        (finding,) = payload["findings"]
        assert finding["code"] == "migrate-refused"
        assert finding["message"] == f"{L.HEAD_CONFIG} is missing or not a JSON object"
        assert finding["fix"].startswith(f"clef-format verify {root}")
    else:
        rc, out = _text(capsys, *argv)
        assert rc == 1
        assert f"{L.HEAD_CONFIG} is missing or not a JSON object" in out
    assert not (root / L.HEAD_CONFIG).exists()  # a dry run, and a refusal: nothing written
