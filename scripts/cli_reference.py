"""docs/CLI.md from the parser itself: every command's ``--help``, as a user sees it at 100 columns.

    python scripts/cli_reference.py > docs/CLI.md      # after changing an option or its help
    python scripts/cli_reference.py --check            # exit 1 (and a diff) when docs/CLI.md is stale

tests/cli/test_cli_reference.py runs the CLI as a user does (``clef-format COMMAND --help``, in a
subprocess at COLUMNS=100) and compares each text with this file's, so an option that is renamed,
dropped or documented wrongly fails a test, and the reference never drifts from the code.
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "CLI.md"
COLUMNS = "100"

HEADER = """# Command reference

Every command's `--help`, exactly as `clef-format COMMAND --help` prints it at 100 columns (generated:
`python scripts/cli_reference.py > docs/CLI.md`; `tests/cli/test_cli_reference.py` fails when this file
and the parser disagree). Exit statuses, the one JSON object of `--json` and the finding codes are in the
README; `clef-format codes` lists the codes.
"""


def commands() -> list[str]:
    """The registry's commands, in its order (the parser's subcommands)."""
    sys.path.insert(0, str(ROOT))
    from clef_format.cli.commands import COMMANDS

    return list(COMMANDS)


def help_text(args: list[str]) -> str:
    """What ``clef-format ARGS --help`` prints, run as the console command runs (a fresh process, no tty)."""
    env = dict(os.environ, COLUMNS=COLUMNS, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "clef_format", *args, "--help"], env=env, cwd=ROOT,
                          capture_output=True, text=True, check=True)
    return done.stdout


def reference() -> str:
    parts = [HEADER, "## clef-format\n", "```text\n" + help_text([]) + "```\n"]
    for name in commands():
        parts += [f"## clef-format {name}\n", "```text\n" + help_text([name]) + "```\n"]
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    text = reference()
    if argv[:1] == ["--check"]:
        have = REFERENCE.read_text(encoding="utf-8")
        if have == text:
            return 0
        sys.stdout.writelines(difflib.unified_diff(have.splitlines(True), text.splitlines(True), "docs/CLI.md", "parser"))
        return 1
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
