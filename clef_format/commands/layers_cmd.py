"""clef-format layers PATH [--json] [--vllm-version V]: the scheme vLLM builds for each decoder layer, and GPU memory."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="checkpoint directory, or org/name[@revision] in the local Hugging Face cache")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    from .verify_cmd import add_vllm_version

    add_vllm_version(p)


def run(args: argparse.Namespace) -> int:
    import json
    import os

    from ..cli import EXIT_FINDINGS, EXIT_OK, CouldNotRun, emit_json
    from ..layers_view import layers_view, render
    from ..layouts import TABLES
    from ..model_spec import ConfigError
    from ..resolve import QuantConfigError

    from ..hub import PathNotFound, resolve

    try:
        root = resolve(args.path)
    except PathNotFound as exc:
        raise CouldNotRun(str(exc)) from None
    try:
        with open(os.path.join(root, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise CouldNotRun(f"{args.path}: cannot read config.json ({exc})") from None
    try:
        view = layers_view(config, int8_tables=os.path.exists(os.path.join(root, *TABLES.split("/"))),
                           version=args.vllm_version)
    except (ConfigError, QuantConfigError) as exc:
        if args.json:
            emit_json({"path": args.path, "ok": False, "error": str(exc)})
        else:
            print(f"clef-format: {exc}")
        return EXIT_FINDINGS
    if args.json:
        emit_json({"path": args.path, "ok": not any(v.startswith("error") for r in view.rows for v in r.groups.values()),
                   "vllm_version": args.vllm_version, **view.to_dict()})
    else:
        print(f"vLLM {args.vllm_version} rules")
        print(render(view))
    return EXIT_OK
