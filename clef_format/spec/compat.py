"""Which plugin versions can serve which layout: the data, and the one pure check of a pair.

verify's ``--plugin-version`` and the serving gate (``clef_format.vllm.gate``) both call
``check_pair``; it raises ``IncompatibleError`` carrying a stable finding code, the reason and the fix.
``packaging`` parses versions; nothing here reads a file.
"""

from __future__ import annotations

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from clef_format.errors import IncompatibleError
from clef_format.spec.layouts import MARKER_VALUE, Layout, migrate_command
from clef_format.spec.marker import admits

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
            f"repair it: {migrate_command(path, Layout.LAYOUT_2, snapshot)}")
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
                f"migrate the weights: {migrate_command(path, Layout.LAYOUT_2, snapshot)}")
        return
    spec = marker if marker is not None else SERVED_BY[Layout.LAYOUT_2]
    assert spec is not None
    if not admits(spec, version):
        raise IncompatibleError(
            "plugin-incompatible",
            f"these weights require {PLUGIN}{spec}; {PLUGIN} {version} cannot serve them",
            f"install the plugin shipped with the checkpoint (pip install '{PLUGIN}{spec}'), "
            f"or for {PLUGIN} 0.1.x: {migrate_command(path, Layout.LAYOUT_1, snapshot)}")


def expects_int8_tables(plugin_version: str) -> bool:
    """Whether this plugin version reads the tables from the int8 file (i.e. layout-1 is not its layout)."""
    spec = SERVED_BY[Layout.LAYOUT_1]
    assert spec is not None
    return not admits(spec, plugin_version)
