"""The version setuptools builds ``vllm_plugin/`` as, read statically (nothing imported or run).

In setuptools' own order (pip's builds agree): ``pyproject.toml`` (``[project] version``, or
``dynamic = ["version"]`` with ``[tool.setuptools.dynamic] version = {attr = ...}`` / ``{file = ...}``),
a literal ``version=`` keyword of the one module-level ``setup(...)`` call in ``setup.py`` (or a
module-level string constant it names), ``setup.cfg`` (``[metadata] version``, ``attr:`` / ``file:``;
a ``file`` source is read only when it names one file holding exactly one version, ``_file_version``;
``attr:`` modules are found through ``package_dir`` as setuptools finds them). A module constant (the
one ``setup(version=NAME)`` passes, the one ``attr:`` names) is read by one rule,
``plugin_files.bound_string``: followed in order up to where it is used, plain string literals only.
A ``setup(version=...)`` that is an expression (``open("VERSION").read()``) is ``Unread``: what it
evaluates to is decided when setup.py runs, and no other file stands in for it (the package's
``__version__`` may say something else). Nothing stated at all is ``0.0.0``, what setuptools builds.
A version a plugin sets from git when the build runs (setuptools-scm, setuptools-git-versioning,
versioningit: in ``[build-system] requires``, a ``[tool.<plugin>]`` table, ``setup(use_scm_version=...)``)
cannot be read: ``Unread``.
"""

from __future__ import annotations

import ast
import os
import posixpath

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any

    from clef_format.read.checkpoint import Checkpoint

from clef_format.read.plugin_files import (
    PYPROJECT,
    SETUP_CFG,
    SETUP_PY,
    Unread,
    bound_string,
    never_read,
    parse_py,
    pep621_name_and_dynamic,
    plugin_file,
    pyproject,
    requirement_names,
    table,
    text,
)
from clef_format.spec.layouts import PLUGIN_DIR

#: The version setuptools gives a distribution whose packaging states none.
NO_VERSION = "0.0.0"
#: setuptools plugins that set the version from version control when the build runs: requirement name ->
#: the ``[tool.*]`` table that configures it.
SCM_PLUGINS = {"setuptools-scm": "setuptools_scm", "setuptools-git-versioning": "setuptools-git-versioning",
               "versioningit": "versioningit"}
#: ``setup(...)`` keywords those plugins read.
SCM_KEYWORDS = ("use_scm_version", "setuptools_git_versioning", "versioningit")

Found = tuple[str | None, str | None, str | None]  # (name, version, where)


def _package_dir(ck: Checkpoint) -> dict[str, str]:
    """The ``package_dir`` setuptools resolves ``attr:`` with: setup.cfg ``[options] package_dir``,
    pyproject.toml ``[tool.setuptools] package-dir`` or a literal ``setup(package_dir=...)``; more than one
    that disagree, or one that is not a literal mapping of strings, cannot be resolved exactly."""
    found: list[tuple[str, dict[str, str]]] = []
    if SETUP_CFG in ck.files:
        cfg = _read_cfg(ck)
        if cfg.has_option("options", "package_dir"):
            pairs: dict[str, str] = {}
            for line in cfg.get("options", "package_dir").strip().splitlines():
                key, eq, value = line.partition("=")
                if not eq:
                    raise Unread(SETUP_CFG, f"{SETUP_CFG} [options] package_dir has a line without '=': "
                                            f"{line.strip()[:80]!r}")
                pairs[key.strip()] = value.strip()
            found.append((f"{SETUP_CFG} [options] package_dir", pairs))
    if PYPROJECT in ck.files:
        st = table(pyproject(ck), "tool", "setuptools")
        if "package-dir" in st:
            pd = st["package-dir"]
            if not isinstance(pd, dict) or not all(isinstance(v, str) for v in pd.values()):
                raise Unread(PYPROJECT, f"{PYPROJECT} [tool.setuptools] package-dir is not a table of strings")
            found.append((f"{PYPROJECT} [tool.setuptools] package-dir", dict(pd)))
    call = _setup_call(ck)
    if call is not None:
        for kw in call.keywords:
            if kw.arg == "package_dir":
                try:
                    pd = ast.literal_eval(kw.value)
                except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                    pd = None
                if not isinstance(pd, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                       for k, v in pd.items()):
                    raise Unread(SETUP_PY, f"{SETUP_PY} passes setup(package_dir=...) that is no literal mapping "
                                           "of strings")
                found.append((f"{SETUP_PY} setup(package_dir=...)", pd))
    if len({tuple(sorted(pd.items())) for _, pd in found}) > 1:
        raise Unread(found[0][0].split(" ")[0], "package_dir is given differently in " + " and ".join(w for w, _ in found))
    if found:
        return found[0][1]
    if not _lists_packages(ck, call) and os.path.isdir(ck.path(f"{PLUGIN_DIR}/src")):
        return {"": "src"}  # setuptools' automatic discovery: a src/ folder is the src layout
    return {}


