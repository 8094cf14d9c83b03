"""The ``clef-format`` command line. Exit status: 0 no error, 1 errors found or refused, 2 could not run.

Built on ``argparse`` rather than click/typer for a measured reason: ``verify`` must answer on a
9B checkpoint within 3x the time of ``python -c "import json"``, and importing click alone costs
about that whole budget (benchmarks/RESULTS.md). Each command module is imported only when run.
The commands are listed in ``clef_format.cli.commands.COMMANDS`` (name -> (module, help), as pip keeps
its ``commands_dict``), read by this module and by ``cli.parser``; each module provides
``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import gc
import os
import sys

from clef_format.cli.commands import COMMANDS, READ_ONLY
from clef_format.errors import CouldNotRun, UsageError

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    import argparse
    from typing import Sequence

def _path_arg(args_in: list[str], command: str | None, takes_value: frozenset[str] = frozenset()) -> str | None:
    """PATH as typed, for the report of a command whose arguments did not parse: the first word after
    the command that is no option and no option's value (``--output out src``: ``src``; ``takes_value``
    names the options that take one, when the parser is built)."""
    rest = args_in[args_in.index(command) + 1:] if command in args_in else []
    value_next = False  # the word is the value of the option before it
    for i, word in enumerate(rest):
        if value_next:
            value_next = False
            continue
        if word == "--":  # everything after it is positional
            return rest[i + 1] if i + 1 < len(rest) else None
        if word.startswith("-"):
            value_next = word in takes_value
            continue
        return word
    return None


def _value_options(parser: argparse.ArgumentParser, command: str | None) -> frozenset[str]:
    """The option strings of ``command`` that take a value (``--output``, not ``--json``)."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            sub = action.choices[command]
            return frozenset(s for a in sub._actions if a.nargs != 0 for s in a.option_strings)
    return frozenset()


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every outcome, usage errors and SIGINT included, is a report and an exit status."""
    args_in = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in args_in if not a.startswith("-")), None)
    command = first if first in COMMANDS else None
    as_json = any(a == "--json" or a.startswith("--json=") for a in args_in)  # --json=1 is a usage error, in JSON
    path = _path_arg(args_in, command)
    sigint = None
    parser: argparse.ArgumentParser | None = None
    parsed = False
    thresholds = gc.get_threshold()
    # Reading a 9B header builds thousands of long-lived records; at the default threshold (700) the
    # collector scans them dozens of times and frees nothing (measured: about 4% of verify; at 20,000
    # still 1.4%, callgrind). Fewer young collections, never none: a command still collects any cycles.
    gc.set_threshold(max(thresholds[0], 100_000), *thresholds[1:])
    try:  # everything past os and sys loads in here, so that a Ctrl-C while loading is reported too
        if TYPE_CHECKING:
            import signal
        else:  # signal.py's own module builds enums of every signal at import; not needed here
            import _signal as signal

        sigint = signal.getsignal(signal.SIGINT)
        from clef_format.cli.parser import build_parser

        parser = build_parser(only=command)
        import io

        shown, stdout = io.StringIO(), sys.stdout
        try:  # --help and --version print and exit inside argparse: their text is the outcome
            sys.stdout = shown  # (contextlib.redirect_stdout, without importing contextlib)
            try:
                args = parser.parse_args(args_in)
                parsed = True
            finally:
                sys.stdout = stdout
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise
            return _help_or_version(command, shown.getvalue(), as_json)
        if not args.command:
            from clef_format.cli.output import write

            write(parser.format_help(), "stderr")
            raise UsageError("no command given", fix="clef-format COMMAND ...; see clef-format --help")
        path = getattr(args, "path", path)
        if path == "":  # no PATH at all (an unset variable): never the current directory, and one code for all
            raise UsageError(f"{args.command}: PATH is empty", fix=f"clef-format {args.command} PATH ...; see "
                                                                    f"clef-format {args.command} --help")
        from clef_format.read.paths import cwd_gone

        python = getattr(args, "python", None)  # a bare name is a command on PATH, not a path
        named = [path, getattr(args, "output", None), getattr(args, "into", None),
                 python if isinstance(python, str) and "/" in python else None,
                 *(getattr(args, "roots", None) or [])]  # every path the command may resolve
        gone = cwd_gone([p for p in named if isinstance(p, str)])
        if gone is not None:
            raise gone
        from importlib import import_module

        module = import_module(f"clef_format.cli.commands.{COMMANDS[args.command][0]}")
        return int(module.run(args))
    except CouldNotRun as exc:
        if parser is not None and not parsed:  # PATH as typed: the options' values are known now
            path = _path_arg(args_in, command, _value_options(parser, command))
        return _could_not_run(command, path, exc, as_json, args_in)
    except KeyboardInterrupt:
        return _could_not_run(command, path, CouldNotRun(
            "interrupted", code="interrupted",
            fix="run the command again (an interrupted migrate resumes, or rolls back with --abort)"), as_json, args_in)
    except BrokenPipeError:  # `clef-format verify ... | head`: the reader left; not an error of ours
        _discard("stdout")
        from clef_format.cli.output import EXIT_OK

        return EXIT_OK
    except Exception as exc:  # printing the outcome failed: the contract's unwritable (exit 2)
        from clef_format.cli.output import StreamUnwritable

        if not isinstance(exc, StreamUnwritable):
            raise
        return _unwritable(exc, as_json, command)
    finally:  # printing the outcome ignores Ctrl-C (one outcome only); a caller in-process gets it back
        gc.set_threshold(*thresholds)
        if argv is None and command in READ_ONLY:
            # The console script exits next, and the interpreter's exit runs one full collection over every
            # object it still holds (a 9B header's records, the modules): 21.5M instructions of verify's
            # 301M, measured with callgrind, for memory the process is about to give back. Frozen objects
            # are not scanned; they are still freed as the modules are torn down, and atexit still runs.
            gc.freeze()
        if argv is not None and sigint is not None:  # the console script (argv from sys.argv) keeps
            try:  # ignoring it until it exits: a Ctrl-C after the outcome was printed must not turn 0 into 130
                signal.signal(signal.SIGINT, sigint)
            except ValueError:  # called from another thread: only the main thread has handlers to restore
                pass


def _could_not_run(command: str | None, path: str | None, exc: CouldNotRun, as_json: bool, args_in: list[str]) -> int:
    from clef_format.cli.output import (
        EXIT_COULD_NOT_RUN,
        StreamUnwritable,
        could_not_run_report,
        emit_json,
        stop_interrupts,
        write,
    )

    stop_interrupts()

    if command == "migrate" and exc.code == "interrupted":  # what to run depends on what the run left
        from clef_format.cli.commands.migrate_cmd import interrupted_fix

        exc.fix = interrupted_fix(path, args_in)
    try:
        if as_json:
            emit_json(could_not_run_report(command, path, exc).to_dict())
        else:
            write(f"clef-format: {exc}\n" + (f"  fix: {exc.fix}\n" if exc.fix else ""), "stderr")
    except BrokenPipeError:
        _discard("stdout")
    except StreamUnwritable as failed:
        _unwritable(failed, as_json)
    return EXIT_COULD_NOT_RUN


def _help_or_version(command: str | None, text: str, as_json: bool) -> int:
    """``--help`` / ``--version``: the text argparse made, or with ``--json`` one JSON object holding it."""
    from clef_format import __version__
    from clef_format.cli.output import EXIT_OK, emit_json, write

    version = text.strip() == f"clef-format {__version__}"
    if not as_json:
        write(text)
        return EXIT_OK
    from clef_format.report import make_report

    details = {"version": __version__} if version else {"help": text}
    emit_json(make_report(command or "clef-format", None, None, [], details).to_dict())
    return EXIT_OK


def _discard(stream: str) -> None:
    """Point the stream's descriptor at /dev/null: what is left in its buffer is flushed there at exit,
    not reported by Python as an ignored exception (exit 120)."""
    fh = getattr(sys, stream)
    try:
        fd = fh.fileno()
    except (AttributeError, OSError, ValueError):  # closed, or not a real file (a caller's in-process capture)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


def _unwritable(exc: Exception, as_json: bool, finished: str | None = None) -> int:
    """stdout or stderr could not take the outcome: exit 2 ``unwritable``. The JSON object cannot reach
    stdout, so one line goes to stderr; when stderr cannot take it either, the exit status alone says it.
    ``finished``: the command whose run ended with this report; for one that writes (migrate, manifest,
    example) the line says its work is done, so that exit 2 is not read as "nothing happened"."""
    from clef_format.cli.commands import READ_ONLY
    from clef_format.cli.output import EXIT_COULD_NOT_RUN, StreamUnwritable, write

    stream = exc.stream if isinstance(exc, StreamUnwritable) else "stdout"
    _discard(stream)
    if stream == "stdout":
        done = ""
        if finished is not None and finished not in READ_ONLY and not getattr(exc, "before_work", False):
            done = (f"; only the report was lost: {finished} ran to its end, and what it wrote is in place "
                    "(clef-format verify shows the result)")
        try:
            write(f"clef-format: unwritable: {exc}{done}\n", "stderr")
        except (StreamUnwritable, BrokenPipeError):
            _discard("stderr")
    return EXIT_COULD_NOT_RUN


if __name__ == "__main__":  # pragma: no cover - run as the package's module, so exceptions are one class
    from clef_format.cli.main import main as _main

    sys.exit(_main())
