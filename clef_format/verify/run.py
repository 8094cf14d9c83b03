"""verify: read a checkpoint's structure, run every check, return one frozen Report."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any

    from clef_format.progress import Progress

from clef_format.read.checkpoint import Checkpoint, open_checkpoint
from clef_format.report import Report, ReportDraft
from clef_format.spec.findings import Finding, error
from clef_format.verify.checks import CHECKS


def plugin_findings(ck: Checkpoint, plugin_version: str, path: str) -> list[Finding]:
    """What ``--plugin-version`` adds: the pair check of ``spec.compat``, as a finding."""
    from clef_format.errors import IncompatibleError
    from clef_format.spec.compat import check_pair  # packaging: only when a version is asked about
    from clef_format.spec.marker import MarkerError, read_marker

    try:
        marker = read_marker(ck.head_config) if isinstance(ck.head_config, dict) else None
    except MarkerError as exc:
        from clef_format.spec.compat import marker_fix

        return [error("plugin-incompatible", f"clef-vllm {plugin_version}: the marker is invalid ({exc}); nothing may serve these weights",
                      fix=marker_fix(path, ck.hf_snapshot))]
    try:
        check_pair(ck.layout, marker, plugin_version, path=path, snapshot=ck.hf_snapshot)
    except IncompatibleError as exc:
        return [error("plugin-incompatible", f"clef-vllm {plugin_version}: {exc.reason}", fix=exc.fix)]
    return []


def summary(ck: Checkpoint) -> dict[str, Any]:
    return {
        "files": {rel: size for rel, size in sorted(ck.files.items())},
        "backbone_files": ck.backbone_files,
        "backbone_tensors": len(ck.backbone),
        "hf_snapshot": ck.hf_snapshot,
    }


def verify_checkpoint(ck: Checkpoint, display_path: str, plugin_version: str | None = None,
                      deep: bool = False, progress: Progress | None = None) -> Report:
    """Every check on a checkpoint already read. When a file could not be read, or the file the layout
    is decided by could not be read as JSON (``ck.layout_unread``), only the reading findings are
    reported: nothing is said about content that was never seen."""
    report = ReportDraft(display_path, str(ck.layout))
    report.extend(ck.findings)
    if ck.unreadable or ck.layout_unread:
        report.extra.update(summary(ck))
        return report.freeze("verify")
    running = None
    if deep:
        from clef_format.verify.deep import DeepRun  # hashing and scale decoding live apart from the fast path

        running = DeepRun(ck, progress)  # hashing starts now; the checks below run in its shadow
    for check in CHECKS:
        report.extend(check(ck))
    if plugin_version is not None:
        report.extend(plugin_findings(ck, plugin_version, display_path))
        report.extra["plugin_version"] = plugin_version
    if running is not None:
        report.extend(running.finish())
    report.extra.update(summary(ck))
    return report.freeze("verify")


def verify(path: str, plugin_version: str | None = None, deep: bool = False) -> Report:
    """Verify the checkpoint at ``path`` (a directory or a cached repo id). Raises ``PathNotFound``."""
    return verify_checkpoint(open_checkpoint(path), path, plugin_version=plugin_version, deep=deep)
