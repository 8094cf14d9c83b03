"""The one result every command returns: a frozen ``Report`` (command, path, layout, findings, details).

verify, migrate, layers and manifest all build one; the CLI renders it as text or as one JSON object
with the same top-level keys for every command (``command``, ``path``, ``layout``, ``ok``,
``findings``, then the command's own keys). Long operations collect into a ``ReportDraft`` and
freeze it at the end. A namedtuple, not a dataclass: it is built on the structure path of verify,
where importing ``dataclasses`` (and ``inspect``) would cost more than the whole report.
"""

from __future__ import annotations

from types import MappingProxyType

from clef_format.records import Record
from clef_format.spec.findings import COULD_NOT_RUN, Finding

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any, Iterable, Mapping

    from clef_format.spec.findings import Severity

#: The keys every command's JSON object starts with; a command's own keys follow and never clash.
ENVELOPE_KEYS = ("command", "path", "layout", "ok", "findings")


class Report(Record):
    """What one command found. ``details`` holds the command's own keys (read-only mapping)."""

    command: str
    path: str | None
    layout: str | None
    findings: tuple[Finding, ...]
    details: Mapping[str, Any]

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    @property
    def could_not_run(self) -> bool:
        """Whether a finding says the command could not do its job (unreadable input, interrupt)."""
        return any(f.code in COULD_NOT_RUN for f in self.findings)

    def codes(self) -> set[str]:
        return {f.code for f in self.findings}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"command": self.command, "path": self.path, "layout": self.layout, "ok": self.ok,
                               "findings": [f.to_dict() for f in self.findings]}
        for key, value in self.details.items():
            if key not in out:
                out[key] = value
        if self.could_not_run and "error" not in out:  # the contract: exit 2 always says why, in one line
            out["error"] = next(f.message for f in self.findings if f.code in COULD_NOT_RUN)
        return out


#: Findings kept per class (code, severity); the rest of a class is one summary finding that says how many.
MAX_FINDINGS_PER_CLASS = 20


def cap_findings(findings: Iterable[Finding]) -> tuple[list[Finding], dict[str, int]]:
    """Keep the first ``MAX_FINDINGS_PER_CLASS`` findings of each (code, severity) and replace the rest of
    a class by one finding of the same code and severity ("... and N more"), so the exit status and the
    codes are unchanged while a hostile file (a million stray tensors) costs a bounded report. Also
    returns ``{"code/severity": N}`` of what was left out. A class of exactly one more than the cap is kept
    whole (a summary would save nothing), which makes capping a capped list change nothing."""
    findings = list(findings)
    counts: dict[tuple[str, Severity], int] = {}
    for f in findings:
        key = (f.code, f.severity)
        counts[key] = counts.get(key, 0) + 1
    over = {key for key, n in counts.items() if n > MAX_FINDINGS_PER_CLASS + 1}
    if not over:
        return findings, {}
    kept: list[Finding] = []
    seen: dict[tuple[str, Severity], int] = {}
    for f in findings:
        key = (f.code, f.severity)
        if key in over:
            seen[key] = seen.get(key, 0) + 1
            if seen[key] > MAX_FINDINGS_PER_CLASS:
                continue
        kept.append(f)
    capped: dict[str, int] = {}
    for code, severity in sorted(over):
        more = counts[(code, severity)] - MAX_FINDINGS_PER_CLASS
        capped[f"{code}/{severity}"] = more
        kept.append(Finding(code, severity, f"... and {more} more {code} {severity}s like the "
                            f"{MAX_FINDINGS_PER_CLASS} above (left out of this report)",
                            fix="fix the ones listed and run again to see the rest"))
    return kept, capped


def make_report(command: str, path: str | None, layout: str | None = None, findings: Iterable[Finding] = (),
                details: Mapping[str, Any] | None = None) -> Report:
    """A frozen report (``details`` is copied, then exposed read-only). Findings are capped per class
    (``cap_findings``); what was left out is counted in the ``capped`` detail."""
    kept, capped = cap_findings(findings)
    details = dict(details or {})
    if capped:
        details["capped"] = {**details.get("capped", {}), **capped}
    return Report(command, path, layout, tuple(kept), MappingProxyType(details))


class ReportDraft:
    """A report under construction (migrate adds steps as it goes); ``freeze`` makes the result."""

    def __init__(self, path: str | None, layout: str | None) -> None:
        self.path = path
        self.layout = layout
        self.findings: list[Finding] = []
        self.extra: dict[str, Any] = {}

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def extend(self, findings: Iterable[Finding]) -> None:
        self.findings.extend(findings)

    def freeze(self, command: str) -> Report:
        return make_report(command, self.path, self.layout, self.findings, self.extra)
