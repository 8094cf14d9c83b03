"""An iterative, depth-limited folder walk: ``os.walk`` recurses (a folder nested ~1,000 deep raises
``RecursionError`` on Python 3.11), and a checkpoint is hostile input, so its tree is walked with an
explicit stack and a limit on depth that the caller turns into a finding."""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Callable, Iterator

#: Deepest folder (levels below the root) whose content is listed. Real checkpoints nest a few levels.
MAX_DEPTH = 64


def walk(root: str, onerror: Callable[[OSError], None] | None = None, max_depth: int = MAX_DEPTH,
         too_deep: Callable[[str], None] | None = None) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(root, topdown=True, followlinks=False)`` without recursion, in the same order: the
    caller may prune ``dirnames`` in place. A folder below ``max_depth`` is not listed: its path goes
    to ``too_deep`` instead (once per such folder)."""
    stack: list[tuple[str, int]] = [(root, 0)]
    while stack:
        top, depth = stack.pop()
        dirnames: list[str] = []
        filenames: list[str] = []
        try:
            with os.scandir(top) as it:
                for entry in it:
                    try:
                        is_dir = entry.is_dir()
                    except OSError:
                        is_dir = False
                    (dirnames if is_dir else filenames).append(entry.name)
        except OSError as exc:
            if onerror is not None:
                onerror(exc)
            continue
        yield top, dirnames, filenames
        for name in reversed(dirnames):
            path = os.path.join(top, name)
            if os.path.islink(path):
                continue  # followlinks=False: the caller sees the link in dirnames, never its content
            if depth + 1 > max_depth:
                if too_deep is not None:
                    too_deep(path)
                continue
            stack.append((path, depth + 1))
