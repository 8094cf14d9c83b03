"""The one result every command returns: a frozen ``Report`` (command, path, layout, findings, details).

verify, migrate, layers and manifest all build one; the CLI renders it as text or as one JSON object
with the same top-level keys for every command (``command``, ``path``, ``layout``, ``ok``,
``findings``, then the command's own keys). ``details`` is the command's own typed record
(``verify.run.VerifyDetails``, ``verify.layers.LayersDetails``, ...; ``Keys`` for the few commands
whose keys are one plain value): it says which keys the command has, and ``to_dict`` writes them in
the contract's order. Long operations collect into a ``ReportDraft`` and freeze it at the end. A
namedtuple, not a dataclass: it is built on the structure path of verify, where importing
``dataclasses`` (and ``inspect``) would cost more than the whole report.
"""

from __future__ import annotations

from clef_format.records import Record
from clef_format.spec.findings import COULD_NOT_RUN, Finding

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any, Iterable, Mapping, Protocol

    from clef_format.spec.findings import Severity
else:
    Protocol = object

#: The keys every command's JSON object starts with; a command's own keys follow and never clash.
ENVELOPE_KEYS = ("command", "path", "layout", "ok", "findings")


class Details(Protocol):
    """A command's own keys, typed. ``capped_after``: the key the report's ``capped`` count follows in the
    JSON object (``None``: last), where the contract has always had it."""

    @property
    def capped_after(self) -> str | None: ...

    def to_dict(self) -> dict[str, Any]: ...


class Keys(Record):
    """The own keys of a command that has no record of its own (codes, --help, --version, --history, the
    one key of a command that could not run): a plain mapping, copied."""

    values: dict[str, Any]

    @property
    def capped_after(self) -> str | None:
        return None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.values)


class Report(Record):
    """What one command found: its findings and its own typed ``details``. ``capped``: per class
    ("code/severity") how many findings were left out (``cap_findings``), ``None`` when none was."""

    command: str
    path: str | None
    layout: str | None
    findings: tuple[Finding, ...]
    details: Details
    capped: dict[str, int] | None = None

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
        own = self.details.to_dict()
        if self.capped:
            own = _with_key(own, "capped", dict(self.capped), self.details.capped_after)
        for key, value in own.items():
            if key not in out:
                out[key] = value
        if self.could_not_run and "error" not in out:  # the contract: exit 2 always says why, in one line
            out["error"] = next(f.message for f in self.findings if f.code in COULD_NOT_RUN)
        return out


def _with_key(d: dict[str, Any], key: str, value: Any, after: str | None) -> dict[str, Any]:
    """``d`` with ``key`` inserted right after ``after`` (at the end when ``after`` is None or absent)."""
    if after is None or after not in d:
        return {**d, key: value}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out[k] = v
        if k == after:
            out[key] = value
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
                details: Details | dict[str, Any] | None = None, capped: Mapping[str, int] | None = None) -> Report:
    """A frozen report. ``details``: the command's record, or a plain dict (copied into ``Keys``).
    Findings are capped per class (``cap_findings``); what was left out is counted in ``capped``, added
    to the ``capped`` given (findings capped before: capping them again leaves nothing out)."""
    kept, left_out = cap_findings(findings)
    own = Keys(dict(details)) if isinstance(details, dict) else Keys({}) if details is None else details
    counts = {**(capped or {}), **left_out}
    return Report(command, path, layout, tuple(kept), own, counts or None)


class DetailsDraft(Protocol):
    """A command's own keys under construction; ``freeze`` makes its record."""

    def freeze(self) -> Details: ...


class ReportDraft:
    """A report under construction (migrate adds steps as it goes); ``freeze`` makes the result, with the
    command's own record frozen from ``details``."""

    def __init__(self, path: str | None, layout: str | None, details: DetailsDraft) -> None:
        self.path = path
        self.layout = layout
        self.findings: list[Finding] = []
        self.details = details

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def extend(self, findings: Iterable[Finding]) -> None:
        self.findings.extend(findings)

    def freeze(self, command: str) -> Report:
        return make_report(command, self.path, self.layout, self.findings, self.details.freeze())
