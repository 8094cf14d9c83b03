"""clef-format codes: every finding code and its meaning."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def run(args: argparse.Namespace) -> int:
    from clef_format.cli.output import finish
    from clef_format.report import make_report
    from clef_format.spec.findings import CODES

    def human(r):
        return "\n".join(f"{code:24} {meaning}" for code, meaning in r.details.values["codes"].items())

    return finish(make_report("codes", None, None, [], {"codes": CODES}), args.json, human)
