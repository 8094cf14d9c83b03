"""clef-format layers PATH [--json] [--vllm-version V]: the scheme vLLM builds for each decoder layer, and GPU memory."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="checkpoint directory, or org/name[@revision] in the local Hugging Face cache")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    from clef_format.cli.commands.verify_cmd import add_vllm_version

    add_vllm_version(p)


def run(args: argparse.Namespace) -> int:
    from clef_format.cli.output import finish
    from clef_format.cli.render import render_layers_report
    from clef_format.verify.layers_report import layers_report

    return finish(layers_report(args.path, args.vllm_version), args.json, render_layers_report)
