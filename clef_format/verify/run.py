"""verify: read a checkpoint's structure, run every check, return one frozen Report."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any

    from clef_format.progress import Progress
    from clef_format.read.installed_plugin import InstalledPlugin

from clef_format.read.checkpoint import Checkpoint, open_checkpoint
from clef_format.report import Report, ReportDraft
from clef_format.spec.findings import Finding
from clef_format.verify.checks import CHECKS


def plugin_findings(ck: Checkpoint, plugin_version: str, path: str) -> list[Finding]:
    """What ``--plugin-version`` adds: the pair check of ``spec.compat``, as a finding."""
    from clef_format.verify.plugins import argument_findings

    return argument_findings(ck, plugin_version, path)[0]


def summary(ck: Checkpoint) -> dict[str, Any]:
    return {
        "files": {rel: size for rel, size in sorted(ck.files.items())},
        "backbone_files": ck.backbone_files,
        "backbone_tensors": len(ck.backbone),
        "hf_snapshot": ck.hf_snapshot,
    }


def verify_checkpoint(ck: Checkpoint, display_path: str, plugin_version: str | None = None,
                      deep: bool = False, progress: Progress | None = None, bundled: bool = False,
                      installed: InstalledPlugin | None = None) -> Report:
    """Every check on a checkpoint already read. When a file could not be read, or the file the layout
    is decided by could not be read as JSON (``ck.layout_unread``), only the reading findings are
    reported: nothing is said about content that was never seen.

    The plugins (``verify.plugins``): ``bundled`` checks the one the folder ships in ``vllm_plugin/``
    (verify does; the serving gate and migrate's own verification do not: the gate serves with the
    installed plugin whatever the folder ships, and a migrated folder is checked by the verify after it);
    ``plugin_version`` (``--plugin-version``) and ``installed`` (the clef-vllm of an environment) are
    checked as given. Each plugin checked is a row of the report's ``plugins`` key."""
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
    if bundled or plugin_version is not None or installed is not None:
        from clef_format.verify import plugins as P

        found, rows = P.bundled_findings(ck, display_path) if bundled else ([], [])
        report.extend(found)
        bundled_serves = bool(rows) and rows[0]["can_serve"] is True
        if plugin_version is not None:
            found, row = P.argument_findings(ck, plugin_version, display_path)
            report.extend(found)
            rows.extend(row)
        if installed is not None:
            found, row = P.installed_findings(ck, installed, display_path,
                                              bundled_serves=bundled_serves)
            report.extend(found)
            rows.extend(row)
        if plugin_version is not None:
            report.extra["plugin_version"] = plugin_version
        report.extra["plugins"] = rows
    if running is not None:
        report.extend(running.finish())
    report.extra.update(summary(ck))
    return report.freeze("verify")


def verify(path: str, plugin_version: str | None = None, deep: bool = False) -> Report:
    """Verify the checkpoint at ``path`` (a directory or a cached repo id), the plugin it ships in
    ``vllm_plugin/`` included. Raises ``PathNotFound``."""
    return verify_checkpoint(open_checkpoint(path), path, plugin_version=plugin_version, deep=deep, bundled=True)
