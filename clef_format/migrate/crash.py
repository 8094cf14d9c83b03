"""Crash injection: ``CLEF_FORMAT_CRASH_AT=<phase>:<n>`` SIGKILLs the process at the n-th crash point
of a phase (``CRASH_PHASES``; ``:INT`` sends SIGINT instead, what Ctrl-C does). The SIGKILL, Ctrl-C and
errno suites use it to stop a run at every point where the disk state changes; any other value is a
usage error (``check_crash_env``), never silently ignored.

The same points serve the in-process suite of the world changing under a run (``adversary``): a
callback runs at each of them and changes the real source or target, as another program would.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from clef_format.errors import UsageError

CRASH_ENV = "CLEF_FORMAT_CRASH_AT"
#: Every phase with crash points, in the order a run meets them (docs/MIGRATION.md lists them).
CRASH_PHASES = ("lock", "journal", "stage", "verify", "swap", "cleanup")
_crash_counts: dict[str, int] = {}
_crash_lock = threading.Lock()


_adversary: Callable[[str, int], None] | None = None
_adversary_counts: dict[str, int] = {}


@contextmanager
def adversary(fn: Callable[[str, int], None]) -> Iterator[None]:
    """Run ``fn(phase, n)`` at the n-th crash point of each phase while the block runs (in this
    process, in the thread that reaches the point): the tests' stand-in for another program."""
    global _adversary
    with _crash_lock:
        _adversary_counts.clear()
        _adversary = fn
    try:
        yield
    finally:
        with _crash_lock:
            _adversary = None


def crashpoint(phase: str) -> None:
    """Signal this process at the n-th crash point of ``phase`` when CLEF_FORMAT_CRASH_AT says so:
    ``<phase>:<n>`` sends SIGKILL, ``<phase>:<n>:INT`` SIGINT (what Ctrl-C at a shell does, also in a process
    started with SIGINT ignored or blocked). Run the
    ``adversary`` there first, when one is set."""
    hook = _adversary
    if hook is not None:
        with _crash_lock:
            _adversary_counts[phase] = _adversary_counts.get(phase, 0) + 1
            count = _adversary_counts[phase]
        hook(phase, count)
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    want, _, rest = spec.partition(":")
    if want != phase:
        return
    n, _, sig = rest.partition(":")
    with _crash_lock:
        _crash_counts[phase] = _crash_counts.get(phase, 0) + 1
        hit = _crash_counts[phase] == int(n or 1)
    if hit and sig == "INT":
        # what Ctrl-C does, here and now: a SIGINT blocked in the mask this process inherited (a parent's
        # thread that held it back while spawning) would stay pending and the run would finish unstopped
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL):
            try:  # started in the background (make under a non-interactive shell): SIGINT ignored since exec;
                signal.signal(signal.SIGINT, signal.default_int_handler)  # a Ctrl-C at a shell is what this is
            except ValueError:  # not the main thread: only the main thread sets handlers
                pass
        signal.raise_signal(signal.SIGINT)  # to this thread, its handler run before it returns
    elif hit:
        os.kill(os.getpid(), signal.SIGKILL)


def check_crash_env() -> None:
    """A ``CLEF_FORMAT_CRASH_AT`` that names no crash point is a usage error, never silently ignored:
    ``<phase>[:<n>[:INT]]``, phase one of ``CRASH_PHASES``, n a positive integer (default 1)."""
    spec = os.environ.get(CRASH_ENV)
    if not spec:
        return
    phase, _, rest = spec.partition(":")
    n, _, sig = rest.partition(":")
    count_ok = n == "" or (n.isascii() and n.isdigit() and int(n) >= 1)
    if phase not in CRASH_PHASES or not count_ok or sig not in ("", "INT"):
        raise UsageError(f"{CRASH_ENV}={spec!r} names no crash point: it takes <phase>[:<n>[:INT]], phase one of "
                         f"{', '.join(CRASH_PHASES)}, n a positive integer",
                         fix=f"unset {CRASH_ENV} (it is for the crash-injection tests), or set e.g. {CRASH_ENV}=stage:2")
