"""clef-format verify PATH [--json] [--deep] [--plugin-version V]"""

from __future__ import annotations

import argparse

from clef_format.cli.main import EXIT_FINDINGS, EXIT_OK, CouldNotRun


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="checkpoint directory, or org/name[@revision] in the local Hugging Face cache")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--deep", action="store_true", help="also hash every file and decode every scale")
    p.add_argument("--plugin-version", metavar="V", help="check that clef-vllm version V can serve these weights")
    p.add_argument("--layers", action="store_true", help="also show the per-layer view (see `clef-format layers`)")


def run(args: argparse.Namespace) -> int:
    from clef_format.read.hf_cache import PathNotFound
    from clef_format.read.checkpoint import open_checkpoint
    from clef_format.verify.run import verify_checkpoint

    try:
        ck = open_checkpoint(args.path)
        report = verify_checkpoint(ck, args.path, plugin_version=args.plugin_version, deep=args.deep)
    except PathNotFound as exc:
        raise CouldNotRun(str(exc)) from None
    except OSError as exc:
        raise CouldNotRun(f"{args.path}: {exc.strerror or exc}") from None
    view = _layers(ck) if getattr(args, "layers", False) else None
    if args.json:
        if view is not None:
            report.extra["layers"] = view.to_dict()
        print(report.to_json())
    else:
        from clef_format.cli.render import render_report

        print(render_report(report))
        if view is not None:
            from clef_format.verify.layers import render

            print()
            print(render(view))
    return EXIT_OK if report.ok else EXIT_FINDINGS


def _layers(ck):  # type: ignore[no-untyped-def]
    """The per-layer view of ``clef-format layers``, when config.json can give one."""
    from clef_format.verify.layers import layers_view
    from clef_format.spec.layouts import TABLES
    from clef_format.spec.model_spec import ConfigError
    from clef_format.vllm_rules.matching import QuantConfigError

    if ck.config is None:
        return None
    try:
        return layers_view(ck.config, int8_tables=ck.has(TABLES))
    except (ConfigError, QuantConfigError):
        return None  # already reported by verify as bad-config / quant-config-invalid
