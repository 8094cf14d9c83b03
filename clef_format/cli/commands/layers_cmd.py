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
    from clef_format.cli.render import render_layers, render_report
    from clef_format.verify.layers import layers_report

    report = layers_report(args.path, args.vllm_version)

    def human(r):
        text = render_report(r, title="layers") if r.findings or "rows" not in r.details else ""
        if "rows" in r.details:
            text = "\n\n".join(t for t in (text, f"vLLM {r.details['vllm_version']} rules") if t)
        return "\n\n".join(t for t in (text, render_layers(dict(r.details)) if "rows" in r.details else "") if t)

    return finish(report, args.json, human)
