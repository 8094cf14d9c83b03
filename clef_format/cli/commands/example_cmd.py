"""clef-format example DIR: build a tiny checkpoint in the real formats (no download) and verify it.

Runs on a plain install: the builders read frozen config templates and write tensors with numpy
(no torch, transformers or compressed-tensors; ``tests/cli/test_example_without_torch.py``).
"""

from __future__ import annotations

import argparse
import os

from clef_format.errors import CouldNotRun, Refused, UsageError
from clef_format.records import Record
from clef_format.spec.layouts import Layout

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from clef_format.verify.run import VerifyDetails

LAYOUT_CHOICES = tuple(str(layout) for layout in Layout if layout is not Layout.UNKNOWN)
BUILD_CHOICES = ("nvfp4", "fp8", "hybrid", "mixed", "bf16")  # fixtures.quant.BUILDS (tests/cli checks they agree)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="DIR", help="new (or empty) directory to build into")
    p.add_argument("--layout", default=Layout.LAYOUT_2.value, choices=LAYOUT_CHOICES)
    p.add_argument("--build", default="hybrid", choices=BUILD_CHOICES, help="which published build to imitate")
    p.add_argument("--full-size", action="store_true", help="9B names and shapes, sparse data (headers only)")
    p.add_argument("--no-verify", action="store_true", help="build only")
    p.add_argument("--json", action="store_true", help="print verify's JSON object")


def run(args: argparse.Namespace) -> int:
    from clef_format.cli.output import require_stdout

    require_stdout("example")  # before anything is written: its report could never be printed
    if os.path.exists(args.path) and (not os.path.isdir(args.path) or os.listdir(args.path)):
        raise UsageError(f"{args.path} exists and is not an empty directory", fix="pick a new directory")
    from clef_format.cli.output import finish
    from clef_format.cli.render import render_example
    from clef_format.fixtures.builders import build_checkpoint
    from clef_format.migrate.manifest_writer import writer_lock
    from clef_format.read.hf_cache import cache_area
    from clef_format.report import make_report
    from clef_format.spec.findings import error

    area = cache_area(args.path)
    if area:  # an invented snapshot or blob there would pass verify org/name@<rev> as a download
        refusal = error("example-refused", f"{args.path} lies inside a Hugging Face cache ({area}), which clef-format "
                                           "never writes", fix="pick a directory outside the cache")
        return finish(make_report("example", args.path, None, [refusal], ExampleDetails(None)), args.json, render_example)
    try:
        with writer_lock(args.path, "example-refused", "wait for it to finish, or pick another directory",
                         "pick a new directory on a disk you can write"):
            build_checkpoint(args.path, layout=args.layout, build=args.build, full_size=args.full_size)
    except Refused as exc:
        refusal = error("example-refused", exc.message, fix=exc.fix)
        return finish(make_report("example", args.path, None, [refusal], ExampleDetails(None)), args.json, render_example)
    except OSError as exc:
        raise CouldNotRun(f"cannot build in {args.path}: {exc.strerror or exc}", code="unwritable",
                          fix="pick a directory you can write") from None
    from clef_format.cli.output import write

    write(f"built a {'full-size' if args.full_size else 'tiny'} {args.build} checkpoint in {args.layout} at "
          f"{args.path}\n", "stderr")
    if args.no_verify:
        return finish(make_report("example", args.path, args.layout, [], ExampleDetails(args.path)), args.json,
                      lambda r: f"built {args.path}")
    from clef_format.verify.run import VerifyDetails, verify

    verified = verify(args.path)
    assert isinstance(verified.details, VerifyDetails)
    report = make_report("example", verified.path, verified.layout, verified.findings,
                         ExampleDetails(args.path, verified.details), verified.capped)
    return finish(report, args.json, render_example)


class ExampleDetails(Record):
    """example's own keys: where it built (``None``: refused), then, after verify's own keys when it verified."""

    built: str | None
    verified: VerifyDetails | None = None

    @property
    def capped_after(self) -> str | None:
        return "hf_snapshot"

    def to_dict(self) -> dict[str, Any]:
        return {**(self.verified.to_dict() if self.verified is not None else {}), "built": self.built}

