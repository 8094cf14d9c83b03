"""verify: read a checkpoint's structure, run every check, return one frozen Report."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any

    from clef_format.progress import Progress
    from clef_format.read.installed_plugin import InstalledPlugin
    from clef_format.verify.layers import LayersView
    from clef_format.verify.plugins import PluginRow

from clef_format.read.checkpoint import Checkpoint, open_checkpoint
from clef_format.records import Record
from clef_format.report import Report, make_report
from clef_format.spec.findings import COULD_NOT_RUN, Finding
from clef_format.verify.checks import CHECKS
from clef_format.verify.options import DEFAULTS, VerifyOptions
from clef_format.verify.vllm_build import VllmBuild, build_vllm


class VerifyDetails(Record):
    """verify's own keys: what was read (``files`` and the backbone), the plugins checked against the weights
    (``plugins``: ``None`` when none was), the vLLM version whose rules were asked for (``None``: the
    default, unstated) and the per-layer view when asked for and config.json gives one."""

    files: dict[str, int]
    backbone_files: list[str]
    backbone_tensors: int
    hf_snapshot: bool
    plugin_version: str | None = None
    plugins: tuple[PluginRow, ...] | None = None
    vllm_version: str | None = None
    layers: LayersView | None = None

    @property
    def capped_after(self) -> str | None:
        return "hf_snapshot"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.plugin_version is not None:
            out["plugin_version"] = self.plugin_version
        if self.plugins is not None:
            out["plugins"] = [row.to_dict() for row in self.plugins]
        out.update(files=dict(self.files), backbone_files=list(self.backbone_files),
                   backbone_tensors=self.backbone_tensors, hf_snapshot=self.hf_snapshot)
        if self.vllm_version is not None:
            out["vllm_version"] = self.vllm_version
        if self.layers is not None:
            out["layers"] = self.layers.to_dict()
        return out


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


def _plugins(ck: Checkpoint, display_path: str, plugin_version: str | None, bundled: bool,
             installed: InstalledPlugin | None) -> tuple[list[Finding], tuple[PluginRow, ...] | None]:
    """The plugins checked against the weights (``verify.plugins``): their findings and rows."""
    if not (bundled or plugin_version is not None or installed is not None):
        return [], None
    from clef_format.verify import plugins as P

    findings, rows = P.bundled_findings(ck, display_path) if bundled else ([], [])
    bundled_serves = bool(rows) and rows[0].can_serve is True
    if plugin_version is not None:
        found, row = P.argument_findings(ck, plugin_version, display_path)
        findings += found
        rows += row
    if installed is not None:
        found, row = P.installed_findings(ck, installed, display_path, bundled_serves=bundled_serves)
        findings += found
        rows += row
    return findings, tuple(rows)


def layers_of(ck: Checkpoint, vllm: VllmBuild | None) -> LayersView | None:
    """The per-layer view of ``clef-format layers`` from the build the checks used; ``None`` when config.json
    gives none (unparsed, or a quantization config vLLM refuses: verify reports both)."""
    if ck.model is None or vllm is None or vllm.refused is not None:
        return None
    from clef_format.spec.layouts import TABLES
    from clef_format.verify.layers import view_of

    return view_of(ck.model, vllm, int8_tables=ck.has(TABLES))


def read_after(ck: Checkpoint, findings: list[Finding]) -> list[Finding]:
    """A file that could not be read in full after the structure read succeeded (cut, rewritten, made
    unreadable while the checks or ``--deep`` read it): as when the structure read fails, only the reading
    findings stand, the reader's and the ``unreadable`` ones: what the checks said besides came from
    files not (or no longer) seen as they are, and would contradict them ("scales were still decoded")."""
    late = [f for f in findings[len(ck.findings):] if f.code == "unreadable"]
    if not late:
        return findings
    return list(ck.findings) + list({(f.file, f.message): f for f in late}.values())


def verify_checkpoint(ck: Checkpoint, display_path: str, options: VerifyOptions | None = None, *,
                      progress: Progress | None = None, bundled: bool = False,
                      installed: InstalledPlugin | None = None, plugin_version: str | None = None,
                      deep: bool | None = None) -> Report:
    """Every check on a checkpoint already read, as ``options`` say (without ``options``: ``plugin_version``
    and ``deep``, the earlier spelling, still taken). When a file could not be read, or the file the layout
    is decided by could not be read as JSON (``ck.layout_unread``), only the reading findings are
    reported: nothing is said about content that was never seen.

    The plugins (``verify.plugins``): ``bundled`` checks the one the folder ships in ``vllm_plugin/``
    (verify does; the serving gate and migrate's own verification do not: the gate serves with the
    installed plugin whatever the folder ships, and a migrated folder is checked by the verify after it);
    ``options.plugin_version`` (``--plugin-version``) and ``installed`` (the clef-vllm of an environment)
    are checked as given. Each plugin checked is a row of the report's ``plugins`` key.

    What vLLM builds from config.json (``VllmBuild``) is built once, on ``options.rules``, and shared by
    the checks and the per-layer view (``options.layers``)."""
    if options is None:
        options = VerifyOptions(plugin_version=plugin_version, deep=bool(deep)) if plugin_version or deep else DEFAULTS
    findings = list(ck.findings)
    vllm = None
    plugin_rows = None
    if not (ck.unreadable or ck.layout_unread):
        running = None
        if options.deep:
            from clef_format.verify.deep import DeepRun  # hashing and scale decoding live apart from the fast path

            running = DeepRun(ck, progress)  # hashing starts now; the checks below run in its shadow
        vllm = build_vllm(ck.model, options.rules) if ck.model is not None else None
        for check in CHECKS:
            findings.extend(check(ck, options, vllm))
        found, plugin_rows = _plugins(ck, ck.name, options.plugin_version, bundled, installed)
        findings += found
        if running is not None:
            findings.extend(running.finish())
        findings = read_after(ck, findings)
    view = None
    if options.layers and not any(f.code in COULD_NOT_RUN for f in findings):
        if vllm is None and ck.model is not None:  # checks skipped (the layout unread): the view stands on config.json
            vllm = build_vllm(ck.model, options.rules)
        view = layers_of(ck, vllm)
    details = VerifyDetails(**summary(ck), plugin_version=options.plugin_version if plugin_rows is not None else None,
                            plugins=plugin_rows, vllm_version=options.vllm_version, layers=view)
    return make_report("verify", display_path, str(ck.layout), findings, details)


def verify(path: str, plugin_version: str | None = None, deep: bool = False,
           options: VerifyOptions | None = None) -> Report:
    """Verify the checkpoint at ``path`` (a directory or a cached repo id), the plugin it ships in
    ``vllm_plugin/`` included, as ``options`` say (or ``plugin_version`` and ``deep``, the earlier spelling).
    Raises ``PathNotFound``."""
    options = options or VerifyOptions(plugin_version=plugin_version, deep=deep)
    return verify_checkpoint(open_checkpoint(path), path, options, bundled=True)
