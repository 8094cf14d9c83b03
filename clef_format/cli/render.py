"""Everything the CLI shows a person: reports (verify, migrate, manifest), the per-layer view, migration
plans. Plain ANSI, nothing heavy: this is on the structure path of verify."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any

    from clef_format.migrate.details import MigrateDetails
    from clef_format.migrate.manifest_writer import ManifestDetails
    from clef_format.verify.layers import LayersView
    from clef_format.verify.plugins import PluginRow
    from clef_format.verify.run import VerifyDetails
    from clef_format.verify.scan import Row, ScanDetails

import os
import sys

from clef_format.report import Report

_COLOR = {"error": 31, "warning": 33, "info": 36, "green": 32}


def _use_color() -> bool:
    return sys.stdout is not None and sys.stdout.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def style(text: str, color: str | None = None, bold: bool = False) -> str:
    """ANSI styling when stdout is a terminal (no dependency on the fast path)."""
    if not _use_color():
        return text
    codes = ([str(_COLOR[color])] if color else []) + (["1"] if bold else [])
    return f"\x1b[{';'.join(codes)}m{text}\x1b[0m" if codes else text


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


def render_report(report: Report, title: str | None = None, layout_text: str | None = None,
                  verified: VerifyDetails | None = None) -> str:
    """The report's header and findings; ``verified``: verify's details, whose files and plugins it lists."""
    errors = sum(f.severity == "error" for f in report.findings)
    warnings = sum(f.severity == "warning" for f in report.findings)
    verdict = style("OK", "green", True) if report.ok else style("BROKEN", "error", True)
    lines = [
        f"{style(title or report.command, bold=True)} {report.path}",
        "  layout   " + (layout_text or (style(report.layout, bold=True) if report.layout is not None
                                        else "- (no checkpoint there)")),
        f"  result   {verdict}  ({errors} error(s), {warnings} warning(s))",
    ]
    files = verified.files if verified is not None else {}
    if files:
        total = sum(files.values())
        shown = {rel: size for rel, size in files.items() if rel.endswith((".safetensors", ".json")) or size > 10_000_000}
        rest = len(files) - len(shown)
        lines.append(f"  files    {len(files)} ({human_size(total)})" + (f", {rest} small file(s) not listed" if rest else ""))
        for rel, size in shown.items():
            lines.append(f"           {rel}  {human_size(size)}")
    if verified is not None and verified.plugin_version is not None:
        lines.append(f"  {'plugin version':8} {verified.plugin_version}")
    for i, row in enumerate((verified.plugins if verified is not None else None) or ()):
        lines.append(("  plugins  " if i == 0 else "           ") + plugin_line(row))
    if report.findings:
        lines.append("")
    order = {"error": 0, "warning": 1, "info": 2}
    for f in sorted(report.findings, key=lambda f: order[f.severity]):
        where = " ".join(x for x in (f.file, f.module or f.tensor) if x)
        head = style(f"{f.severity.upper():7}", f.severity, True)
        lines.append(f"{head} {style(f.code, bold=True)}" + (f"  [{where}]" if where else ""))
        lines.append(f"        {f.message}")
        if f.fix:
            lines.append(f"        fix: {f.fix}")
    return "\n".join(lines)


_PLUGIN_SOURCE = {"bundled": "shipped in", "argument": "given as", "installed": "installed in", "python": "installed in"}


def plugin_line(row: PluginRow) -> str:
    """One plugin checked against the weights: which, where its version came from, and the answer."""
    where = f"{_PLUGIN_SOURCE.get(row.source, row.source)} {row.where}"
    if row.version is None:
        if row.source != "bundled":
            return f"{row.source:9} no clef-vllm installed in {row.where}"
        return f"{row.source:9} version not read ({where})" + (f": {row.note}" if row.note else "")
    answer = {True: "can serve these weights", False: style("cannot serve these weights", "error", True),
              None: "not checked" + (f": {row.note}" if row.note else "")}[row.can_serve]
    return f"{row.source:9} clef-vllm {row.version} ({where}): {answer}"


def render_verify(report: Report) -> str:
    """``clef-format verify``: the report, then the per-layer view when it was asked for and given."""
    details: VerifyDetails = report.details  # type: ignore[assignment]
    text = render_report(report, verified=details)
    return text + ("\n\n" + render_layers(details.layers) if details.layers is not None else "")


def render_example(report: Report) -> str:
    """``clef-format example``: verify's report of what it built (its files and plugins when it verified)."""
    return render_report(report, verified=report.details.verified)  # type: ignore[attr-defined]


def render_layers(view: LayersView) -> str:
    """A plain-text table of the scheme per layer and the memory estimate."""
    from clef_format.verify.layers import GIB, HEADROOM_BYTES

    lines = [f"{view.arch}: {len(view.rows)} decoder layers"]
    for r in view.rows:
        groups = ", ".join(f"{k}={v}" for k, v in r.groups.items())
        lines.append(f"  {r.index:3d} {r.attention:17s} {groups}")
    for k, v in view.other.items():
        lines.append(f"  {k}: {v}")
    verdict = "fits" if view.fits_16gb else "does NOT fit"
    lines.append(f"weights in vLLM: {view.weight_bytes / GIB:.2f} GiB; {verdict} a 16 GB card once "
                 f"{HEADROOM_BYTES / GIB:.1f} GiB are reserved for context, activations and KV cache")
    return "\n".join(lines)


