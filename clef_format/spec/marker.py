"""The version marker ``requires_clef_vllm``: a PEP 440 specifier read and written with ``packaging``.

``packaging`` is imported on first use: importing it costs about a third of what verify may spend
in total on a 9B checkpoint, and the usual marker, the one this project writes, needs no parse.
"""

from __future__ import annotations

from clef_format.errors import FormatError

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any

    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

from clef_format.spec.layouts import MARKER_KEY, MARKER_VALUE


class MarkerError(FormatError):
    """The marker is present but is not a specifier (nor a bare version)."""


def parse_marker(value: Any) -> SpecifierSet:
    """Parse a marker value. A bare version ``"0.2.0"`` reads as ``">=0.2.0"``."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    if not isinstance(value, str) or not value.strip():
        raise MarkerError(f"{MARKER_KEY} must be a non-empty string, got {value!r}")
    text = value.strip()
    try:
        spec = SpecifierSet(f">={Version(text)}")
    except InvalidVersion:
        spec = None
    except InvalidSpecifier as exc:  # a version that cannot stand after >= (a local version "1+1")
        raise MarkerError(f"{MARKER_KEY} = {value!r} is a version that cannot be a lower bound: {exc}") from None
    if spec is not None:
        return spec
    try:
        spec = SpecifierSet(text)
    except InvalidSpecifier as exc:
        raise MarkerError(f"{MARKER_KEY} = {value!r} is not a PEP 440 specifier: {exc}") from None
    if not len(spec):
        raise MarkerError(f"{MARKER_KEY} = {value!r} names no version")
    return spec


def check_marker(value: Any) -> None:
    """Raise ``MarkerError`` unless ``value`` is a valid marker. ``MARKER_VALUE``, which the tests prove
    ``packaging`` accepts, is known valid without importing it."""
    if value != MARKER_VALUE:
        parse_marker(value)


def read_marker(head_config: dict[str, Any]) -> SpecifierSet | None:
    """The marker of a joint head config, ``None`` when absent; raises ``MarkerError`` when invalid."""
    if MARKER_KEY not in head_config:
        return None
    return parse_marker(head_config[MARKER_KEY])


def with_marker(head_config: dict[str, Any], spec: str = MARKER_VALUE) -> dict[str, Any]:
    """A copy of the head config carrying the marker (validated before it is written)."""
    parse_marker(spec)
    out = dict(head_config)
    out[MARKER_KEY] = spec
    return out


def without_marker(head_config: dict[str, Any]) -> dict[str, Any]:
    """A copy without the marker: what ``JointSchemaHead(**config)`` accepts."""
    return {k: v for k, v in head_config.items() if k != MARKER_KEY}


def admits(spec: SpecifierSet, plugin_version: str | Version) -> bool:
    """Whether a plugin version satisfies the marker (pre-releases count as releases)."""
    from packaging.version import Version

    version = plugin_version if isinstance(plugin_version, Version) else Version(str(plugin_version))
    return spec.contains(version, prereleases=True)
