"""clef-format manifest PATH [--json] [--force]: write clef_manifest.json (BLAKE3 per file) for fast --deep.

Refuses (exit 1) inside a Hugging Face cache snapshot and when reading the checkpoint found errors
(``--force`` writes one anyway), and while a migrate of the checkpoint runs (it takes migrate's
lock); see ``clef_format.migrate.manifest_writer``.
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="checkpoint directory (not a Hugging Face cache snapshot)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--force", action="store_true", help="write even if reading the checkpoint found errors")


def run(args: argparse.Namespace) -> int:
    from clef_format.cli.output import finish, require_stdout

    require_stdout("manifest")  # before anything is written: its report could never be printed
    from clef_format.cli.progress import TerminalProgress
    from clef_format.cli.render import render_manifest
    from clef_format.migrate.manifest_writer import make_manifest

    with TerminalProgress() as progress:
        report = make_manifest(args.path, force=args.force, progress=progress)
    return finish(report, args.json, render_manifest)
