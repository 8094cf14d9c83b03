"""clef-format migrate PATH [--to LAYOUT] [--output DIR] [--dry-run] [--json] [--current] [--history] [--abort]

Exit 0: done, or nothing to do. 1: refused or failed (the checkpoint is as it was). 2: could not run.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Callable

from clef_format.cli.main import EXIT_FINDINGS, EXIT_OK, CouldNotRun
from clef_format.spec.findings import Report

TARGETS = ("layout-1", "layout-2")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", nargs="?", help="checkpoint directory, or org/name[@revision] in the local Hugging Face cache")
    p.add_argument("--to", default="layout-2", choices=TARGETS, metavar="LAYOUT",
                   help="target layout: layout-2 (int8 tables, clef-vllm >= 0.2.0; default) or layout-1 (clef-vllm 0.1.x)")
    p.add_argument("--output", metavar="DIR", help="write the result to DIR (new or empty) and leave PATH untouched; "
                                                     "required for a Hugging Face cache snapshot")
    p.add_argument("--dry-run", action="store_true", help="print the plan: files read, written, removed, bytes, space")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--current", action="store_true", help="print the layout (revision) PATH is at, and any interrupted run")
    p.add_argument("--history", action="store_true", help="print the chain of migration steps")
    p.add_argument("--abort", action="store_true", help="roll back an interrupted migration instead of resuming it")


def _out(args: argparse.Namespace, payload: dict[str, Any], text: list[str]) -> None:
    if args.json:
        print(json.dumps(payload, indent=2))
    else:
        print("\n".join(text))


def _history(args: argparse.Namespace) -> int:
    from clef_format import migrations

    hist = migrations.history()
    lines = ["base = layout-1 (BF16 tables in the backbone)"]
    for h in hist:
        arrow = "<->" if h["reversible"] else " ->"
        lines.append(f"{h['revision']:20} {h['from']} {arrow} {h['to']}   (down_revision {h['down_revision']}): "
                     f"{h['description']}")
    _out(args, {"history": hist}, lines)
    return EXIT_OK


class _RichProgress:
    """Progress bars on stderr (only on a terminal; logs and pipes stay clean)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

        console = Console(stderr=True)
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                                 TimeRemainingColumn(), console=console, transient=True, disable=not console.is_terminal)

    def add(self, description: str, total: int) -> Callable[[int], None]:
        task = self.progress.add_task(description, total=total)
        return lambda n: self.progress.advance(task, n)


def _quality_lines(quality: dict[str, dict[str, float]]) -> list[str]:
    lines = []
    for table, q in sorted(quality.items()):
        lines.append(f"  {table}: relative error {q['rel_error'] * 100:.3f}%, mean row cosine {q['mean_row_cosine']:.7f}, "
                     f"worst row cosine {q['min_row_cosine']:.7f}, worst row relative error {q['max_row_rel_error'] * 100:.3f}%")
    return lines


def _plan_lines(plan_dict: dict[str, Any]) -> list[str]:
    from clef_format.cli.render import human_size

    lines = [f"step {plan_dict['revision']} ({plan_dict['direction']}): {plan_dict['from']} -> {plan_dict['to']}"]
    for rel, n in plan_dict["read"].items():
        lines.append(f"  read     {rel}  {human_size(n)}")
    for rel, n in plan_dict["written"].items():
        lines.append(f"  write    {rel}  {human_size(n)}")
    for rel in plan_dict["removed"]:
        lines.append(f"  remove   {rel}")
    lines.append(f"  keep     {plan_dict['carried']} unchanged file(s), {human_size(plan_dict['bytes_carried'])}"
                 + (f" ({plan_dict['carried_by']})" if "carried_by" in plan_dict else ""))
    if "space_needed" in plan_dict:
        lines.append(f"  space    {human_size(plan_dict['space_needed'])} needed while it runs")
    for note in plan_dict["notes"]:
        lines.append(f"  note     {note}")
    return lines


def run(args: argparse.Namespace) -> int:
    if args.history:
        return _history(args)
    if not args.path:
        raise CouldNotRun("migrate needs PATH (or --history)")
    from clef_format.read.hf_cache import PathNotFound, locate_checkpoint

    try:
        root = locate_checkpoint(args.path)
    except PathNotFound as exc:
        raise CouldNotRun(str(exc)) from None
    if not os.access(root, os.R_OK | os.X_OK):
        raise CouldNotRun(f"{args.path}: permission denied")
    from clef_format.migrate.session import Options, migrate

    opts = Options(to=args.to, output=args.output, dry_run=args.dry_run, abort=args.abort, current=args.current)
    report = migrate(root, args.path, opts, _RichProgress() if not (args.current or args.dry_run) else None)
    if args.json:
        print(report.to_json())
    else:
        print(render(report))
    return EXIT_OK if report.ok else EXIT_FINDINGS


def render(report: Report) -> str:
    from clef_format.cli.render import render_report

    d = report.to_dict()
    lines = [render_report(report, title="migrate")]
    if d.get("revision") is not None or d.get("pending"):
        lines.append(f"  revision {d.get('revision')}" + (f"   interrupted run pending: {d['pending']}" if d.get("pending") else ""))
    for note in d.get("recovered") or []:
        lines.append(f"  recovery {note}")
    for step in d.get("steps", []):
        lines.append("")
        lines.extend(_plan_lines(step["plan"]))
        if step.get("quality"):
            lines.append("  int8 table quality:")
            lines.extend(_quality_lines(step["quality"]))
        if step.get("carried_by"):
            lines.append("  unchanged files came over by " + ", ".join(f"{k} x{v}" for k, v in step["carried_by"].items()))
    if d.get("dry_run"):
        lines.append("")
        lines.append("dry run: nothing was written")
    if d.get("message"):
        lines.append("")
        lines.append(d["message"])
    return "\n".join(lines)
