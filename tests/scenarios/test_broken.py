"""Every broken state in fixtures.broken yields its finding codes, through the library and the CLI."""

from __future__ import annotations

import json

import pytest

from clef_format.cli.main import main
from tests.support.broken import BROKEN, build_broken
from clef_format.spec.findings import CODES
from clef_format.verify.run import verify


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_state_is_reported(name, tmp_path, capsys):
    root = build_broken(tmp_path / "ck", name)
    case = BROKEN[name]
    report = verify(str(root))
    for code in case.codes:
        assert code in report.codes(), (name, [f.to_dict() for f in report.findings])
    for f in report.findings:
        assert f.code in CODES
        if f.severity == "error":
            assert f.fix, f"{f.code} has no fix"
    status = main(["verify", str(root), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["path"] == str(root)
    assert {f["code"] for f in out["findings"]} >= set(case.codes)
    if case.codes == ("legacy-layout",):
        assert status == 0 and out["ok"] is True
    else:
        assert status == 1 and out["ok"] is False
