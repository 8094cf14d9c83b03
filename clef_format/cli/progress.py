"""Progress bars: the one implementation of ``clef_format.progress.Progress`` that draws.

Bars go to stderr and only on a terminal (logs and pipes stay clean, and rich is not even imported
there). Use as a context manager around the library call; ``add`` may be called from any thread.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable


def stderr_is_terminal() -> bool:
    """Whether rich would draw on stderr: a tty, or rich's own overrides (``TTY_COMPATIBLE``, ``FORCE_COLOR``)."""
    forced = os.environ.get("TTY_COMPATIBLE")
    if forced in ("0", "1"):
        return forced == "1"
    return sys.stderr.isatty() or bool(os.environ.get("FORCE_COLOR"))


def _ignore(n: int) -> None:
    return None


class TerminalProgress:
    """Byte progress bars on stderr while the ``with`` block runs."""

    def __init__(self) -> None:
        self._rich: Any = None

    def __enter__(self) -> TerminalProgress:
        if stderr_is_terminal():
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            console = Console(stderr=True)
            self._rich = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                  TransferSpeedColumn(), TimeRemainingColumn(), console=console, transient=True,
                                  disable=not console.is_terminal)
            self._rich.start()
        return self

    def add(self, description: str, total: int) -> Callable[[int], None]:
        if self._rich is None:
            return _ignore
        rich, task = self._rich, self._rich.add_task(description, total=total)
        return lambda n: rich.advance(task, n)

    def __exit__(self, *exc: object) -> None:
        if self._rich is not None:
            self._rich.stop()
            self._rich = None
