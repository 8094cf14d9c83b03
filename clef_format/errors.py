"""The exceptions clef-format raises to its callers: one family, caught by type.

    ClefError
    +-- CouldNotRun          the command could not run: exit 2 (usage, path, permissions, interrupt)
    |   +-- UsageError       bad arguments
    |   +-- PathNotFound     neither a directory nor a repo id in the local Hugging Face cache
    +-- Refused              the operation was refused, nothing changed: exit 1 (``code`` is a finding code)
    |   +-- MigrateRefused   migrate would not start (or go on): ``migrate-refused``
    |   |   +-- StepRefused  a migration step cannot run on this checkpoint
    |   +-- IncompatibleError  a (checkpoint, plugin version) pair that must not be served
    +-- FormatError          a file or config is not what the format says (readers turn it into findings)
        +-- NonFiniteRows    a table row holds NaN or Inf: quantizing it would hide that

Parsers define their own ``FormatError`` subclasses next to the rule they enforce (``HeaderError``,
``ConfigError``, ``MarkerError``, ``HeadConfigError``, ``QuantConfigError``). Standard library only.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Sequence

    from clef_format.spec.findings import Finding


class ClefError(Exception):
    """Base of every exception clef-format raises on purpose."""


class CouldNotRun(ClefError):
    """Bad usage, or a path that is missing, unreadable or unlistable, or an interrupt: exit 2.

    ``code`` is the finding code the CLI reports it under (``usage-error``, ``path-not-found``,
    ``unreadable``, ``unwritable``, ``interrupted``), ``fix`` what to do about it.
    """

    default_code = "unreadable"

    def __init__(self, message: str, code: str | None = None, fix: str | None = None) -> None:
        super().__init__(message)
        self.code = code or self.default_code
        self.fix = fix


class UsageError(CouldNotRun):
    """The arguments do not make a valid command."""

    default_code = "usage-error"


class PathNotFound(CouldNotRun, FileNotFoundError):
    """PATH is neither a directory nor a repo id present in the local cache."""

    default_code = "path-not-found"


class Refused(ClefError):
    """The operation must not start (or go on); nothing was changed. ``code`` is a finding code."""

    def __init__(self, code: str, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.fix = code, message, fix


class MigrateRefused(Refused):
    """Migrate would not start (or go on); the checkpoint is unchanged. Always the ``migrate-refused``
    code: the message says why, the fix what to do."""

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__("migrate-refused", message, fix)


class StepRefused(MigrateRefused):
    """A migration step cannot run on this checkpoint; the message says why and what to do instead."""


class IncompatibleError(Refused, RuntimeError):
    """A (checkpoint, plugin version) pair that must not be served: ``code``, ``reason`` and ``fix``."""

    def __init__(self, code: str, reason: str, fix: str, findings: Sequence[Finding] = ()) -> None:
        super().__init__(code, reason, fix)
        self.args = (f"[{code}] {reason}\n  fix: {fix}",)
        self.reason = reason
        #: every error finding behind the refusal (``check_checkpoint``); empty for ``check_pair``
        self.findings = tuple(findings)

    def __str__(self) -> str:
        return str(self.args[0])


class FormatError(ClefError, ValueError):
    """A file or config is not what its format says."""


class NonFiniteRows(FormatError):
    """The source table has NaN or infinite values; quantizing it would hide that."""

    def __init__(self, rows: list[int]) -> None:
        super().__init__(f"{len(rows)} row(s) hold NaN or Inf, first: {rows[:5]}")
        self.rows = rows
