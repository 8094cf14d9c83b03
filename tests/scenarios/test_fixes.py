"""Fixes that fix: for every finding the broken fixtures produce whose fix is a command, running the
command makes the finding go away; no fix names a command that then refuses. The same for the
--plugin-version refusals."""

from __future__ import annotations

import re

import pytest

from clef_format.cli.main import main
from tests.support.broken import BROKEN, build_broken
from clef_format.verify.run import verify
from tests.verify.test_config_rules import CASES as CONFIG_CASES
from tests.verify.test_config_rules import apply_set_fix, broken, findings_for

COMMAND = re.compile(r"clef-format (migrate) (?![A-Z]+ )(\S+) --to ([\w-]+)")  # a placeholder (COPY) is guidance


def _run_fix(fix: str, capsys) -> int:
    m = COMMAND.search(fix)
    assert m, fix
    status = main(["migrate", m.group(2), "--to", m.group(3), "--json"])
    capsys.readouterr()
    return status


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_every_command_fix_removes_its_finding(name, tmp_path, capsys):
    root = build_broken(tmp_path / "ck", name)
    report = verify(str(root))
    commands = {(f.code, f.fix) for f in report.findings if f.fix and "clef-format" in f.fix}
    for code, fix in commands:
        if not COMMAND.search(fix):
            continue  # guidance (re-download, verify --help, re-create from a layout-1 copy): not a command
        others = {f.code for f in report.findings if f.severity == "error" and f.code != code}
        status = _run_fix(fix, capsys)
        after = verify(str(root))
        if others:
            # other errors block the migration: it must refuse, and say why (never silently keep the finding)
            assert status == 1
            continue
        assert status == 0, (name, code, fix)
        assert code not in after.codes(), (name, code, fix, [f.to_dict() for f in after.findings])


@pytest.mark.parametrize("layout, version", [("layout-1", "0.2.0"), ("layout-1", "0.2.0rc1"),
                                             ("layout-2", "0.1.4"), ("layout-2", "0.1.5rc1")])
def test_plugin_version_fixes_make_the_pair_servable(fresh, capsys, layout, version):
    root = fresh(layout, "bf16", num_layers=4)
    (finding,) = [f for f in verify(str(root), plugin_version=version).findings if f.code == "plugin-incompatible"]
    assert _run_fix(finding.fix, capsys) == 0
    if version == "0.2.0rc1":  # the pre-release sorts below the >=0.2.0 marker migrate writes: the fix says so
        assert "release clef-vllm>=0.2.0" in finding.fix
        version = "0.2.0"
    assert "plugin-incompatible" not in verify(str(root), plugin_version=version).codes()


@pytest.mark.parametrize("marker", ["at least 0.2", "==0.1.4", ">=0.2,<0.2"])
def test_an_invalid_marker_fix_is_an_edit_that_works(fresh, marker):
    import json

    from clef_format.spec import layouts as L

    root = fresh("layout-2", "bf16", num_layers=4)
    cfg = json.loads((root / L.HEAD_CONFIG).read_text())
    cfg[L.MARKER_KEY] = marker
    (root / L.HEAD_CONFIG).write_text(json.dumps(cfg))
    (finding,) = [f for f in verify(str(root)).findings if f.code == "marker-invalid"]
    assert "clef-format migrate" not in finding.fix
    m = re.search(r'set "(\S+)": "(\S+)" in (\S+)', finding.fix)
    assert m and m.group(3) == L.HEAD_CONFIG
    cfg[m.group(1)] = m.group(2)
    (root / L.HEAD_CONFIG).write_text(json.dumps(cfg))
    assert verify(str(root)).ok


@pytest.mark.parametrize("case", [c for c in CONFIG_CASES if c[6]], ids=[c[0] for c in CONFIG_CASES if c[6]])
def test_every_config_edit_fix_removes_its_finding(fresh, case):
    """The config rules' fixes (``set "key": value in FILE``, tests/verify/test_config_rules.py): applying
    each fix of the broken config leaves a checkpoint that verifies OK."""
    name, build, rel, edit, code, key, _ = case
    root = broken(fresh, build, rel, edit)
    hits = findings_for(verify(str(root)), code, key)
    assert hits
    for f in hits:
        apply_set_fix(root, f.fix)
    after = verify(str(root))
    assert after.ok, [f.to_dict() for f in after.findings]
