"""Which plugin versions can serve which layout: the data, and the one pure check of a pair.

verify's ``--plugin-version``, verify's marker check and the serving gate (``clef_format.vllm.gate``)
all call into this module; ``check_pair`` raises ``IncompatibleError`` carrying a stable finding
code, the reason and the fix. ``packaging`` parses versions; nothing here reads a file.

The rule, whatever a marker says:

* layout-1 (BF16 tables inside the backbone) is served only by clef-vllm 0.1.x;
* layout-2 (int8 tables + marker) is served only by clef-vllm >= 0.2.0, and only by versions its
  marker admits. A marker that admits any version outside ``>=0.2.0`` (e.g. ``==0.1.4``) or none at
  all (``>=0.2,<0.2``) is invalid (``marker-invalid``): it would let a plugin that reads BF16 tables
  the backbone does not hold start, or let nothing start.
* Pre-releases follow PEP 440, as pip sees them: a pre-release belongs to the release it precedes,
  so ``0.2.0rc1`` (and ``0.2.0.dev1``) is a 0.2 plugin: it can serve only layout-2, and only where the
  marker admits it under PEP 440 ordering (``>=0.2.0`` does not: ``0.2.0rc1 < 0.2.0``; a marker
  ``>=0.2.0rc1`` does). ``0.1.5rc1`` is a 0.1 plugin and serves layout-1. Versions below 0.1 serve nothing.
"""

from __future__ import annotations

from packaging.specifiers import Specifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from clef_format.errors import IncompatibleError
from clef_format.shell import quote, quote_path
from clef_format.spec.layouts import HEAD_CONFIG, MARKER_KEY, MARKER_VALUE, Layout, migrate_command
from clef_format.spec.marker import admits

PLUGIN = "clef-vllm"

#: The plugin versions that can serve each layout (pre-releases included: see the module doc);
#: ``None`` means no plugin version can serve it. A layout-2 checkpoint is further limited by its marker.
SERVED_BY: dict[Layout, SpecifierSet | None] = {
    Layout.LAYOUT_1: SpecifierSet(">=0.1.0.dev0,<0.2.0.dev0"),
    Layout.LAYOUT_2: SpecifierSet(">=0.2.0.dev0"),
    Layout.LAYOUT_2_UNMARKED: None,
    Layout.ORIGINAL_RELEASE: None,
    Layout.UNKNOWN: None,
}

#: The lowest version layout-2 may admit: its marker must not admit anything below it.
LAYOUT_2_FLOOR = Version("0.2.0.dev0")

_ZERO = Version("0.dev0")  # the lowest PEP 440 version a specifier can admit (epoch 0)


def _next_prefix(release: tuple[int, ...]) -> Version:
    """The first version after every version starting with ``release`` (``0.2`` -> ``0.3.dev0``)."""
    bumped = (*release[:-1], release[-1] + 1)
    return Version(".".join(map(str, bumped)) + ".dev0")


def _lower_bound(spec: Specifier) -> tuple[Version, bool] | None:
    """(lowest version, inclusive) this one specifier admits; ``None`` when it sets no lower bound."""
    op, text = spec.operator, spec.version
    if op == "===":
        try:
            return Version(text), True
        except InvalidVersion:
            return _ZERO, True  # an arbitrary string: nothing can be said of it; treated as unbounded
    if op in ("<", "<=", "!="):
        return None
    if op == "==" and text.endswith(".*"):
        return Version(text[:-2] + ".dev0"), True
    v = Version(text.split("+")[0])
    if op in ("==", ">=", "~="):
        return v, True
    if op == ">":
        return v, False
    return None


