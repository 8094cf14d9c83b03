"""The ``clef-format`` command line. Exit status: 0 no error, 1 errors found or refused, 2 could not run.

Built on ``argparse`` rather than click/typer for a measured reason: ``verify`` must answer on a
9B checkpoint within 3x the time of ``python -c "import json"``, and importing click alone costs
about that whole budget (benchmarks/RESULTS.md). Each command module is imported only when run.
Commands register themselves in ``COMMANDS``: name -> (module, help); the module provides
``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib import import_module

from clef_format.errors import CouldNotRun

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any, NoReturn, Sequence

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2

#: Subcommand -> (module under clef_format.commands, one-line help).
COMMANDS: dict[str, tuple[str, str]] = {
    "verify": ("verify_cmd", "verify a checkpoint (directory or cached repo id)"),
    "migrate": ("migrate_cmd", "migrate a checkpoint to another layout, losing nothing"),
    "layers": ("layers_cmd", "per-layer schemes vLLM will build, and GPU memory"),
    "manifest": ("manifest_cmd", "write a hash manifest for fast offline --deep verification"),
    "example": ("example_cmd", "build a small example checkpoint and verify it"),
    "codes": ("codes_cmd", "list every finding code and what it means"),
}

DESCRIPTION = """Verify, migrate and serve split Clef checkpoints.

layouts: original-release | layout-1 (BF16 tables in the backbone, plugin < 0.2.0) |
layout-2 (int8 tables in clef_head/tables_int8.safetensors + requires_clef_vllm marker) |
layout-2-unmarked (never serve; repair with migrate) | unknown"""


def fail(message: str, as_json: bool, path: str | None = None) -> NoReturn:
    """Could not run: one JSON object (with --json) or a message on stderr, exit 2."""
    if as_json:
        print(json.dumps({"path": path, "layout": None, "ok": False, "findings": [], "error": message}))
    else:
        print(f"clef-format: {message}", file=sys.stderr)
    sys.exit(EXIT_USAGE)


def emit_json(payload: Any) -> None:
    print(json.dumps(payload, indent=2))


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter without its ``import shutil`` (bz2, lzma...) on every start: width from os."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None) -> None:
        if width is None:
            try:
                width = os.get_terminal_size(sys.__stdout__.fileno()).columns - 2  # type: ignore[union-attr]
            except (OSError, AttributeError, ValueError):
                width = int(os.environ.get("COLUMNS", 80)) - 2
        super().__init__(prog, indent_increment, max_help_position, width)


def _available() -> dict[str, tuple[str, str]]:
    from importlib.util import find_spec

    return {name: spec for name, spec in COMMANDS.items() if find_spec(f"clef_format.cli.commands.{spec[0]}")}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clef-format", description=DESCRIPTION, formatter_class=_Formatter)
    from clef_format import __version__

    parser.add_argument("--version", action="version", version=f"clef-format {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands = {only: COMMANDS[only]} if only in COMMANDS else _available()
    for name, (module, help_text) in commands.items():
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=_Formatter)
        import_module(f"clef_format.cli.commands.{module}").add_arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in args_in if not a.startswith("-")), None)
    parser = build_parser(only=first if first in COMMANDS else None)
    args = parser.parse_args(args_in)
    if not args.command:
        parser.print_help()
        return EXIT_USAGE
    module = import_module(f"clef_format.cli.commands.{COMMANDS[args.command][0]}")
    try:
        return int(module.run(args))
    except CouldNotRun as exc:
        fail(str(exc), bool(getattr(args, "json", False)), getattr(args, "path", None))
    except KeyboardInterrupt:
        print("clef-format: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `clef-format verify ... | head`: the reader left; not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover - run as the package's module, so exceptions are one class
    from clef_format.cli.main import main as _main

    sys.exit(_main())
