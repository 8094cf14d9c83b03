"""clef-format example DIR: build a tiny checkpoint in the real formats (no download) and verify it."""

from __future__ import annotations

import argparse
import os
import sys

from clef_format.cli.main import CouldNotRun

LAYOUT_CHOICES = ("original-release", "layout-1", "layout-2", "layout-2-unmarked")
BUILD_CHOICES = ("nvfp4", "fp8", "hybrid", "mixed", "bf16")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="DIR", help="new (or empty) directory to build into")
    p.add_argument("--layout", default="layout-2", choices=LAYOUT_CHOICES)
    p.add_argument("--build", default="hybrid", choices=BUILD_CHOICES, help="which published build to imitate")
    p.add_argument("--full-size", action="store_true", help="9B names and shapes, sparse data (headers only)")
    p.add_argument("--no-verify", action="store_true", help="build only")
    p.add_argument("--json", action="store_true", help="print verify's JSON object")


def run(args: argparse.Namespace) -> int:
    if os.path.exists(args.path) and (not os.path.isdir(args.path) or os.listdir(args.path)):
        raise CouldNotRun(f"{args.path} exists and is not an empty directory; pick a new one")
    try:
        from clef_format.fixtures.builders import build_checkpoint
    except ImportError as exc:
        raise CouldNotRun(f"the example builder needs the fixtures extra: pip install 'clef-format[fixtures]' ({exc})")
    build_checkpoint(args.path, layout=args.layout, build=args.build, full_size=args.full_size)
    print(f"built a {'full-size' if args.full_size else 'tiny'} {args.build} checkpoint in {args.layout} at {args.path}",
          file=sys.stderr)
    if args.no_verify:
        return 0
    from clef_format.cli.commands.verify_cmd import run as run_verify

    return run_verify(argparse.Namespace(path=args.path, json=args.json, deep=False, plugin_version=None, layers=False))