def _lists_packages(ck: Checkpoint, call: ast.Call | None) -> bool:
    """Whether the packaging names its packages or modules (setuptools then discovers nothing)."""
    if SETUP_CFG in ck.files:
        cfg = _read_cfg(ck)
        if cfg.has_option("options", "packages") or cfg.has_option("options", "py_modules"):
            return True
    if PYPROJECT in ck.files:
        st = table(pyproject(ck), "tool", "setuptools")
        if "packages" in st or "py-modules" in st:
            return True
    return call is not None and any(kw.arg in ("packages", "py_modules") for kw in call.keywords)


def _module_file(ck: Checkpoint, dotted: str) -> str | None:
    """The file of module ``dotted`` inside the plugin folder, found as setuptools' ``attr:`` finds it
    (``find_package_path`` with the package's ``package_dir``, then ``<path>.py`` or
    ``<path>/__init__.py``)."""
    package_dir = _package_dir(ck)
    parts = dotted.split(".")
    path = None
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in package_dir:
            path = posixpath.join(package_dir[".".join(parts[:i])], *parts[i:])
            break
    if path is None:
        path = posixpath.join(*(package_dir.get("") or "").split("/"), *parts)
    for rel in (f"{PLUGIN_DIR}/{path}.py", f"{PLUGIN_DIR}/{path}/__init__.py"):
        rel = posixpath.normpath(rel)
        if not rel.startswith(PLUGIN_DIR + "/"):
            return None
        why = never_read(ck, rel)
        if why is not None:  # there, but what it states is not known: not "no such module"
            raise Unread(rel, why)
        if rel in ck.files:
            return rel
    return None


def _attr_version(ck: Checkpoint, attr: str, via: str) -> tuple[str, str]:
    """``pkg.module.NAME`` -> (version, where), read from the module's source without importing it
    (``bound_string`` to the end of the module: setuptools' ``StaticModule`` reads the first assignment,
    an import the last; only plain literals that agree are read)."""
    module, _, name = attr.strip().rpartition(".")
    rel = _module_file(ck, module) if module else None
    if rel is None:
        raise Unread(via.split(" ")[0], f"{via} names {attr!r}, whose module is not in {PLUGIN_DIR}/")
    value = bound_string(parse_py(ck, rel), rel, name, use=f"the end of the module ({via} names {attr!r})")
    return value, f"{rel} ({name}, via {via})"


def _file_version(ck: Checkpoint, files: list[Any] | Any, via: str) -> tuple[str, str]:
    r"""THE rule for a setuptools ``file`` version source (``{file = ...}``, ``file:``): read only where what
    setuptools builds is certain. setuptools (``config.expand.read_files``) joins the files' contents with
    ``"\n"`` (skipping any that are missing) and hands the result to ``packaging.version.Version``: several
    files make a string whose reading is packaging's (``0.2.0`` + ``rc1`` builds 0.2.0rc1 from pyproject.toml,
    setup.cfg's build fails), never reconstructed here, so more than one file is ``Unread``. One file is read
    as ``open(encoding="utf-8")`` reads it (universal newlines) and must be exactly one version: no
    whitespace at all but one final newline; else ``Unread`` (``"\n  0.2.0  \n\n"`` fails the build from
    pyproject.toml, setup.cfg's builds 0.2.0: what packaging and each path make of it is not reconstructed)."""
    names = files if isinstance(files, list) else [files]
    if not names:
        raise Unread(via.split(" ")[0], f"{via} names no version file")
    if len(names) > 1:
        shown = ", ".join(repr(n) for n in names[:4]) + (", ..." if len(names) > 4 else "")
        raise Unread(via.split(" ")[0], f"{via} names {len(names)} version files ({shown}): setuptools joins their "
                                        "contents with a newline, and what version that makes (or whether the build "
                                        "fails) is decided by the build, not read here")
    rel = plugin_file(ck, names[0], via, "version file")  # setuptools refuses a file outside, too
    content = text(ck, rel).replace("\r\n", "\n").replace("\r", "\n")  # what text-mode open() reads
    value = content[:-1] if content.endswith("\n") else content
    if not value or len(value) > 64 or any(c.isspace() for c in value):
        raise Unread(rel, f"{rel} (named by {via}) is not exactly one version on one line (no surrounding "
                          f"whitespace or blank lines, at most one final newline): {content[:80]!r}; what "
                          "setuptools makes of it is decided by the build, not read here")
    return value, f"{rel} (via {via})"


