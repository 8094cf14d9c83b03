"""The docs match the code: every finding code and every command is documented in the README."""

from __future__ import annotations

from pathlib import Path

from clef_format.cli.commands import COMMANDS
from clef_format.spec.findings import CODES

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_finding_code_is_in_the_readme():
    missing = [code for code in CODES if f"`{code}`" not in README]
    assert not missing, f"README lacks finding codes {missing}"


def test_every_command_is_in_the_readme():
    missing = [name for name in COMMANDS if f"clef-format {name}" not in README]
    assert not missing, f"README lacks commands {missing}"


def test_readme_code_table_is_the_code_table():
    rows = [line for line in README.splitlines() if line.startswith("| `") and line.count("|") == 3]
    documented = {line.split("`")[1]: line.split("|")[2].strip() for line in rows}
    assert {c: documented.get(c) for c in CODES} == CODES