def _parsed(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _witnesses(spec: SpecifierSet, low: Version) -> list[Version]:
    """Candidate versions to prove a marker admits at least one: its bounds and their neighbours
    (each built as text and parsed, so a bound with a dev, pre, post or local part never crashes)."""
    out = [low]
    for s in spec:
        text = s.version.removesuffix(".*")
        v = _parsed(text)
        if v is None:
            continue
        r = ".".join(map(str, v.release))
        bumped = ".".join(map(str, (*v.release[:-1], v.release[-1] + 1)))
        for candidate in (text, v.public, v.base_version, f"{v.base_version}.post{(v.post or 0) + 1}",
                          f"{r}.dev{(v.dev or 0) + 1}", bumped, f"{r}.1", f"{bumped}.dev0"):
            w = _parsed(candidate)
            if w is not None:
                out.append(w)
    return out


def marker_problem(marker: SpecifierSet) -> str | None:
    """Why a (parsed) layout-2 marker is unacceptable, or ``None``: it must admit at least one version
    and none outside ``>=0.2.0`` (pre-releases of 0.2.0 count as inside, as for the plugin)."""
    if str(marker) == MARKER_VALUE:
        return None
    low = _ZERO
    for s in marker:
        lb = _lower_bound(s)
        if lb is not None and lb[0] > low:
            low = lb[0]
    admitted = [v for v in _witnesses(marker, low) if marker.contains(v, prereleases=True)]
    if not admitted:  # not one of its bounds and their neighbours (the versions where an answer can change)
        return f"{MARKER_KEY} = {str(marker)!r} admits no version at all: no plugin could serve these weights"
    if low < LAYOUT_2_FLOOR:
        below = sorted(v for v in admitted if v < LAYOUT_2_FLOOR)
        if below:
            return (f"{MARKER_KEY} = {str(marker)!r} admits versions below 0.2.0 (e.g. {below[0]}), which read BF16 "
                    "tables that a layout-2 backbone does not hold")
        # exclusions (!=, !=X.*) may leave nothing below 0.2.0, but that is not proven here: refuse, saying so
        return (f"{MARKER_KEY} = {str(marker)!r} is bounded below by {low}, not 0.2.0: it may admit versions "
                "below 0.2.0, which read BF16 tables that a layout-2 backbone does not hold")
    return None


def marker_fix(path: str = "PATH", snapshot: bool = False) -> str:
    """How to repair an invalid marker (an edit: no migration changes a layout-2 marker)."""
    edit = f"set \"{MARKER_KEY}\": \"{MARKER_VALUE}\" in {HEAD_CONFIG}"
    if snapshot:
        return f"copy {path} out of the Hugging Face cache (never edit a snapshot), then {edit} of the copy"
    return edit


def _version(plugin_version: str) -> Version:
    try:
        return Version(plugin_version)
    except InvalidVersion:
        raise IncompatibleError("plugin-incompatible", f"{plugin_version!r} is not a version",
                                f"pass the installed {PLUGIN} version, e.g. 0.2.1") from None


def plugin_version_argument(value: object, name: str = "plugin_version", example: str = "'0.2.1'") -> str:
    """A plugin version as a caller gives it, as the text the rules take: what ``verify --plugin-version``
    takes (any PEP 440 version string) or a ``packaging.version.Version``. Anything else is the
    caller's mistake, a ``UsageError`` with a fix, never a refusal of the checkpoint nor a TypeError."""
    from clef_format.errors import UsageError

    fix = f"pass the installed {PLUGIN} version, e.g. {example}"
    if isinstance(value, Version):
        return str(value)
    if not isinstance(value, str):
        raise UsageError(f"{name} {value!r} ({type(value).__name__}) is not a version string or a "
                         "packaging.version.Version", fix=fix)
    try:
        Version(value)
    except InvalidVersion:
        raise UsageError(f"{name} {value!r} is not a version", fix=fix) from None
    return value


def served_layout(plugin_version: str) -> Layout | None:
    """The one layout this plugin version can serve (``None`` for versions below 0.1)."""
    version = _version(plugin_version)
    for layout in (Layout.LAYOUT_1, Layout.LAYOUT_2):
        spec = SERVED_BY[layout]
        if spec is not None and admits(spec, version):
            return layout
    return None


def check_pair(layout: Layout, marker: SpecifierSet | None, plugin_version: str, path: str = "PATH",
               snapshot: bool = False, pip: str = "pip") -> None:
    """Raise ``IncompatibleError`` unless ``plugin_version`` of clef-vllm can serve this checkpoint.

    ``marker`` is the parsed marker of a layout-2 checkpoint (``None``: the default ``>=0.2.0``).
    ``pip``: the install command of the environment the plugin was found in (``PY -m pip`` for another
    interpreter's), so that an install fix changes that environment, not whichever pip is first on PATH.
    """
    version = _version(plugin_version)
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
                                f"run clef-format verify {quote_path(path)} and re-download what it reports")
    own = served_layout(plugin_version)
    if own is None:
        raise IncompatibleError(
            "plugin-incompatible", f"{PLUGIN} {version} is older than any plugin that serves a Clef split checkpoint",
            f"install {PLUGIN}{MARKER_VALUE} (layout-2: {pip} install {quote(f'{PLUGIN}{MARKER_VALUE}')}) or "
            f"{PLUGIN} 0.1.x (layout-1)")
    if layout is Layout.LAYOUT_1:
        if own is not Layout.LAYOUT_1:
            fix = f"migrate the weights: {migrate_command(path, Layout.LAYOUT_2, snapshot)}"
            if not admits(SpecifierSet(MARKER_VALUE), version):
                fix += (f", then serve them with a release {PLUGIN}{MARKER_VALUE}: the marker migrate writes "
                        f"does not admit the pre-release {version} (PEP 440: it sorts before 0.2.0)")
            raise IncompatibleError(
                "plugin-incompatible",
                f"layout-1 (BF16 tables inside the backbone) is served only by {PLUGIN} 0.1.x; "
                f"{PLUGIN} {version} expects int8 tables", fix)
        return
    spec = marker if marker is not None else SpecifierSet(MARKER_VALUE)
    problem = marker_problem(spec)
    if problem is not None:
        raise IncompatibleError("marker-invalid", problem, marker_fix(path, snapshot))
    if own is not Layout.LAYOUT_2:
        raise IncompatibleError(
            "plugin-incompatible",
            f"layout-2 (int8 tables) is served only by {PLUGIN}>=0.2.0 (here: {spec}); "
            f"{PLUGIN} {version} reads BF16 tables from the backbone",
            f"install a {PLUGIN} the weights admit ({pip} install {quote(f'{PLUGIN}{spec}')}), "
            f"or for {PLUGIN} 0.1.x: {migrate_command(path, Layout.LAYOUT_1, snapshot)}")
    if not admits(spec, version):
        raise IncompatibleError(
            "plugin-incompatible",
            f"these weights require {PLUGIN}{spec}; {PLUGIN} {version} cannot serve them"
            + (" (a pre-release sorts before its release under PEP 440)" if version.is_prerelease else ""),
            f"install a {PLUGIN} the weights admit ({pip} install {quote(f'{PLUGIN}{spec}')})")


def expects_int8_tables(plugin_version: str) -> bool:
    """Whether this plugin version reads the tables from the int8 file (it serves layout-2)."""
    return served_layout(plugin_version) is Layout.LAYOUT_2


def servable_by(layout: Layout, head_config: object) -> str:
    """Which clef-vllm versions can serve a checkpoint, in words: the one pair rule above, read from the
    layout and the marker of its head config (``none`` when nothing may serve it)."""
    from clef_format.spec.marker import MarkerError, read_marker

    if layout is Layout.LAYOUT_1:
        return f"{PLUGIN} 0.1.x"
    if layout is not Layout.LAYOUT_2:
        return "none"
    try:
        marker = read_marker(head_config) if isinstance(head_config, dict) else None
    except MarkerError:
        return "none (invalid marker)"
    spec = marker if marker is not None else SpecifierSet(MARKER_VALUE)
    return "none (invalid marker)" if marker_problem(spec) is not None else f"{PLUGIN}{spec}"
