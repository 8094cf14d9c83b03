"""clef-format migrate PATH [--to LAYOUT] [--output DIR] [--dry-run] [--json] [--current] [--history] [--abort]

Exit 0: done, or nothing to do. 1: refused or failed (the checkpoint is as it was). 2: could not run.
"""

from __future__ import annotations

import argparse

from clef_format.errors import UsageError
from clef_format.shell import quote_path
from clef_format.spec.layouts import Layout

TARGETS = (Layout.LAYOUT_1.value, Layout.LAYOUT_2.value)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", nargs="?", help="checkpoint directory, or org/name[@revision] in the local Hugging Face cache")
    p.add_argument("--to", default=None, choices=TARGETS, metavar="LAYOUT",
                   help="target layout: layout-2 (int8 tables, clef-vllm >= 0.2.0; default) or layout-1 (clef-vllm 0.1.x)")
    p.add_argument("--output", metavar="DIR", help="write the result to DIR (new or empty) and leave PATH untouched; "
                                                     "required for a Hugging Face cache snapshot")
    p.add_argument("--dry-run", action="store_true", help="print the plan: files read, written, removed, bytes, space")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--current", action="store_true", help="print the layout (revision) PATH is at, and any interrupted run")
    p.add_argument("--history", action="store_true", help="print the chain of migration steps")
    p.add_argument("--abort", action="store_true", help="roll back an interrupted migration instead of resuming it")


def run(args: argparse.Namespace) -> int:
    from clef_format.cli.output import finish, require_stdout
    from clef_format.cli.render import render_history, render_migrate

    require_stdout("migrate")  # before anything is written: its report could never be printed

    if args.history:
        given = [flag for flag, on in (("PATH", args.path), ("--current", args.current), ("--to", args.to),
                                       ("--output", args.output), ("--abort", args.abort), ("--dry-run", args.dry_run))
                 if on]
        if given:
            raise UsageError(f"--history prints the chain of migration steps, it takes no {', '.join(given)}",
                             fix="clef-format migrate --history" + (
                                 f"; clef-format migrate {quote_path(args.path)} --current shows where {args.path} is"
                                 if args.path else ""))
        from clef_format import migrations
        from clef_format.report import make_report

        return finish(make_report("migrate", args.path, None, [], {"history": migrations.history()}), args.json,
                      render_history)
    if not args.path:
        asked = "--abort" if args.abort else "--current" if args.current else "--to layout-2"
        raise UsageError("migrate needs PATH (or --history)", fix=f"clef-format migrate PATH {asked}")
    if args.abort and (args.current or args.to is not None):
        other = "--current" if args.current else f"--to {args.to}"
        named = quote_path(args.path)
        fix = (f"clef-format migrate {named} --current shows the interrupted run; --abort alone rolls it back"
               if args.current else f"clef-format migrate {named} --abort, then clef-format migrate {named} "
                                    f"--to {args.to}; or drop --abort to resume the interrupted run")
        why = "--current only reports, --abort rolls back" if args.current else \
            "--abort only rolls back an interrupted run, it migrates nowhere"
        raise UsageError(f"--abort and {other} contradict each other: {why}", fix=fix)
    if args.current and args.output is not None:
        raise UsageError(f"--current reports on PATH only, it takes no --output {args.output}",
                         fix=f"clef-format migrate {quote_path(args.output)} --current shows an interrupted run into it; "
                             f"clef-format migrate {quote_path(args.path)} --current shows {args.path}")
    if args.current and args.to is not None:
        raise UsageError(f"--current and --to {args.to} contradict each other: --current only reports the layout, "
                         "--to migrates", fix=f"clef-format migrate {quote_path(args.path)} --current, then clef-format migrate "
                                              f"{quote_path(args.path)} --to {args.to}")
    from clef_format.cli.progress import TerminalProgress
    from clef_format.migrate.session import Options, migrate_path

    opts = Options(to=args.to or Layout.LAYOUT_2.value, output=args.output, dry_run=args.dry_run, abort=args.abort,
                   current=args.current)
    with TerminalProgress() as progress:
        report = migrate_path(args.path, opts, None if (args.current or args.dry_run) else progress)
    return finish(report, args.json, render_migrate)


def _flag_value(args_in: list[str], flag: str) -> str | None:
    """The value of ``flag`` as typed (``--flag V`` or ``--flag=V``; the last one wins, as argparse)."""
    value = None
    for i, a in enumerate(args_in):
        if a == flag and i + 1 < len(args_in):
            value = args_in[i + 1]
        elif a.startswith(flag + "="):
            value = a[len(flag) + 1:]
    return value


def interrupted_fix(path: str | None, args_in: list[str]) -> str:
    """What to run after a Ctrl-C, from what the interrupted run left beside its target: an out-of-place
    run is resumed with its ``--output`` (never by migrating the source in place)."""
    from clef_format.migrate.pending import interrupted_at, resume_fix

    output = _flag_value(args_in, "--output")
    named = quote_path(path) if path is not None else "PATH"  # as a command line takes it
    target = output if output is not None else path
    from clef_format.migrate.workspace import workspace_holding

    held = workspace_holding(target) if output is None and target is not None else None
    if held is not None:  # the swap moved the tree this process (and the shell) sat in into the workspace
        import os

        ws, owner = held
        return (f"your working directory is now inside {ws} (the run swapped the tree it was in): cd "
                f"{quote_path(os.path.dirname(owner))}, then {interrupted_fix(owner, args_in)}")
    found = interrupted_at(target) if target is not None else None
    if found is None:
        if output is not None:
            return f"nothing of the interrupted run is left and {path} is unchanged: run the command again"
        return (f"nothing of the interrupted run is left: clef-format migrate {named} --current shows the "
                f"layout {path} is at; run the command again if it is not the one you asked for")
    if output is None and found[1] is None:  # killed before its journal was written, or after the cleanup removed it
        return (f"clef-format migrate {named} --abort removes what the run left (nothing in it is needed); "
                "then "
                f"clef-format migrate {named} --current shows the layout {path} is at")
    if output is None:
        from clef_format.migrate.recovery import can_roll_back

        if not can_roll_back(found[0]):  # its cleanup had begun removing the original: only finishing is left
            return (f"clef-format migrate {named} finishes the interrupted run (its cleanup had begun: it "
                    "cannot be rolled back)")
        return f"clef-format migrate {named} resumes the interrupted run; add --abort to roll it back instead"
    return resume_fix(found[0], found[1], output)
