"""argv -> argparse: the ``clef-format`` parser and its subcommands' arguments.

Apart from ``cli.main`` so that the console script starts with nothing but ``os``, ``sys`` and the
errors imported: argparse and the command modules load inside ``main``'s handling, where a Ctrl-C
is reported like any other interruption (one JSON object with ``--json``), never as a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib import import_module

from clef_format.cli.commands import COMMANDS
from clef_format.errors import UsageError

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any, NoReturn

DESCRIPTION = """Verify, migrate and serve split Clef checkpoints.

layouts: original-release | layout-1 (BF16 tables in the backbone, plugin < 0.2.0) |
layout-2 (int8 tables in clef_head/tables_int8.safetensors + requires_clef_vllm marker) |
layout-2-unmarked (never serve; repair with migrate) | unknown"""


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


def _canonical(value: object, dest: str = "") -> object:
    """The same value however it was typed: ``DIR`` and ``DIR/``, ``0.28`` and ``0.28.0``. The version
    rule is for version options only: ``--output 0.28 --output 0.28/`` is one folder."""
    if not isinstance(value, str):
        return value
    parts = value.split(".")
    if dest.endswith("version") and all(p.isdigit() for p in parts):  # release numbers: PEP 440 pads with zeros
        numbers = [int(p) for p in parts]
        while len(numbers) > 1 and numbers[-1] == 0:
            numbers.pop()
        return tuple(numbers)
    return os.path.abspath(value)  # a path: DIR, DIR/, ./DIR and /abs/DIR are one folder


class _StoreOnce(argparse.Action):
    """argparse's ``store``, refusing an option given twice with different values: argparse would keep
    the last one silently (``--to layout-1 ... --to layout-2``), and the user meant one of them."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        given = namespace.__dict__.setdefault("_given", {})
        if self.dest in given and _canonical(given[self.dest], self.dest) != _canonical(values, self.dest):
            parser.error(f"{option_string} given twice ({given[self.dest]}, then {values}): give it once")
        given[self.dest] = values
        setattr(namespace, self.dest, values)


def _non_empty(option: str, metavar: str, command: str, convert: Any) -> Any:
    """An option's ``type``, refusing an empty value first (``--python ""``, ``--plugin-version=``: an unset
    shell variable, most often) as a usage error, never a silent default or a crash further on."""

    def check(value: str) -> Any:
        if value == "":
            raise UsageError(f"{option} is empty: it takes {metavar}",
                             fix=f"give {option} {metavar} (see {command} --help)")
        return value if convert is None else convert(value)

    check.__name__ = getattr(convert, "__name__", "str")  # argparse names the type in its own messages
    return check


class _Parser(argparse.ArgumentParser):
    """argparse that raises ``UsageError`` instead of printing and exiting: the contract decides the output.

    Its message carries the subcommand (``verify: argument --to: ...``), never the program's name: the
    CLI prints every usage error once as ``clef-format: MESSAGE``. Every option that takes one value
    refuses an empty one (``_non_empty``)."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("clef-format").strip()
        raise UsageError(f"{command}: {message}" if command else message, fix=f"see {self.prog} --help")

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        """argparse's, with the arguments no option takes refused in the name of the command given:
        argparse refuses them at the top, where the fix could only say ``clef-format --help``."""
        parsed, extras = self.parse_known_args(args, namespace)
        command = getattr(parsed, "command", None)
        if extras and command:
            raise UsageError(f"{command}: unrecognized arguments: {' '.join(extras)}",
                             fix=f"see clef-format {command} --help")
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action:
        if names and names[0].startswith("-") and kwargs.get("action") in (None, "store") \
                and kwargs.get("nargs") is None:
            metavar = kwargs.get("metavar") or names[-1].lstrip("-").upper().replace("-", "_")
            kwargs["type"] = _non_empty(names[-1], metavar, self.prog, kwargs.get("type"))
        return super().add_argument(*names, **kwargs)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    # no abbreviations: `--js` would be --json to argparse but not to the contract's own check of argv
    parser = _Parser(prog="clef-format", description=DESCRIPTION, formatter_class=_Formatter, allow_abbrev=False)
    from clef_format import __version__

    parser.add_argument("--version", action="version", version=f"clef-format {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands = {only: COMMANDS[only]} if only in COMMANDS else _available()
    for name, (module, help_text) in commands.items():
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=_Formatter, allow_abbrev=False)
        p.register("action", None, _StoreOnce)  # the default action ("store"): every option with a value
        import_module(f"clef_format.cli.commands.{module}").add_arguments(p)
    return parser
