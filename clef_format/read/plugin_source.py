"""The clef-vllm version of the plugin a release ships in ``vllm_plugin/``, read statically.

The release's card installs the plugin with ``pip install ./<repo>/vllm_plugin``, so that folder's
version is the plugin a user serves these weights with. It is data: nothing in it is imported or run.
The version is read as the build backend pip would run reads it (``read.plugin_backends.build_backend``):
setuptools (``read.plugin_setuptools``: pyproject.toml, setup.py, setup.cfg and the modules their
``attr:`` names), hatchling, flit-core, poetry-core, pdm-backend (``read.plugin_backends``). The
distribution name must be clef-vllm (PEP 503 normalisation). What cannot be read exactly (a file too
large, not UTF-8, a syntax error; a version set from version control or by code when the build runs;
another backend) gives a note naming the file and why instead of a version, never an exception and
never a guess.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from clef_format.read.checkpoint import Checkpoint

from clef_format.read.plugin_files import PACKAGING_FILES, PYPROJECT, Unread, canonical_name, never_read
from clef_format.records import Record
from clef_format.spec.layouts import PLUGIN_DIR  # the folder a release ships its plugin in

#: The distribution name the folder must declare (canonical form, PEP 503).
PLUGIN_NAME = "clef-vllm"


class BundledPlugin(Record):
    """What ``vllm_plugin/`` says about itself: ``version`` and the file it came from (``where``, a
    checkpoint-relative path with the key), or ``version=None`` and a ``note`` saying why not (``where``
    is then the file the note is about)."""

    where: str
    version: str | None
    note: str = ""

    @property
    def file(self) -> str:
        """The checkpoint-relative file alone (``where`` without the key)."""
        return self.where.split(" ")[0]


def _read(ck: Checkpoint) -> tuple[str | None, str | None, str | None]:
    """(name, version, where) as the folder's build backend builds it; ``Unread`` otherwise."""
    from clef_format.read.plugin_backends import LEGACY_BACKEND, READERS, SCM_BACKENDS, build_backend

    backend = build_backend(ck)
    if backend in ("setuptools.build_meta", LEGACY_BACKEND):
        from clef_format.read.plugin_setuptools import read_setuptools

        return read_setuptools(ck)
    if backend in READERS:
        return READERS[backend][1](ck)
    if backend in SCM_BACKENDS:
        raise Unread(PYPROJECT, f"{PYPROJECT} builds with {backend}: {SCM_BACKENDS[backend]} sets the version from "
                                "version control (git tags) when the build runs")
    known = ", ".join(["setuptools", *(name for name, _ in READERS.values())])
    raise Unread(PYPROJECT, f"{PYPROJECT} builds with {backend!r}, a backend whose version clef-format does not read "
                            f"statically (it reads {known})")


def read_bundled_plugin(ck: Checkpoint) -> BundledPlugin | None:
    """The plugin a checkpoint ships in ``vllm_plugin/`` (``None`` when it ships none). Only files the
    reader listed inside the checkpoint are opened (a symlink leading out was never listed)."""
    inside = [rel for rel in ck.files if rel.startswith(PLUGIN_DIR + "/")]
    if not inside and not os.path.isdir(ck.path(PLUGIN_DIR)):
        if PLUGIN_DIR in ck.files or os.path.lexists(ck.path(PLUGIN_DIR)):
            return BundledPlugin(PLUGIN_DIR, None, f"{PLUGIN_DIR} is not a folder (pip install ./{PLUGIN_DIR} "
                                                   "cannot install a plugin from it)")
        return None
    for rel in PACKAGING_FILES:  # the files pip's build reads first, there but never opened
        why = never_read(ck, rel)
        if why is not None:
            return BundledPlugin(rel, None, why)
    try:
        name, version, where = _read(ck)
    except Unread as exc:
        return BundledPlugin(exc.file, None, str(exc))
    where = where or PLUGIN_DIR + "/"
    if name is None:
        return BundledPlugin(where, None, f"{PLUGIN_DIR}/ declares no package name where its build backend reads "
                                          "one (pyproject.toml [project] name, setup.cfg [metadata] name, a "
                                          "setup(name=...) literal)")
    if canonical_name(name) != PLUGIN_NAME:
        return BundledPlugin(where, None, f"{PLUGIN_DIR}/ declares the package {name!r}, not {PLUGIN_NAME}")
    if version is None:
        return BundledPlugin(where, None, f"{PLUGIN_DIR}/ states no version that can be read without running "
                                          "its build (no literal in pyproject.toml, setup.cfg, setup.py or "
                                          "__version__)")
    return BundledPlugin(where, version.strip())
