"""clef-format scan [ROOT ...] [--json] [--deep] [--fixable [--into DIR]]"""

from __future__ import annotations

import argparse
import os

from clef_format.shell import quote_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from clef_format.read.copies import Copy
    from clef_format.report import Report
    from clef_format.verify.scan import Row


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("roots", nargs="*", metavar="ROOT",
                   help="folders to search for Clef checkpoints at any depth (default: the Hugging Face cache, "
                        "every repo and revision in it)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout (each row a full verify report)")
    p.add_argument("--deep", action="store_true", help="also hash every file and decode every scale of every copy")
    p.add_argument("--fixable", action="store_true",
                   help="print only the command that fixes each BROKEN copy (nothing is run), to review and run yourself")
    p.add_argument("--jobs", metavar="N", type=_jobs,
                   help="copies verified at once (default: one per core; at most 4 per core, and never more than copies)")
    p.add_argument("--into", metavar="DIR",
                   help="with --fixable: an existing folder where migrated copies of cached snapshots go "
                        "(default: the current folder; never one inside a Hugging Face cache)")


def _jobs(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive number of jobs")
    return int(value)


def _listable(root: str) -> None:
    """A root (or the cache) that cannot be listed at all: nothing can be said (a folder below it is a row)."""
    from clef_format.errors import CouldNotRun

    try:
        os.scandir(root).close()
    except OSError as exc:
        raise CouldNotRun(f"{root}: {exc.strerror or exc}", code="unreadable",
                          fix="make the folder readable (permissions), or scan another root") from None


def _walk(roots: list[str]):
    from clef_format.errors import PathNotFound, UsageError
    from clef_format.read.copies import cache_copies, folder_copies
    from clef_format.read.hf_cache import hub_cache

    for root in roots:
        if not root:
            raise UsageError("an empty ROOT names no folder", fix="give a folder, or no ROOT to scan the Hugging Face cache")
        if not os.path.isdir(root):
            if os.path.exists(root):
                from clef_format.read.paths import not_a_folder

                raise not_a_folder(root)
            raise PathNotFound(f"{root}: no such directory", fix="give an existing folder, or no ROOT to scan the "
                                                                 "Hugging Face cache")
        _listable(root)
    if roots:
        return folder_copies(roots)
    cache = hub_cache()
    if os.path.lexists(cache):  # no cache at all: nothing downloaded, no copy (exit 0)
        _listable(cache)
    return cache_copies(cache)


def run(args: argparse.Namespace) -> int:
    from clef_format.cli.output import finish
    from clef_format.cli.progress import TerminalProgress
    from clef_format.errors import UsageError
    from clef_format.verify.scan import scan

    if args.into is not None and not args.fixable:
        raise UsageError("--into is used only with --fixable", fix="add --fixable, or drop --into")
    if args.into is not None:
        from clef_format.read.hf_cache import in_hf_cache

        # the one cache-boundary rule migrate refuses --output by, where the path really leads; before the
        # folder's existence: a mkdir there would be a write into the cache
        if in_hf_cache(args.into):
            raise UsageError(f"--into {args.into} lies inside a Hugging Face cache, which clef-format never writes "
                             "to: every printed migrate command would be refused", fix=into_fix(args))
        if not os.path.isdir(args.into):
            raise UsageError(f"--into {args.into}: no such folder (the printed commands would fail)",
                             fix=f"mkdir -p {quote_path(args.into)}, or give an existing folder")
    from clef_format.read.installed_plugin import installed_here

    walk = _walk(args.roots)
    with TerminalProgress() as progress:
        rows = scan(walk, deep=args.deep, progress=progress, workers=args.jobs, installed=installed_here())
    if args.fixable and args.into is None:
        _refuse_a_cached_current_folder(rows, args)
    # --json --fixable: the commands as one more key
    commands = fix_commands(rows, args.into or os.getcwd()) if args.fixable and args.json else None
    report = scan_report(args.roots, rows, walk.limits, commands)
    if args.fixable and not args.json:
        from clef_format.cli.output import exit_status, stop_interrupts, write

        script = fix_script(rows, args.into or os.getcwd())
        stop_interrupts()  # as finish() does: from here on only the outcome is printed
        if script:
            write(script + "\n")  # a stdout that cannot take it is the contract's unwritable (exit 2), not a traceback
        return exit_status(report)

    def human(r: Report) -> str:
        from clef_format.cli.render import render_scan

        return render_scan(r)

    return finish(report, args.json, human)


def into_fix(args: argparse.Namespace) -> str:
    """The fix of an --into (or a current folder) inside a Hugging Face cache: the same scan into a folder
    outside it (``~/clef-models``, made first), as one command; when that folder too leads into a cache
    (a cache configured in the home folder, or a link), only the advice."""
    from clef_format.read.hf_cache import in_hf_cache

    into = os.path.join(os.path.expanduser("~"), "clef-models")
    if in_hf_cache(into):
        return "give an existing folder outside every Hugging Face cache with --into"
    words = ["clef-format", "scan", *(quote_path(root) for root in args.roots)]
    words += ["--deep"] * bool(args.deep) + ["--json"] * bool(args.json)
    words += [f"--jobs {args.jobs}"] if args.jobs else []
    return f"mkdir -p {quote_path(into)} && {' '.join(words)} --fixable --into {quote_path(into)}"


def _refuse_a_cached_current_folder(rows: list[Row], args: argparse.Namespace) -> None:
    """Without --into, migrated copies of cached snapshots go to the current folder: when it lies inside a
    Hugging Face cache and some printed command would write there, refuse (every such command would be
    refused). Copies fixed in place (folders outside the cache) never write to it: then nothing to refuse."""
    from clef_format.errors import UsageError
    from clef_format.read.hf_cache import in_hf_cache

    here = os.getcwd()
    if in_hf_cache(here) and any(" --output " in item.get("command", "") for item in fix_commands(rows, here)):
        raise UsageError(f"the current folder ({here}), where --fixable puts migrated copies of cached snapshots "
                         "without --into, lies inside a Hugging Face cache, which clef-format never writes to: "
                         "every printed migrate command for them would be refused",
                         fix=into_fix(args))


def scan_report(roots: list[str], rows: list[Row], limits: tuple[str, ...],
                commands: list[dict[str, str]] | None = None) -> Report:
    """The contract's one object: a finding per copy that is not OK, the rows, the totals (and ``commands``)."""
    from clef_format.read.hf_cache import hub_cache
    from clef_format.report import make_report
    from clef_format.spec.findings import error, warning
    from clef_format.verify.scan import ScanDetails, Totals

    findings = []
    for row in rows:
        first = next((f for f in row.report.findings if f.severity == "error"), None)
        if row.verdict == "BROKEN" and first is not None:
            findings.append(error("copy-broken", f"{row.copy.display}: {first.code}: {first.message}",
                                  file=row.copy.path, fix=row.fix))
        elif row.verdict == "unreadable":
            findings.append(warning("copy-unreadable", f"{row.copy.display}: {row.report.findings[0].message}",
                                    file=row.copy.path, fix=row.fix))
    findings.extend(warning("scan-limit", text, fix="scan narrower roots") for text in limits)
    where = ", ".join(roots) if roots else hub_cache()
    return make_report("scan", where, None, findings,
                       ScanDetails(list(roots) or [hub_cache()], tuple(rows), Totals.of(rows), commands))


def fix_commands(rows: list[Row], into: str) -> list[dict[str, str]]:
    """Per BROKEN copy: the command that fixes it (a migrate), or the advice when no command can."""
    import re

    from clef_format.read.hf_cache import in_hf_cache

    out = []
    for row in rows:
        if row.verdict != "BROKEN" or not row.fix:
            continue
        to = re.search(r" --to (\S+)", row.fix) if row.to_migrate else None
        if to is not None:
            target = to.group(1).rstrip(",;.")
            command = f"clef-format migrate {quote_path(row.copy.display)} --to {quote_path(target)}"
            if in_hf_cache(row.copy.path):  # a cached snapshot is never written: a migrated copy beside it
                out_dir = os.path.join(os.path.abspath(into), output_name(row.copy, target))
                command += f" --output {quote_path(out_dir)}"
            out.append({"where": row.copy.display, "command": command})
        else:
            out.append({"where": row.copy.display, "advice": row.fix})
    return out


def output_name(copy: Copy, target: str) -> str:
    """The folder a migrated copy of a cached snapshot is written to: ``<org>--<name>-<commit12>-<layout>``,
    the same whether the snapshot was found in the cache or given as a ROOT (docs/SCAN.md)."""
    name = (copy.repo_id or os.path.basename(copy.path)).replace("/", "--")
    rev = (copy.revision or "")[:12]
    return f"{name}-{rev}-{target}" if rev else f"{name}-{target}"


def fix_script(rows: list[Row], into: str) -> str:
    """``--fixable`` as text: one runnable command per line; advice that is no command as a comment, on one
    line whatever the folder's name holds (a newline in it could otherwise end the comment)."""
    from clef_format.cli.render import printable

    lines = []
    for item in fix_commands(rows, into):
        if "command" in item and item["command"].isprintable():
            lines.append(item["command"])
        elif "command" in item:  # a newline or other control character in a path: never a live line
            lines.append(f"# {printable(item['where'])}: its path holds control characters; rename the folder, then "
                         f"run: {printable(item['command'])}")
        else:
            lines.append(f"# {printable(item['where'])}: {printable(item['advice'])}")
    return "\n".join(lines)
