"""How a command ends: the exit status of a report (the contract), and the one place JSON is printed."""

from __future__ import annotations

import json
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

    from clef_format.errors import CouldNotRun
    from clef_format.report import Report


EXIT_OK, EXIT_FINDINGS, EXIT_COULD_NOT_RUN = 0, 1, 2


def exit_status(report: Report) -> int:
    """The contract: 2 when the command could not run, 1 when it found errors or refused, else 0."""
    if report.could_not_run:
        return EXIT_COULD_NOT_RUN
    return EXIT_OK if report.ok else EXIT_FINDINGS


def stop_interrupts() -> None:
    """From here on the command only prints its outcome: a Ctrl-C now must not add a second one."""
    if TYPE_CHECKING:
        import signal
    else:  # (signal.py builds enums at import: not needed to ignore one signal)
        import _signal as signal

    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # called from another thread: handlers belong to the main thread
        pass


class StreamUnwritable(Exception):
    """stdout or stderr cannot take the outcome (full disk, closed, EIO): the contract's ``unwritable``.

    Not a ``CouldNotRun``: the outcome is known, only printing it failed; ``cli.main`` decides what
    can still be said (a one-line message on the other stream, or nothing)."""

    def __init__(self, stream: str, reason: str, before_work: bool = False) -> None:
        super().__init__(f"cannot write to {stream}: {reason}")
        self.stream = stream
        self.before_work = before_work  # refused up front (require_stdout): the command changed nothing


def write(text: str, stream: str = "stdout") -> None:
    """Write ``text`` to ``sys.<stream>`` and flush it now, so that a failure is seen here, not at exit.

    A reader that left (``BrokenPipeError``) is passed on as such: ``| head -1`` is not an error.
    """
    fh = getattr(sys, stream)
    if fh is None:  # the descriptor was closed when Python started
        raise StreamUnwritable(stream, "it is closed")
    try:
        fh.write(text)
        fh.flush()
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as exc:  # ValueError: a file object closed under us
        raise StreamUnwritable(stream, getattr(exc, "strerror", None) or str(exc)) from None


def require_stdout(command: str) -> None:
    """A command that writes (migrate, manifest, example) reports what it did on stdout: when stdout is
    closed (``>&-``) or open for reading only, that report could never be printed, so the command is
    refused before it changes anything (``StreamUnwritable``: the contract's ``unwritable``, exit 2),
    never after it wrote. A stdout that fails only when written (a full disk) is found when printing."""
    fh = sys.stdout
    reason = None
    if fh is None:  # the descriptor was closed when Python started
        reason = "it is closed"
    else:
        try:
            fd = fh.fileno()
        except (AttributeError, OSError, ValueError):  # not a real file (a caller's in-process capture)
            return
        import fcntl

        try:
            mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
        except OSError:
            reason = "it is closed"
        else:
            if mode == os.O_RDONLY:
                reason = "it is open for reading only"
    if reason is not None:
        raise StreamUnwritable("stdout", f"{reason}; {command} reports what it did there, so it was refused before "
                                         "changing anything (give it a stdout, e.g. >/dev/null)", before_work=True)


def one_cause(report: Report) -> Report:
    """The contract: an exit-2 report carries exactly one finding with its could-not-run code. Several
    (two unreadable files) become one, whose message names each and whose fix gathers theirs."""
    from clef_format.spec.findings import COULD_NOT_RUN, Finding

    causes = [f for f in report.findings if f.code in COULD_NOT_RUN]
    if len(causes) < 2:
        return report
    from clef_format.report import make_report

    fixes = list(dict.fromkeys(f.fix for f in causes if f.fix))
    merged = Finding(causes[0].code, "error", f"{len(causes)} problems: " + "; ".join(f.message for f in causes),
                     fix="; ".join(fixes) or None)
    rest = [f for f in report.findings if f.code not in COULD_NOT_RUN]
    from clef_format.report import Keys

    details = report.details  # the cause's own ``error`` key goes: the merged finding gives it
    if isinstance(details, Keys):
        details = Keys({k: v for k, v in details.values.items() if k != "error"})
    return make_report(report.command, report.path, report.layout, [merged, *rest], details, report.capped)


def finish(report: Report, as_json: bool, human: Callable[[Report], str]) -> int:
    """Print the report (one JSON object, or ``human(report)`` as text) and return the exit status."""
    stop_interrupts()
    report = one_cause(report)
    if as_json:
        emit_json(report.to_dict())
    else:
        write(human(report) + "\n")
    return exit_status(report)


def emit_json(payload: dict[str, Any]) -> None:
    """Exactly one JSON object on stdout."""
    write(json.dumps(payload, indent=2) + "\n")


def could_not_run_report(command: str | None, path: str | None, exc: CouldNotRun) -> Report:
    """The report of a command that could not run: one error finding with the cause's code and fix."""
    from clef_format.report import make_report
    from clef_format.spec.findings import error

    finding = error(exc.code, str(exc), fix=exc.fix)
    return make_report(command or "clef-format", path, None, [finding], {"error": str(exc)})