def render_layers_report(report: Report) -> str:
    """``clef-format layers``: the findings (all of them when there is no view), the rules' vLLM version and
    the view."""
    from clef_format.verify.layers import LayersDetails

    details = report.details
    if not isinstance(details, LayersDetails) or details.view is None:
        return render_report(report, title="layers")
    parts = [render_report(report, title="layers")] if report.findings else []
    parts += [f"vLLM {details.vllm_version} rules", render_layers(details.view)]
    return "\n\n".join(parts)


def render_manifest(report: Report) -> str:
    """``clef-format manifest``: one line saying what was written (then what ``--force`` wrote past, if
    anything), or the report of why nothing was."""
    d: ManifestDetails = report.details  # type: ignore[assignment]
    if d.written:
        wrote = f"wrote {d.written}: {d.files} file(s), {(d.bytes or 0) / 1e9:.2f} GB, {d.algorithm}"
        return wrote + ("\n\n" + render_report(report, title="manifest") if report.findings else "")
    return render_report(report, title="manifest")


def _quality_lines(quality: dict[str, dict[str, float]]) -> list[str]:
    lines = []
    for table, q in sorted(quality.items()):
        lines.append(f"  {table}: relative error {q['rel_error'] * 100:.3f}%, mean row cosine {q['mean_row_cosine']:.7f}, "
                     f"worst row cosine {q['min_row_cosine']:.7f}, worst row relative error {q['max_row_rel_error'] * 100:.3f}%")
    return lines


def _plan_lines(plan_dict: dict[str, Any]) -> list[str]:
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


def render_migrate(report: Report) -> str:
    d: MigrateDetails = report.details  # type: ignore[assignment]
    layout_text = None
    if d.output and d.result and report.layout is not None and report.layout != d.from_layout:
        # PATH was only read: its layout is the one it had; the new layout is the output's
        layout_text = (f"{d.from_layout} (unchanged); the result in {d.result} is "
                       f"{style(report.layout, bold=True)}")
    lines = [render_report(report, layout_text=layout_text)]
    if d.revision is not None:
        lines.append(f"  revision {d.revision}")
    if d.pending:  # its own line, whether or not there is a revision to name
        lines.append(f"  pending  interrupted run: {d.pending}")
    for note in d.recovered:
        lines.append(f"  recovery {note}")
    said = [d.message or ""] + [f.message for f in report.findings]
    if d.dry_run and d.recovery and report.ok and not any(d.recovery in text for text in said):  # as in the JSON
        lines.append(f"  recovery not done yet; the run would do this first: {d.recovery}")
    for step in d.steps:
        lines.append("")
        lines.extend(_plan_lines(step.plan))
        if step.quality:
            lines.append("  int8 table quality:")
            lines.extend(_quality_lines(step.quality))
        if step.carried_by:
            lines.append("  unchanged files came over by " + ", ".join(f"{k} x{v}" for k, v in step.carried_by.items()))
    if d.dry_run:
        lines.append("")
        lines.append("dry run: nothing was written")
    if d.message:
        lines.append("")
        lines.append(d.message)
    return "\n".join(lines)


def render_history(report: Report) -> str:
    """``migrate --history``: the chain of steps."""
    lines = ["base = layout-1 (BF16 tables in the backbone)"]
    for h in report.details.values["history"]:  # type: ignore[attr-defined]
        arrow = "<->" if h["reversible"] else " ->"
        lines.append(f"{h['revision']:20} {h['from']} {arrow} {h['to']}   (down_revision {h['down_revision']}): "
                     f"{h['description']}")
    return "\n".join(lines)


def printable(text: str) -> str:
    """``text`` on one line: control characters (a newline in a folder name) escaped, as Python writes them."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _where(row: Row) -> str:
    c = row.copy
    if c.repo_id and c.revision:
        refs = f" ({', '.join(c.refs)})" if c.refs else ""
        return printable(f"{c.repo_id}@{c.revision[:12]}{refs}")
    return printable(str(c.display))


def render_scan(report: Report) -> str:
    """One table of copies (worst first, each column as wide as its widest cell) and a one-line summary."""
    d: ScanDetails = report.details  # type: ignore[assignment]
    colors = {"BROKEN": "error", "unreadable": "error", "warnings": "warning", "OK": "green"}
    header = ("WHERE", "LAYOUT", "VERDICT", "SERVES WITH", "SIZE", "FIX")
    cells = [(_where(r), r.report.layout or "-", r.verdict, r.serves_with, human_size(r.size),
              " ".join((r.fix or "-").split())) for r in d.rows]
    widths = [max(len(c[i]) for c in [header, *cells]) for i in range(len(header) - 1)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)) + "  " + header[-1]]
    for c in cells:
        verdict = style(c[2].ljust(widths[2]), colors.get(c[2]), True)
        lines.append("  ".join([c[0].ljust(widths[0]), c[1].ljust(widths[1]), verdict, c[3].ljust(widths[3]),
                                c[4].rjust(widths[4]), c[5]]))
    t = d.totals
    lines.append("")
    lines.append(f"{t.copies} copies: {t.broken} broken, {t.unreadable} unreadable, "
                 f"{t.to_migrate} to migrate, {t.to_redownload} to re-download; "
                 f"{human_size(t.bytes)} in all ({', '.join(d.roots)})")
    for f in report.findings:
        if f.code == "scan-limit":
            lines.append(f"{style('WARNING', 'warning', True)} scan-limit  {f.message}")
    if not d.rows:
        lines[0:1] = [f"no Clef copy found under {', '.join(d.roots)}"]
    return "\n".join(lines)
