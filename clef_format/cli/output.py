"""How a command ends: the exit status of a report (the contract), and the one place JSON is printed."""

from __future__ import annotations

import json
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
    import signal

    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # called from another thread: handlers belong to the main thread
        pass


def finish(report: Report, as_json: bool, human: Callable[[Report], str]) -> int:
    """Print the report (one JSON object, or ``human(report)`` as text) and return the exit status."""
    stop_interrupts()
    if as_json:
        emit_json(report.to_dict())
    else:
        print(human(report))
    return exit_status(report)


def emit_json(payload: dict[str, Any]) -> None:
    """Exactly one JSON object on stdout."""
    sys.stdout.write(json.dumps(payload, indent=2) + "\n")


def could_not_run_report(command: str | None, path: str | None, exc: CouldNotRun) -> Report:
    """The report of a command that could not run: one error finding with the cause's code and fix."""
    from clef_format.report import make_report
    from clef_format.spec.findings import error

    finding = error(exc.code, str(exc), fix=exc.fix)
    return make_report(command or "clef-format", path, None, [finding], {"error": str(exc)})
