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


def make_report(command: str, path: str | None, layout: str | None = None, findings: Iterable[Finding] = (),
                details: Mapping[str, Any] | None = None) -> Report:
    """A frozen report (``details`` is copied, then exposed read-only)."""
    return Report(command, path, layout, tuple(findings), MappingProxyType(dict(details or {})))


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
