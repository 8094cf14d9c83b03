"""Which build backend ``pip install ./vllm_plugin`` runs, and the version each PEP 621 backend builds,
read statically as that backend reads it (nothing imported or run).

pip picks the backend from ``pyproject.toml`` ``[build-system] build-backend``; without one (or
without ``pyproject.toml``) it is setuptools' (PEP 517's fallback: ``read.plugin_setuptools``). A
backend builds only from its own settings: setup.py and setup.cfg mean nothing to hatchling.

* hatchling: ``[project] version``, or ``dynamic`` with ``[tool.hatch.version] path = ...`` (its default
  ``regex`` source: the first ``__version__``/``VERSION = "..."`` line of that file, hatchling's own pattern).
* flit-core: ``[project] version``, or ``dynamic`` with ``__version__`` in the module (``[tool.flit.module]
  name``, else the project name with ``-`` as ``_``; ``./`` or ``src/``): the first literal assignment
  of each of ``__version__.py``, ``_version.py``, ``version.py`` and ``__init__.py``, the last found winning.
* poetry-core: ``[project] version``, else ``[tool.poetry] version``.
* pdm-backend: ``[project] version``, or ``dynamic`` with ``[tool.pdm.version] source = "file", path = ...``
  (pdm's pattern); no version configured at all is ``0.0.0``, what pdm-backend builds.

What only the build decides is ``Unread``, naming the file and why: a version from version control
(hatch-vcs, pdm ``scm``, poetry-dynamic-versioning), from code the build runs (hatch ``code``, pdm
``call``, a flit module without a literal, hatch metadata hooks), from the environment, a custom
regex (never run here: a hostile pattern could take forever), an in-tree backend (``backend-path``),
or a backend not listed here.
"""

from __future__ import annotations

import ast
import re

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any, Callable

    from clef_format.read.checkpoint import Checkpoint

from clef_format.read.plugin_files import (PYPROJECT, Unread, parse_py, pep621_name_and_dynamic, plugin_file, pyproject,
                                          table, text)
from clef_format.spec.layouts import PLUGIN_DIR

Found = tuple[str | None, str | None, str | None]  # (name, version, where)

#: What pip runs when pyproject.toml names no backend (PEP 517).
LEGACY_BACKEND = "setuptools.build_meta:__legacy__"
#: hatchling's default version pattern (hatchling.version.core.DEFAULT_PATTERN).
HATCH_PATTERN = r'(?i)^(__version__|VERSION) *= *([\'"])v?(?P<version>.+?)\2'
#: pdm-backend's default version pattern (pdm.backend.hooks.version, resolve_version_from_file).
PDM_PATTERN = r"^(?:__version__|VERSION)\s*=\s*[\"'](.+?)[\"']\s*(?:#.*)?$"
#: Backends that set the version from version control, and say so by their name alone.
SCM_BACKENDS = {"poetry_dynamic_versioning.backend": "poetry-dynamic-versioning"}


def build_backend(ck: Checkpoint) -> str:
    """The ``build-backend`` pip runs for the folder; ``Unread`` for one that runs the folder's own code."""
    if PYPROJECT not in ck.files:
        return LEGACY_BACKEND
    build = table(pyproject(ck), "build-system")
    backend = build.get("build-backend", LEGACY_BACKEND)
    if not isinstance(backend, str):
        raise Unread(PYPROJECT, f"{PYPROJECT} [build-system] build-backend is not a string: pip refuses to build it")
    if "backend-path" in build:
        raise Unread(PYPROJECT, f"{PYPROJECT} builds with an in-tree backend ([build-system] backend-path): the "
                                "folder's own code decides the version when it runs")
    return backend.strip()


def _project(ck: Checkpoint, backend: str) -> tuple[dict[str, Any], str | None, str | None]:
    """([project], name, static version) for a PEP 621 backend; ``Unread`` where the backend refuses."""
    project = table(pyproject(ck), "project")
    if not project:
        raise Unread(PYPROJECT, f"{PYPROJECT} has no [project] table: {backend} refuses to build it")
    name, is_dynamic = pep621_name_and_dynamic(project, backend)
    version = project.get("version")
    if "version" in project and not isinstance(version, str):
        raise Unread(PYPROJECT, f"{PYPROJECT} [project] version is not a string: {backend} refuses to build it")
    if version is None and not is_dynamic:
        raise Unread(PYPROJECT, f"{PYPROJECT} has neither [project] version nor dynamic = [\"version\"]: "
                                f"{backend} refuses to build it")
    return project, name, version


