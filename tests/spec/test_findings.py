"""Findings (spec/findings.py): the constructors keep where a finding points, and refuse unknown codes."""

from __future__ import annotations

import pytest

from clef_format.spec.findings import CODES, Finding, error, info, warning


@pytest.mark.parametrize("make, severity", [(error, "error"), (warning, "warning"), (info, "info")])
def test_each_constructor_keeps_its_severity_and_where(make, severity: str) -> None:
    f = make("deep-verified", "every hash matched", file="model.safetensors", tensor="t", module="m", fix="none")
    assert f.to_dict() == {"code": "deep-verified", "severity": severity, "message": "every hash matched",
                           "file": "model.safetensors", "tensor": "t", "module": "m", "fix": "none"}
    assert make("deep-verified", "m").to_dict() == {"code": "deep-verified", "severity": severity, "message": "m"}


def test_unknown_codes_and_severities_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown finding code 'no-such-code'"):
        error("no-such-code", "m")
    with pytest.raises(ValueError, match="unknown severity 'fatal'"):
        Finding("missing-file", "fatal", "m")
    assert "missing-file" in CODES
