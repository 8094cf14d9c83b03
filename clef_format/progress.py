"""How long work reports progress: the library calls back, only the CLI draws (``cli/progress.py``).

    advance = progress.add("hashing 12 file(s)", total_bytes)    # unit="B" (bytes) unless given
    advance(n)          # from any thread, n units done

Standard library only; ``NO_PROGRESS`` is the default everywhere.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Protocol

    class Progress(Protocol):
        def add(self, description: str, total: int, unit: str = "B") -> Callable[[int], None]: ...
else:
    Progress = object


class NoProgress:
    """Reports nowhere."""

    def add(self, description: str, total: int, unit: str = "B") -> "Callable[[int], None]":
        return _ignore


def _ignore(n: int) -> None:
    return None


NO_PROGRESS = NoProgress()
