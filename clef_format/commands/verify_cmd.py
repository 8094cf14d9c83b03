"""clef-format verify PATH [--json] [--deep] [--plugin-version V] [--vllm-version V]"""

from __future__ import annotations

import argparse

from ..cli import EXIT_FINDINGS, EXIT_OK, CouldNotRun


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="checkpoint directory, or org/name[@revision] in the local Hugging Face cache")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--deep", action="store_true", help="also hash every file and decode every scale")
    p.add_argument("--plugin-version", metavar="V", help="check that clef-vllm version V can serve these weights")
    p.add_argument("--layers", action="store_true", help="also show the per-layer view (see `clef-format layers`)")
    add_vllm_version(p)


def add_vllm_version(p: argparse.ArgumentParser) -> None:
    """``--vllm-version``: whose matching rules the pattern findings and the per-layer view follow."""
    from ..vllm_names import DEFAULT_VLLM, PROVEN

    p.add_argument("--vllm-version", metavar="V", default=DEFAULT_VLLM, type=_vllm_version,
                   help=f"match patterns as vLLM V does (default {DEFAULT_VLLM}, the version the serving plugin "
                        f"pins; proven: {', '.join(PROVEN)})")


def _vllm_version(value: str) -> str:
    from ..vllm_names import rules_for

    try:
        rules_for(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def run(args: argparse.Namespace) -> int:
    from ..hub import PathNotFound
    from ..verify import open_checkpoint, verify_checkpoint

    from ..vllm_names import DEFAULT_VLLM

    version = getattr(args, "vllm_version", None) or DEFAULT_VLLM
    try:
        ck = open_checkpoint(args.path)
        ck.vllm_version = version  # read by the pattern check
        report = verify_checkpoint(ck, args.path, plugin_version=args.plugin_version, deep=args.deep)
    except PathNotFound as exc:
        raise CouldNotRun(str(exc)) from None
    except OSError as exc:
        raise CouldNotRun(f"{args.path}: {exc.strerror or exc}") from None
    report.extra["vllm_version"] = version
    view = _layers(ck, version) if getattr(args, "layers", False) else None
    if args.json:
        if view is not None:
            report.extra["layers"] = view.to_dict()
        print(report.to_json())
    else:
        from ..render import render_report

        print(render_report(report))
        if view is not None:
            from ..layers_view import render

            print()
            print(render(view))
    return EXIT_OK if report.ok else EXIT_FINDINGS


def _layers(ck, version):  # type: ignore[no-untyped-def]
    """The per-layer view of ``clef-format layers``, when config.json can give one."""
    from ..layers_view import layers_view
    from ..layouts import TABLES
    from ..model_spec import ConfigError
    from ..resolve import QuantConfigError

    if ck.config is None:
        return None
    try:
        return layers_view(ck.config, int8_tables=ck.has(TABLES), version=version)
    except (ConfigError, QuantConfigError):
        return None  # already reported by verify as bad-config / quant-config-invalid
