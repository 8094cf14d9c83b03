"""Progress bars: the one implementation of ``clef_format.progress.Progress`` that draws.

Bars go to stderr and only on a terminal (logs and pipes stay clean, and tqdm is not even imported
there); they are removed when the work ends. ``TTY_COMPATIBLE=1`` (or ``FORCE_COLOR``) draws on a
stderr that is not a terminal, ``TTY_COMPATIBLE=0`` never draws. Use as a context manager around
the library call; ``add`` and the advance functions may be called from any thread.

tqdm rather than rich: huggingface_hub already installs tqdm, while rich and pygments would add
about 14 MB to a plain install for bars alone (benchmarks/RESULTS.md, "Light install").
"""

from __future__ import annotations

import os
import sys
import threading

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable


def stderr_is_terminal() -> bool:
    """Whether bars are drawn on stderr: a tty, or the overrides ``TTY_COMPATIBLE`` and ``FORCE_COLOR``."""
    forced = os.environ.get("TTY_COMPATIBLE")
    if forced in ("0", "1"):
        return forced == "1"
    if sys.stderr is None:  # closed when Python started: nowhere to draw a bar
        return False
    return sys.stderr.isatty() or bool(os.environ.get("FORCE_COLOR"))


def _ignore(n: int) -> None:
    return None


class TerminalProgress:
    """Byte progress bars on stderr while the ``with`` block runs."""

    def __init__(self) -> None:
        self._tqdm: Any = None
        self._bars: list[Any] = []
        self._lock = threading.Lock()

    def __enter__(self) -> TerminalProgress:
        if stderr_is_terminal():
            from tqdm import tqdm

            self._tqdm = tqdm
        return self

    def add(self, description: str, total: int, unit: str = "B") -> Callable[[int], None]:
        if self._tqdm is None:
            return _ignore
        with self._lock:
            scaled = unit == "B"  # bytes in KiB/MiB; anything else counted as it is
            bar = self._tqdm(total=total, desc=description, unit=unit, unit_scale=scaled, unit_divisor=1024,
                             file=sys.stderr, leave=False, disable=False, dynamic_ncols=True,
                             position=len(self._bars), bar_format="{desc} {bar} {n_fmt}/{total_fmt} {rate_fmt} {remaining}")
            self._bars.append(bar)
        lock = self._lock

        def advance(n: int) -> None:
            with lock:
                bar.update(n)

        return advance

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            for bar in reversed(self._bars):
                bar.close()
            self._bars = []
        self._tqdm = None