def _pattern_version(ck: Checkpoint, rel: str, pattern: str, group: str | int, via: str) -> tuple[str, str]:
    m = re.search(pattern, text(ck, rel), re.MULTILINE)
    if m is None:
        raise Unread(rel, f"{via} names {rel}, which has no __version__ = \"...\" or VERSION = \"...\" line: the "
                          "build fails")
    return m.group(group), f"{rel} (__version__, via {via})"


def read_hatchling(ck: Checkpoint) -> Found:
    _, name, version = _project(ck, "hatchling")
    if version is not None:
        return name, version, f"{PYPROJECT} ([project] version)"
    data = pyproject(ck)
    if table(data, "tool", "hatch", "metadata", "hooks"):
        raise Unread(PYPROJECT, f"{PYPROJECT} has [tool.hatch.metadata.hooks]: code the build runs may set the "
                                "dynamic version")
    config = table(data, "tool", "hatch", "version")
    via = f"{PYPROJECT} [tool.hatch.version]"
    if not config:
        raise Unread(PYPROJECT, f"{PYPROJECT} lists version in dynamic without [tool.hatch.version]: hatchling "
                                "refuses to build it")
    source = config.get("source", "regex")
    if source == "vcs":
        raise Unread(PYPROJECT, f"{via} source = \"vcs\": hatch-vcs sets the version from version control (git "
                                "tags) when the build runs")
    if source != "regex":
        raise Unread(PYPROJECT, f"{via} source = {source!r}: the version is decided when the build runs "
                                "(only the default regex source is read statically)")
    if config.get("pattern") not in (None, "", True):
        raise Unread(PYPROJECT, f"{via} has a custom pattern: clef-format runs no pattern a checkpoint brings")
    rel = plugin_file(ck, config.get("path"), f"{via} path", "version file")
    return (name, *_pattern_version(ck, rel, HATCH_PATTERN, "version", f"{via} path"))


def _flit_module(ck: Checkpoint, module: str) -> tuple[str, bool]:
    """(checkpoint-relative path, is a package) of flit's module: ``./`` or ``src/``, file or package, exactly one."""
    path = module.replace(".", "/")
    found = [(rel, pkg) for rel, pkg in ((f"{PLUGIN_DIR}/{path}", True), (f"{PLUGIN_DIR}/{path}.py", False),
                                         (f"{PLUGIN_DIR}/src/{path}", True), (f"{PLUGIN_DIR}/src/{path}.py", False))
             if (f"{rel}/__init__.py" if pkg else rel) in ck.files]
    if len(found) != 1:
        what = "no file or package" if not found else "several files or packages"
        raise Unread(PYPROJECT, f"{PYPROJECT} builds with flit, which finds {what} for the module {module!r} in "
                                f"{PLUGIN_DIR}/ (./ or src/): the build fails")
    return found[0]


def _assigns_constant(node: ast.stmt, name: str) -> bool:
    """flit's own test (``is_version_str_assignment``): ``name = <any constant>`` at module level."""
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign):
        targets = [node.target]
    else:
        return False
    return isinstance(node.value, ast.Constant) and any(isinstance(t, ast.Name) and t.id == name for t in targets)


def _dynamic(ck: Checkpoint) -> list[object]:
    dynamic = table(pyproject(ck), "project").get("dynamic")
    return dynamic if isinstance(dynamic, list) else []