def _from_pyproject(ck: Checkpoint) -> Found:
    """(name, version, where) from pyproject.toml; version None when it is not declared there."""
    if PYPROJECT not in ck.files:
        return None, None, None
    data = pyproject(ck)
    project = data.get("project")
    if not isinstance(project, dict):
        return None, None, None  # no [project]: setup.cfg / setup.py say it
    name, is_dynamic = pep621_name_and_dynamic(project, "setuptools")
    if isinstance(project.get("version"), str):
        return name, project["version"], f"{PYPROJECT} ([project] version)"
    if not is_dynamic:
        raise Unread(PYPROJECT, f"{PYPROJECT} has a [project] table with neither a version nor "
                                "dynamic = [\"version\"]: setuptools refuses to build it")
    spec = table(data, "tool", "setuptools", "dynamic").get("version")
    via = f"{PYPROJECT} [tool.setuptools.dynamic]"
    if isinstance(spec, dict) and isinstance(spec.get("attr"), str):
        return (name, *_attr_version(ck, spec["attr"], via))
    if isinstance(spec, dict) and "file" in spec:
        return (name, *_file_version(ck, spec["file"], via))
    return name, None, None


def _read_cfg(ck: Checkpoint) -> Any:
    import configparser

    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text(ck, SETUP_CFG), source=SETUP_CFG)
    except (configparser.Error, ValueError, RecursionError, MemoryError) as exc:
        raise Unread(SETUP_CFG, f"{SETUP_CFG} is not a valid setup.cfg ({type(exc).__name__})") from None
    return parser


def _from_setup_cfg(ck: Checkpoint) -> Found:
    if SETUP_CFG not in ck.files:
        return None, None, None
    parser = _read_cfg(ck)
    if not parser.has_section("metadata"):
        return None, None, None
    name = parser.get("metadata", "name", fallback=None)
    value = parser.get("metadata", "version", fallback=None)
    if value is None:
        return name, None, None
    value = value.strip()
    via = f"{SETUP_CFG} [metadata] version"
    if value.startswith("attr:"):
        return (name, *_attr_version(ck, value[5:], via))
    if value.startswith("file:"):
        return (name, *_file_version(ck, [f.strip() for f in value[5:].split(",")], via))
    return name, value, via


def _is_setup(node: ast.AST) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    return (isinstance(func, ast.Name) and func.id == "setup") or (
        isinstance(func, ast.Attribute) and func.attr == "setup")


def _setup_call(ck: Checkpoint) -> ast.Call | None:
    """The one ``setup(...)`` call of setup.py (``_setup_statement``), or ``None``."""
    found = _setup_statement(ck)
    return found[1].value if found is not None else None  # type: ignore[return-value]


def _setup_statement(ck: Checkpoint) -> tuple[ast.Module, ast.Expr] | None:
    """(setup.py, the statement that is its one ``setup(...)`` call, a statement of the module itself;
    ``None`` when there is no call). Several calls, or one under ``if``/``def``/``for``/``with``/``try``,
    leave which one runs (and whether) to the run: not read."""
    if SETUP_PY not in ck.files:
        return None
    tree = parse_py(ck, SETUP_PY)
    top = [n for n in tree.body if isinstance(n, ast.Expr) and _is_setup(n.value)]
    every = [n for n in ast.walk(tree) if _is_setup(n)]
    if len(every) > len(top):
        raise Unread(SETUP_PY, f"{SETUP_PY} calls setup(...) inside a block (if/def/for/with/try or an expression): "
                               "which call runs is decided when it runs")
    if len(top) > 1:
        raise Unread(SETUP_PY, f"{SETUP_PY} calls setup(...) {len(top)} times: which call builds is decided when it runs")
    return (tree, top[0]) if top else None


