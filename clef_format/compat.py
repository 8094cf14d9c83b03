"""Which plugin versions can serve which layout: the data, and the one check of a pair.

verify's ``--plugin-version`` and the vLLM hooks both call ``check_pair``; it raises
``IncompatibleError`` carrying a stable finding code, the reason and the fix.
``check_checkpoint`` is the serving-time gate: it reads a checkpoint's structure (headers only,
no torch), checks the pair, then refuses on any error verify's layout and tables checks find,
so a plugin never starts on files verify would reject.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Sequence, Union

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from .layouts import MARKER_VALUE, TABLES, Layout, migrate_command
from .marker import admits

if TYPE_CHECKING:
    from .checkpoint import Checkpoint
    from .findings import Finding

#: What the hooks accept as a checkpoint: a directory, a cached repo id, or one already read.
CheckpointSource = Union[str, "os.PathLike[str]", "Checkpoint"]

PLUGIN = "clef-vllm"

#: Plugin versions that can serve each layout. Layout 2 is served by what its marker admits;
#: ``None`` means no plugin version can serve it.
SERVED_BY: dict[Layout, SpecifierSet | None] = {
    Layout.LAYOUT_1: SpecifierSet("<0.2.0"),
    Layout.LAYOUT_2: SpecifierSet(MARKER_VALUE),
    Layout.LAYOUT_2_UNMARKED: None,
    Layout.ORIGINAL_RELEASE: None,
    Layout.UNKNOWN: None,
}


class IncompatibleError(RuntimeError):
    """A (checkpoint, plugin version) pair that must not be served."""

    def __init__(self, code: str, reason: str, fix: str, findings: Sequence["Finding"] = ()) -> None:
        super().__init__(f"[{code}] {reason}\n  fix: {fix}")
        self.code = code
        self.reason = reason
        self.fix = fix
        #: every error finding behind the refusal (``check_checkpoint``); empty for ``check_pair``
        self.findings = tuple(findings)


def check_pair(layout: Layout, marker: SpecifierSet | None, plugin_version: str, path: str = "PATH",
               snapshot: bool = False) -> None:
    """Raise ``IncompatibleError`` unless ``plugin_version`` of clef-vllm can serve this checkpoint."""
    try:
        version = Version(plugin_version)
    except InvalidVersion:
        raise IncompatibleError("plugin-incompatible", f"{plugin_version!r} is not a version",
                                f"pass the installed {PLUGIN} version, e.g. 0.2.1") from None
    if layout is Layout.LAYOUT_2_UNMARKED:
        raise IncompatibleError(
            "marker-missing",
            "int8 tables without a requires_clef_vllm marker (the 2026-10-07 downloads); no plugin may serve this",
            f"repair it: {migrate_command(path, 'layout-2', snapshot)}")
    if layout is Layout.ORIGINAL_RELEASE:
        raise IncompatibleError(
            "plugin-incompatible", f"the original BF16 release is served with transformers, not {PLUGIN}",
            "download a quantized split build of clef-flash")
    if layout is Layout.UNKNOWN:
        raise IncompatibleError("unknown-layout", "the files match no Clef layout",
                                f"run clef-format verify {path} and re-download what it reports")
    if layout is Layout.LAYOUT_1:
        spec = SERVED_BY[Layout.LAYOUT_1]
        assert spec is not None
        if not admits(spec, version):
            raise IncompatibleError(
                "plugin-incompatible",
                f"layout-1 (BF16 tables inside the backbone) needs {PLUGIN}{spec}; {PLUGIN} {version} expects int8 tables",
                f"migrate the weights: {migrate_command(path, 'layout-2', snapshot)}")
        return
    spec = marker if marker is not None else SERVED_BY[Layout.LAYOUT_2]
    assert spec is not None
    if not admits(spec, version):
        raise IncompatibleError(
            "plugin-incompatible",
            f"these weights require {PLUGIN}{spec}; {PLUGIN} {version} cannot serve them",
            f"install the plugin shipped with the checkpoint (pip install '{PLUGIN}{spec}'), "
            f"or for {PLUGIN} 0.1.x: {migrate_command(path, 'layout-1', snapshot)}")


def expects_int8_tables(plugin_version: str) -> bool:
    """Whether this plugin version reads the tables from the int8 file (i.e. layout-1 is not its layout)."""
    spec = SERVED_BY[Layout.LAYOUT_1]
    assert spec is not None
    return not admits(spec, plugin_version)


def _read(source: CheckpointSource) -> "Checkpoint":
    from .checkpoint import Checkpoint, read_checkpoint

    if isinstance(source, Checkpoint):
        return source
    from .hub import resolve

    return read_checkpoint(resolve(os.fspath(source)))


def check_checkpoint(source: CheckpointSource, plugin_version: str) -> "Checkpoint":
    """Refuse (``IncompatibleError``) a checkpoint this plugin version must not serve; else return it read.

    Order: the pair (``check_pair``: layout and marker against the version), then every error of
    reading the files and of verify's layout and tables checks (missing or misshapen tables file,
    bad headers, paths leaving the checkpoint ...). Headers only: no tensor data beyond the table
    scales' sign bits, no torch. Raises ``PathNotFound`` when the checkpoint does not exist.
    """
    from .checks.layout import check_layout
    from .checks.tables import check_tables
    from .marker import MarkerError, read_marker

    ck = _read(source)
    path, snapshot = str(ck.root), ck.hf_snapshot
    try:
        marker = read_marker(ck.head_config) if isinstance(ck.head_config, dict) else None
    except MarkerError as exc:
        raise IncompatibleError("marker-invalid", str(exc),
                                f"set the marker to \"{MARKER_VALUE}\": {migrate_command(path, 'layout-2', snapshot)}"
                                ) from None
    check_pair(ck.layout, marker, plugin_version, path=path, snapshot=snapshot)
    if ck.layout is Layout.LAYOUT_2 and not ck.has(TABLES) and TABLES not in ck.bad_headers:
        raise IncompatibleError("tables-missing", f"the marker says layout-2 but {TABLES} is missing",
                                f"download {TABLES} from the same revision of the checkpoint")
    errors = [f for f in (*ck.findings, *check_layout(ck), *check_tables(ck)) if f.severity == "error"]
    if errors:
        first = errors[0]
        more = f" (and {len(errors) - 1} more: {', '.join(sorted({f.code for f in errors[1:]}))})" if len(errors) > 1 else ""
        raise IncompatibleError(first.code, first.message + more,
                                first.fix or f"run clef-format verify {path} and fix what it reports", errors)
    return ck