def read_flit(ck: Checkpoint) -> Found:
    _, name, version = _project(ck, "flit_core")
    if version is not None:
        return name, version, f"{PYPROJECT} ([project] version)"
    module = table(pyproject(ck), "tool", "flit", "module").get("name")
    if not isinstance(module, str):
        module = (name or "").replace("-", "_")
    rel, is_package = _flit_module(ck, module)
    if is_package:
        files = [f"{rel}/{f}" for f in ("__version__.py", "_version.py", "version.py") if f"{rel}/{f}" in ck.files]
        files.append(f"{rel}/__init__.py")
    else:
        files = [rel]
    found: tuple[object, str] | None = None
    tree = None
    for rel_file in files:  # flit parses each; in each the first constant assigned wins, and the last file found
        tree = parse_py(ck, rel_file)
        node = next((n for n in tree.body if _assigns_constant(n, "__version__")), None)
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant):
            found = node.value.value, rel_file
    imports = "flit imports the module when it builds, and the version is what that run computes"
    if found is None:
        raise Unread(files[-1], f"{files[-1]} holds no literal __version__ = \"...\": {imports}")
    if tree is not None and "description" in _dynamic(ck) and not ast.get_docstring(tree):
        raise Unread(files[-1], f"{files[-1]} has no docstring for flit's dynamic description: flit imports the "
                                "module when it builds (and refuses to build unless that run sets one)")
    if not isinstance(found[0], str):
        raise Unread(found[1], f"{found[1]} assigns __version__ {found[0]!r}, not a string: flit refuses to build it")
    return name, found[0], f"{found[1]} (__version__, via flit's dynamic version)"


def read_poetry(ck: Checkpoint) -> Found:
    data = pyproject(ck)
    project, poetry = table(data, "project"), table(data, "tool", "poetry")
    name = next((n for n in (project.get("name"), poetry.get("name")) if isinstance(n, str) and n), None)
    for value, where in ((project.get("version"), "[project] version"), (poetry.get("version"), "[tool.poetry] version")):
        if value:  # poetry-core takes the first that is set
            if not isinstance(value, str):
                raise Unread(PYPROJECT, f"{PYPROJECT} {where} is not a string: poetry-core refuses to build it")
            return name, value, f"{PYPROJECT} ({where})"
    raise Unread(PYPROJECT, f"{PYPROJECT} states neither [project] version nor [tool.poetry] version: poetry-core "
                            "refuses to build it")


def read_pdm(ck: Checkpoint) -> Found:
    project = table(pyproject(ck), "project")
    if not project:
        raise Unread(PYPROJECT, f"{PYPROJECT} has no [project] table: pdm-backend refuses to build it")
    name = project.get("name") if isinstance(project.get("name"), str) else None
    config = table(pyproject(ck), "tool", "pdm", "version")
    if isinstance(project.get("version"), str):
        return name, project["version"], f"{PYPROJECT} ([project] version)"
    via = f"{PYPROJECT} [tool.pdm.version]"
    if not config:  # pdm-backend's own default: no version configured builds 0.0.0
        return name, "0.0.0", f"{PYPROJECT} (no version stated: pdm-backend builds 0.0.0)"
    dynamic = project.get("dynamic")
    if not (isinstance(dynamic, list) and "version" in dynamic):
        raise Unread(PYPROJECT, f"{via} is set but version is not in [project] dynamic: pdm-backend refuses to "
                                "build it")
    source = config.get("source") or ("file" if config.get("path") else None)
    if source == "scm":
        raise Unread(PYPROJECT, f"{via} source = \"scm\": the version comes from version control (git tags) "
                                "when the build runs")
    if source != "file":
        raise Unread(PYPROJECT, f"{via} source = {source!r}: the version is decided when the build runs (only "
                                "source = \"file\" is read statically)")
    if config.get("pattern") is not None:
        raise Unread(PYPROJECT, f"{via} has a custom pattern: clef-format runs no pattern a checkpoint brings")
    rel = plugin_file(ck, config.get("path"), f"{via} path", "version file")
    return (name, *_pattern_version(ck, rel, PDM_PATTERN, 1, f"{via} path"))


#: build-backend -> (what to call it, its reader). setuptools' own is ``plugin_setuptools.read_setuptools``.
READERS: dict[str, tuple[str, Callable[[Checkpoint], Found]]] = {
    "hatchling.build": ("hatchling", read_hatchling),
    "flit_core.buildapi": ("flit-core", read_flit),
    "poetry.core.masonry.api": ("poetry-core", read_poetry),
    "pdm.backend": ("pdm-backend", read_pdm),
}
