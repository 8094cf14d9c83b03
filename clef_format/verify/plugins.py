"""Can the plugins the user has serve these weights? One pair rule (``spec.compat.check_pair``) applied
to each plugin verify was given or found, as findings plus one row per plugin for the report.

The plugins, and why each finding has its severity:

* ``bundled``: the clef-vllm a release ships in ``vllm_plugin/`` (read statically,
  ``read.plugin_source``). The card installs it with ``pip install ./<repo>/vllm_plugin``, so a
  version that cannot serve the weights beside it is a fact of the folder's own files: weights and
  plugin come from different revisions (the 2026-10-07 failure). ``bundled-plugin-mismatch``, an
  error. A version that cannot be read statically is a ``bundled-plugin-unread`` warning.
* ``argument``: ``--plugin-version V``, the explicit question. ``plugin-incompatible``, an error.
* ``installed`` / ``python``: the clef-vllm installed in the running interpreter, or in the
  environment of ``--python PATH`` (``read.installed_plugin``): the plugin ``vllm serve`` there would
  load. clef-vllm depends on clef-format, so an environment that has it is a serving environment;
  that it cannot serve these weights is a fact about what would happen there: ``plugin-incompatible``,
  an error. An environment without clef-vllm adds a row and no finding; one whose clef-vllm metadata
  gives no valid version is an ``installed-plugin-unread`` warning (nothing to check it with).

Only the plugin's own incompatibility is reported here: when no plugin at all may serve the weights
(``marker-missing``, ``marker-invalid``, ``unknown-layout``), the layout checks already say so and
the rows say ``can_serve: false`` without a second finding.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any

    from clef_format.read.checkpoint import Checkpoint
    from clef_format.read.installed_plugin import InstalledPlugin

from clef_format.records import Record
from clef_format.shell import quote_path
from clef_format.spec.layouts import PLUGIN_DIR
from clef_format.spec.findings import Finding, error, warning


def _pair(ck: Checkpoint, version: str, path: str, pip: str = "pip") -> tuple[str, str, str | None] | None:
    """``None`` when clef-vllm ``version`` can serve the checkpoint, else (code, reason, fix); ``pip`` as
    ``check_pair`` takes it."""
    from clef_format.errors import IncompatibleError
    from clef_format.spec.compat import check_pair  # packaging: only when a plugin version is checked
    from clef_format.spec.marker import MarkerError, read_marker

    try:
        marker = read_marker(ck.head_config) if isinstance(ck.head_config, dict) else None
    except MarkerError as exc:
        return "marker-invalid", f"the marker is invalid ({exc})", ""
    try:
        check_pair(ck.layout, marker, version, path=path, snapshot=ck.hf_snapshot, pip=pip)
    except IncompatibleError as exc:
        return exc.code, exc.reason, exc.fix
    return None


def _valid(version: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        Version(version)
    except InvalidVersion:
        return False
    return True


def plugin_dir_of(ck: Checkpoint, path: str) -> str:
    """How the user names the bundled plugin folder in ``pip install`` (the snapshot's real folder in a cache),
    quoted for the shell (``shell.quote_path``)."""
    return quote_path(os.path.join(ck.root if ck.hf_snapshot else path, PLUGIN_DIR))


class PluginRow(Record):
    """One plugin checked against the weights: where its version came from (``source``: bundled, argument,
    installed, python; ``where``), the version (``None``: not read, or nothing installed), whether it can
    serve them (``None``: not checked) and why not (``note``)."""

    source: str
    where: str
    version: str | None
    can_serve: bool | None = None
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"source": self.source, "where": self.where, "version": self.version, "can_serve": self.can_serve}
        if self.note is not None:
            out["note"] = self.note
        return out


def bundled_findings(ck: Checkpoint, path: str) -> tuple[list[Finding], list[PluginRow]]:
    """The plugin shipped in ``vllm_plugin/`` against the weights beside it."""
    if not os.path.lexists(ck.path(PLUGIN_DIR)):
        return [], []  # nothing shipped (the common case: the reader and its ast import are not loaded)
    from clef_format.read.plugin_source import read_bundled_plugin

    plugin = read_bundled_plugin(ck)
    if plugin is None:
        return [], []
    row = PluginRow("bundled", plugin.where, plugin.version)
    if plugin.version is None or not _valid(plugin.version):
        note = plugin.note or f"{plugin.where} gives {plugin.version!r}, which is not a PEP 440 version"
        row = row._replace(note=note)
        from clef_format.read.plugin_files import never_read

        if plugin.file == PLUGIN_DIR:  # not a folder: there is nothing pip can install from it
            unread_fix = (f"replace {PLUGIN_DIR} with the release's {PLUGIN_DIR}/ folder (download the whole repository "
                          f"again), then clef-format verify {quote_path(path)} again")
        elif never_read(ck, plugin.file) is not None:  # pip's build would read it too (and wait forever on a FIFO)
            unread_fix = (f"replace {plugin.file} with the real file (re-download it), then clef-format verify "
                          f"{quote_path(path)} again")
        else:
            unread_fix = (f"check the version pip reports after pip install {plugin_dir_of(ck, path)} "
                          f"(clef-format verify {quote_path(path)} then checks the installed one)")
        return [warning("bundled-plugin-unread", f"the version of the plugin shipped in {PLUGIN_DIR}/ could not be "
                        f"read: {note}; whether it can serve these weights is not known", file=plugin.file,
                        fix=unread_fix)], [row]
    problem = _pair(ck, plugin.version, path)
    row = row._replace(can_serve=problem is None)
    if problem is None or problem[0] != "plugin-incompatible":
        return [], [row]
    _, reason, fix = problem
    where = plugin.file
    return [error("bundled-plugin-mismatch",
                  f"the plugin shipped beside these weights, clef-vllm {plugin.version} ({plugin.where}), cannot serve "
                  f"them: {reason}. The weights and {PLUGIN_DIR}/ come from different revisions (weights pulled "
                  "without the rest of the repo)", file=where,
                  fix=f"pull the whole repo again (weights and {PLUGIN_DIR}/ of one revision), then reinstall the "
                      f"plugin from it: pip install {plugin_dir_of(ck, path)}; if you changed the weights yourself "
                      f"(clef-format migrate): {fix}")], [row]


def argument_findings(ck: Checkpoint, version: str, path: str) -> tuple[list[Finding], list[PluginRow]]:
    """``--plugin-version V``: the plugin the user named."""
    problem = _pair(ck, version, path)
    row = PluginRow("argument", "--plugin-version", version, problem is None)
    if problem is None:
        return [], [row]
    code, reason, fix = problem
    if code == "marker-invalid" and not fix:
        from clef_format.spec.compat import marker_fix

        reason, fix = f"{reason}; nothing may serve these weights", marker_fix(path, ck.hf_snapshot)
    return [error("plugin-incompatible", f"clef-vllm {version}: {reason}", fix=fix)], [row]


def installed_findings(ck: Checkpoint, found: InstalledPlugin, path: str,
                       bundled_serves: bool | None = None) -> tuple[list[Finding], list[PluginRow]]:
    """The clef-vllm of an environment (the running one, or ``--python PATH``); ``bundled_serves``: whether
    the plugin the folder ships can serve the weights (its install command is then the first fix)."""
    row = PluginRow(found.source, found.where, found.version)
    if found.version is None and found.location is None:
        return [], [row]  # not installed there
    pip = "pip" if found.source == "installed" else f"{quote_path(found.python)} -m pip"  # that environment's
    if found.version is None or not _valid(found.version):
        row = row._replace(note=f"its metadata gives {found.version!r}, which is not a PEP 440 version")
        here = "in this Python" if found.source == "installed" else "in the environment of --python"
        shipped = os.path.isdir(ck.path(PLUGIN_DIR))  # the release's own plugin, when the folder holds it
        source = plugin_dir_of(ck, path) if shipped else "clef-vllm"
        return [warning("installed-plugin-unread", f"the version of the clef-vllm installed {here} ({found.where}) "
                        f"cannot be read: {row.note}; whether it can serve these weights is not known",
                        fix=f"reinstall the plugin ({pip} install --force-reinstall {source}), then run verify "
                            "again")], [row]
    problem = _pair(ck, found.version, path, pip)
    row = row._replace(can_serve=problem is None)
    if problem is None or problem[0] != "plugin-incompatible":
        return [], [row]
    _, reason, fix = problem
    here = "in this Python" if found.source == "installed" else "in the environment of --python"
    if bundled_serves:
        fix = f"install the plugin shipped with these weights: {pip} install {plugin_dir_of(ck, path)}; or {fix}"
    return [error("plugin-incompatible", f"clef-vllm {found.version} installed {here} ({found.where}) cannot serve "
                  f"these weights: {reason}", fix=fix)], [row]
