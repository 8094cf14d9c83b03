"""clef-format verify PATH [--json] [--deep] [--plugin-version V | --python PATH] [--layers] [--vllm-version V]

Which plugins are checked against the weights: always the one the folder ships in ``vllm_plugin/``;
then ``--plugin-version V`` when given (the explicit choice: no environment is looked at), else the
clef-vllm installed in ``--python PATH``'s environment, else the one in the running interpreter."""

from __future__ import annotations

import argparse

from clef_format.errors import CouldNotRun, UsageError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="checkpoint directory, or org/name[@revision] in the local Hugging Face cache")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--deep", action="store_true", help="also hash every file and decode every scale")
    p.add_argument("--plugin-version", metavar="V",
                   help="check that clef-vllm version V can serve these weights (instead of the installed one)")
    p.add_argument("--python", metavar="PATH",
                   help="check the clef-vllm installed in the environment of this Python interpreter: a path "
                        "(relative: from the current folder) or a command on PATH (python3); default: the one "
                        "clef-format runs in. The plugin the folder ships in vllm_plugin/ is always checked")
    p.add_argument("--layers", action="store_true", help="also show the per-layer view (see `clef-format layers`)")
    add_vllm_version(p)


def add_vllm_version(p: argparse.ArgumentParser) -> None:
    """``--vllm-version``: whose matching rules the pattern findings and the per-layer view follow."""
    from clef_format.vllm_rules.names import DEFAULT_VLLM, PROVEN

    p.add_argument("--vllm-version", metavar="V", default=DEFAULT_VLLM, type=_vllm_version,
                   help=f"match patterns as vLLM V does (default {DEFAULT_VLLM}, the version the serving plugin "
                        f"pins; proven: {', '.join(PROVEN)})")


def _vllm_version(value: str) -> str:
    from clef_format.vllm_rules.names import check_vllm_version

    try:
        return check_vllm_version(value)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def check_plugin_version(value: str | None) -> None:
    """A plugin version that is not a PEP 440 version is a usage error (exit 2), not a finding: the
    gate's own argument rule (``spec.compat.plugin_version_argument``), so both take the same."""
    if value is None:
        return
    from clef_format.spec.compat import plugin_version_argument

    plugin_version_argument(value, "--plugin-version", "--plugin-version 0.2.1")


def run(args: argparse.Namespace) -> int:
    from clef_format.cli.output import finish
    from clef_format.read.checkpoint import open_checkpoint
    from clef_format.verify.options import VerifyOptions
    from clef_format.verify.run import verify_checkpoint

    check_plugin_version(args.plugin_version)
    if args.plugin_version is not None and args.python is not None:
        raise UsageError("--plugin-version and --python both say which plugin serves these weights: give one",
                         fix="--plugin-version V for a version you name, --python PATH for an environment's clef-vllm")
    from clef_format.read.installed_plugin import installed_here, installed_in

    installed = None if args.plugin_version is not None else (
        installed_in(args.python) if args.python is not None else installed_here())
    options = VerifyOptions(vllm_version=args.vllm_version, plugin_version=args.plugin_version, deep=args.deep,
                            layers=args.layers)
    try:
        ck = open_checkpoint(args.path)
    except CouldNotRun:
        raise
    except OSError as exc:
        raise CouldNotRun(f"{args.path}: {exc.strerror or exc}") from None
    if args.deep:
        from clef_format.cli.progress import TerminalProgress

        with TerminalProgress() as progress:
            report = verify_checkpoint(ck, args.path, options, progress=progress, bundled=True, installed=installed)
    else:
        report = verify_checkpoint(ck, args.path, options, bundled=True, installed=installed)

    def human(r):
        from clef_format.cli.render import render_verify  # text only: --json never loads it

        return render_verify(r)

    return finish(report, args.json, human)