def _setup_keyword(tree: ast.Module, top: ast.Expr, value: ast.expr, key: str) -> str:
    """The string ``setup(key=value)`` (the statement ``top`` of setup.py) passes: a literal, or a module
    constant by ``bound_string``; ``Unread`` for an expression (decided when setup.py runs: no other file
    stands in for it)."""
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return value.value
    if isinstance(value, ast.Name):
        return bound_string(tree, SETUP_PY, value.id, top)
    try:
        shown = ast.unparse(value)
    except (RecursionError, ValueError, MemoryError):  # a hostile nesting ast.parse took but unparse cannot
        shown = "..."
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    raise Unread(SETUP_PY, f"{SETUP_PY} line {value.lineno} passes setup({key}={shown}), an expression: its value "
                           "is decided when the module runs, and clef-format never runs it (no other file, "
                           "setup.cfg or the package's __version__, stands in for it)")


def _from_setup_py(ck: Checkpoint) -> tuple[Found, Unread | None]:
    """((name, version, where), why the version it passes is not known); version None and no reason when
    setup(...) passes none (or there is no setup.py)."""
    statement = _setup_statement(ck)
    if statement is None:
        return (None, None, None), None
    tree, top = statement
    call: ast.Call = top.value  # type: ignore[assignment]
    found: dict[str, str | None] = {}
    unknown: Unread | None = None
    for kw in call.keywords:
        if kw.arg is None:
            raise Unread(SETUP_PY, f"{SETUP_PY} passes setup(**...): its keywords are decided when it runs")
        if kw.arg in SCM_KEYWORDS:
            raise Unread(SETUP_PY, f"{SETUP_PY} passes setup({kw.arg}=...): the version is taken from version "
                                   "control (git tags) when the build runs")
        if kw.arg not in ("name", "version"):
            continue
        try:
            found[kw.arg] = _setup_keyword(tree, top, kw.value, kw.arg)
        except Unread as exc:
            if kw.arg == "version":
                unknown = exc
    version = found.get("version")
    return (found.get("name"), version, f"{SETUP_PY} (setup(version=...))" if version else None), unknown


def _scm_plugin(ck: Checkpoint) -> tuple[str, str] | None:
    """(plugin, what says so) when a setuptools plugin that sets the version from git is configured."""
    if PYPROJECT not in ck.files:
        return None
    data = pyproject(ck)
    requires = requirement_names(data)
    dynamic = table(data, "project").get("dynamic")
    for plugin, tool in SCM_PLUGINS.items():
        if tool in table(data, "tool"):
            return plugin, f"{PYPROJECT} has a [tool.{tool}] table"
        if plugin in requires and isinstance(dynamic, list) and "version" in dynamic:
            return plugin, f"{PYPROJECT} lists version in dynamic and [build-system] requires {plugin}"
    return None


def read_setuptools(ck: Checkpoint) -> Found:
    """(name, version, where) as setuptools builds the folder; ``Unread`` when only the build can tell."""
    project = table(pyproject(ck), "project") if PYPROJECT in ck.files else {}
    scm = _scm_plugin(ck)
    if scm is not None and not isinstance(project.get("version"), str):
        plugin, why = scm
        raise Unread(PYPROJECT, f"{why}: {plugin} sets the version from version control (git tags) when the "
                                "build runs, and the folder states none")
    # setuptools' own order (pip builds agree): pyproject.toml's [project] wins over setup(...)'s
    # keywords, which win over setup.cfg; a version setup(...) passes that is not known is not read, never
    # replaced by another file's (setup.cfg's, the package's __version__)
    name, version, where = _from_pyproject(ck)
    (n, v, w), unknown = _from_setup_py(ck)
    name = name or n
    if version is None and unknown is not None:
        raise unknown
    if version is None:
        version, where = v, w
    n, v, w = _from_setup_cfg(ck)
    name = name or n
    if version is None:
        version, where = v, w
    packaging = [f for f in (SETUP_PY, SETUP_CFG, PYPROJECT) if f in ck.files]
    if version is None and name is not None and packaging:
        # nothing states a version (a [project] table would have refused): setuptools builds 0.0.0
        version, where = NO_VERSION, f"{packaging[0]} (no version stated: setuptools builds {NO_VERSION})"
    return name, version, where
