"""Render a Report for a person: layout, files, then each finding with its fix. Plain ANSI: nothing heavy on this path."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any

import os
import sys

from clef_format.spec.findings import Report

_COLOR = {"error": 31, "warning": 33, "info": 36, "green": 32}


def _use_color() -> bool:
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


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


def render_report(report: Report, title: str = "verify") -> str:
    d: dict[str, Any] = report.to_dict()
    errors = sum(f.severity == "error" for f in report.findings)
    warnings = sum(f.severity == "warning" for f in report.findings)
    verdict = style("OK", "green", True) if report.ok else style("BROKEN", "error", True)
    lines = [
        f"{style(title, bold=True)} {report.path}",
        f"  layout   {style(report.layout, bold=True)}",
        f"  result   {verdict}  ({errors} error(s), {warnings} warning(s))",
    ]
    files = d.get("files") or {}
    if files:
        total = sum(files.values())
        lines.append(f"  files    {len(files)} ({human_size(total)})")
        for rel, size in files.items():
            if rel.endswith((".safetensors", ".json")) or size > 10_000_000:
                lines.append(f"           {rel}  {human_size(size)}")
    for key in ("plugin_version",):
        if key in d:
            lines.append(f"  {key.replace('_', ' '):8} {d[key]}")
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
