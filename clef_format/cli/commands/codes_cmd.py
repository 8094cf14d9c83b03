"""clef-format codes: every finding code and its meaning."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def run(args: argparse.Namespace) -> int:
    from clef_format.cli.main import emit_json
    from clef_format.spec.findings import CODES

    if args.json:
        emit_json({"codes": CODES})
    else:
        for code, meaning in CODES.items():
            print(f"{code:24} {meaning}")
    return 0
