"""The report of a command that could not run (cli/output.py), as the CLI prints it in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clef_format.cli.main import main
from clef_format.cli.output import EXIT_COULD_NOT_RUN, EXIT_FINDINGS, EXIT_OK, could_not_run_report, exit_status
from clef_format.errors import CouldNotRun
from clef_format.report import make_report
from clef_format.spec.findings import error, warning


def _json_of(argv: list[str], capsys) -> tuple[int, dict]:
    rc = main(argv)
    out = capsys.readouterr().out
    return rc, json.loads(out)


def test_could_not_run_report_names_the_command_the_path_and_the_cause(tmp_path: Path, capsys) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "config.json").write_text("{}")
    rc, payload = _json_of(["example", str(taken), "--json"], capsys)
    assert rc == EXIT_COULD_NOT_RUN
    assert payload["command"] == "example" and payload["path"] == str(taken) and payload["ok"] is False
    (finding,) = payload["findings"]
    assert finding["code"] == "usage-error" and finding["severity"] == "error"
    assert finding["message"] == f"{taken} exists and is not an empty directory" == payload["error"]
    assert finding["fix"] == "pick a new directory"


def test_usage_error_without_a_command_is_reported_as_clef_format(capsys) -> None:
    rc, payload = _json_of(["--json"], capsys)
    assert rc == EXIT_COULD_NOT_RUN
    assert payload["command"] == "clef-format" and payload["path"] is None
    (finding,) = payload["findings"]
    assert finding["code"] == "usage-error" and finding["message"] == "unrecognized arguments: --json"
    assert finding["fix"] == "see clef-format --help"


@pytest.mark.parametrize("argv", [["verify", "ck", "--bogus"], ["migrate", "ck", "--to", "layout-2", "extra"],
                                  ["scan", "--fixable", "-x"], ["layers", "ck", "--layers"]])
def test_an_unrecognized_argument_names_its_command(argv: list[str], capsys) -> None:
    """argparse refuses arguments no option takes at the top: the report and its fix name the command
    the user typed, whose --help lists what it takes (it said ``see clef-format --help``)."""
    rc, payload = _json_of([*argv, "--json"], capsys)
    (finding,) = payload["findings"]
    assert rc == EXIT_COULD_NOT_RUN and payload["command"] == argv[0]
    assert finding["message"] == f"{argv[0]}: unrecognized arguments: {argv[-1]}"
    assert finding["fix"] == f"see clef-format {argv[0]} --help"


def test_exit_status_classes() -> None:
    assert exit_status(make_report("verify", "p")) == EXIT_OK
    assert exit_status(make_report("verify", "p", None, [warning("legacy-layout", "old")])) == EXIT_OK
    assert exit_status(make_report("verify", "p", None, [error("missing-file", "gone")])) == EXIT_FINDINGS
    assert exit_status(make_report("verify", "p", None, [error("unreadable", "denied")])) == EXIT_COULD_NOT_RUN
    assert (EXIT_OK, EXIT_FINDINGS, EXIT_COULD_NOT_RUN) == (0, 1, 2)


def test_could_not_run_json_carries_exactly_the_report_keys_and_error(tmp_path: Path, capsys) -> None:
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "config.json").write_text("{}")
    _, payload = _json_of(["example", str(taken), "--json"], capsys)
    assert set(payload) == {"command", "path", "layout", "ok", "findings", "error"}


def test_could_not_run_report_keeps_the_cause_in_its_details() -> None:
    report = could_not_run_report("verify", "ck", CouldNotRun("the disk went away", code="unwritable", fix="retry"))
    assert report.details.to_dict() == {"error": "the disk went away"}
    assert report.to_dict()["error"] == "the disk went away"
    (finding,) = report.findings
    assert (finding.code, finding.message, finding.fix) == ("unwritable", "the disk went away", "retry")
