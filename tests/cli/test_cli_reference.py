"""docs/CLI.md is what the CLI prints: each command's ``--help``, run as a user runs it.

The reference is generated (scripts/cli_reference.py); this test reads it as a user reads it and
compares each section with the real ``clef-format COMMAND --help`` in a fresh process, whitespace
collapsed (argparse wraps by width and Python version). An option renamed, dropped, or whose help
changes, fails here until the reference is regenerated: the docs never drift from the parser.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from clef_format.cli.commands import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
SECTION = re.compile(r"^## (clef-format(?: [a-z]+)?)\n\n```text\n(.*?)```\n", re.M | re.S)


def _sections() -> dict[str, str]:
    return {title: body for title, body in SECTION.findall((ROOT / "docs" / "CLI.md").read_text(encoding="utf-8"))}


def _words(text: str) -> str:
    return " ".join(text.split())


def test_the_reference_has_one_section_per_command_and_the_top_level():
    assert list(_sections()) == ["clef-format"] + [f"clef-format {name}" for name in COMMANDS]


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_each_help_is_the_reference(command):
    args = [] if command is None else [command]
    done = subprocess.run([sys.executable, "-m", "clef_format", *args, "--help"], capture_output=True, text=True,
                          env=dict(os.environ, COLUMNS="100"), timeout=120)
    assert done.returncode == 0, done.stderr
    title = "clef-format" if command is None else f"clef-format {command}"
    assert _words(done.stdout) == _words(_sections()[title]), (
        f"{title} --help differs from docs/CLI.md: run python scripts/cli_reference.py > docs/CLI.md")
    assert done.stderr == ""
