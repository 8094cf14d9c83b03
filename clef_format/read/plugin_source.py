"""The clef-vllm version of the plugin a release ships in ``vllm_plugin/``, read statically.

The release's card installs the plugin with ``pip install ./<repo>/vllm_plugin``, so that folder's
version is the plugin a user serves these weights with. It is data: nothing in it is imported or run.
The version comes from the packaging files, in the order setuptools gives them weight:
``pyproject.toml`` (``[project] version``, or ``dynamic = ["version"]`` with
``[tool.setuptools.dynamic] version = {attr = ...}`` / ``{file = ...}``), a literal ``version=``
keyword of the one module-level ``setup(...)`` call in ``setup.py`` (or a module-level string
constant it names), ``setup.cfg`` (``[metadata] version``, ``attr:`` / ``file:``; ``attr:`` modules
are found through ``package_dir`` as setuptools finds them), then, only where ``setup.py`` computes
the version (often by reading it), a literal ``__version__ = "..."`` in the package. Nothing stated
at all is ``0.0.0``, what setuptools builds. The distribution name must be clef-vllm (PEP 503
normalisation). Anything that cannot be read exactly (too large, not UTF-8, a syntax error, a version
computed at build time, several or conditional ``setup(...)`` calls, a packaging setuptools refuses)
gives a note instead of a version, never an exception.
"""

from __future__ import annotations

import ast
import os
import re

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any

    from clef_format.read.checkpoint import Checkpoint

from clef_format.records import Record
from clef_format.spec.layouts import PLUGIN_DIR  # the folder a release ships its plugin in

#: The distribution name the folder must declare (canonical form, PEP 503).
PLUGIN_NAME = "clef-vllm"
#: Largest packaging or module file read (the real ones are a few KB).
MAX_SOURCE_BYTES = 1024 * 1024
#: The version setuptools gives a distribution whose packaging states none.
NO_VERSION = "0.0.0"


class BundledPlugin(Record):
    """What ``vllm_plugin/`` says about itself: ``version`` and the file it came from (``where``, a
    checkpoint-relative path with the key), or ``version=None`` and a ``note`` saying why not."""

    where: str
    version: str | None
    note: str = ""


class _Unread(Exception):
    """The version cannot be read from this file (the message says why)."""


def canonical_name(name: str) -> str:
    """PEP 503 normalisation (``Clef_VLLM`` -> ``clef-vllm``): packaging's, imported only when a plugin is there."""
    from packaging.utils import canonicalize_name

    return str(canonicalize_name(name))


def _text(ck: Checkpoint, rel: str) -> str:
    size = ck.files[rel]
    if size > MAX_SOURCE_BYTES:
        raise _Unread(f"{rel} is {size} bytes, over the {MAX_SOURCE_BYTES} limit; not read")
    try:
        with open(ck.path(rel), "rb") as fh:
            data = fh.read(MAX_SOURCE_BYTES + 1)
    except OSError as exc:
        raise _Unread(f"{rel} cannot be read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Unread(f"{rel} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _parse_toml(text: str) -> dict[str, Any]:
    try:
        import tomllib  # Python 3.11+
    except ImportError:  # Python 3.10: tomli when installed, else the small reader below
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            return _mini_toml(text)
    return tomllib.loads(text)


_TOML_KEY = re.compile(r'^\s*([A-Za-z0-9_.-]+|"[^"]*")\s*=\s*(.*?)\s*$')
_TOML_STR = r'"((?:[^"\\]|\\.)*)"|\'([^\']*)\''


def _toml_value(raw: str) -> Any:
    m = re.fullmatch(_TOML_STR + r"\s*(#.*)?", raw)
    if m:
        return m.group(1) if m.group(1) is not None else m.group(2)
    if raw.startswith("[") and raw.rstrip().split("#")[0].rstrip().endswith("]"):
        return [a or b for a, b in re.findall(_TOML_STR, raw)]
    if raw.startswith("{"):
        pairs = re.findall(r'(?:([A-Za-z0-9_-]+)|"([^"]*)")\s*=\s*(?:' + _TOML_STR + ")", raw)
        return {k or qk: a or b for k, qk, a, b in pairs}  # package-dir = {"" = "src"}: a quoted key
    return None


def _mini_toml(text: str) -> dict[str, Any]:
    """The few TOML forms a plugin's ``pyproject.toml`` states its name and version in (tables, string
    keys, one-line arrays and inline tables), for Python 3.10 without tomli. Anything else is skipped."""
    out: dict[str, Any] = {}
    table = out
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        header = re.fullmatch(r"\[([^\[\]]+)\]\s*(#.*)?", stripped)
        if header:
            table = out
            for part in header.group(1).split("."):
                table = table.setdefault(part.strip().strip('"'), {})
                if not isinstance(table, dict):
                    raise ValueError(f"table {header.group(1)!r} redefines a key")
            continue
        m = _TOML_KEY.match(line)
        if m:
            value = _toml_value(m.group(2))
            if value is not None:
                table[m.group(1).strip('"')] = value
    return out


def _package_dir(ck: Checkpoint) -> dict[str, str]:
    """The ``package_dir`` setuptools resolves ``attr:`` with: setup.cfg ``[options] package_dir``,
    pyproject.toml ``[tool.setuptools] package-dir`` or a literal ``setup(package_dir=...)``; more than one
    that disagree, or one that is not a literal mapping of strings, cannot be resolved exactly."""
    found: list[tuple[str, dict[str, str]]] = []
    rel = f"{PLUGIN_DIR}/setup.cfg"
    if rel in ck.files:
        cfg = _read_cfg(ck, rel)
        if cfg.has_option("options", "package_dir"):
            pairs: dict[str, str] = {}
            for line in cfg.get("options", "package_dir").strip().splitlines():
                key, eq, value = line.partition("=")
                if not eq:
                    raise _Unread(f"{rel} [options] package_dir has a line without '=': {line.strip()[:80]!r}")
                pairs[key.strip()] = value.strip()
            found.append((f"{rel} [options] package_dir", pairs))
    rel = f"{PLUGIN_DIR}/pyproject.toml"
    if rel in ck.files:
        tool = _pyproject(ck).get("tool")
        st = tool.get("setuptools") if isinstance(tool, dict) else None
        if isinstance(st, dict) and "package-dir" in st:
            pd = st["package-dir"]
            if not isinstance(pd, dict) or not all(isinstance(v, str) for v in pd.values()):
                raise _Unread(f"{rel} [tool.setuptools] package-dir is not a table of strings")
            found.append((f"{rel} [tool.setuptools] package-dir", dict(pd)))
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
                    raise _Unread(f"{PLUGIN_DIR}/setup.py passes setup(package_dir=...) that is no literal mapping "
                                  "of strings")
                found.append((f"{PLUGIN_DIR}/setup.py setup(package_dir=...)", pd))
    if len({tuple(sorted(pd.items())) for _, pd in found}) > 1:
        raise _Unread("package_dir is given differently in " + " and ".join(w for w, _ in found))
    if found:
        return found[0][1]
    if not _lists_packages(ck, call) and os.path.isdir(ck.path(f"{PLUGIN_DIR}/src")):
        return {"": "src"}  # setuptools' automatic discovery: a src/ folder is the src layout
    return {}


def _lists_packages(ck: Checkpoint, call: ast.Call | None) -> bool:
    """Whether the packaging names its packages or modules (setuptools then discovers nothing)."""
    rel = f"{PLUGIN_DIR}/setup.cfg"
    if rel in ck.files:
        cfg = _read_cfg(ck, rel)
        if cfg.has_option("options", "packages") or cfg.has_option("options", "py_modules"):
            return True
    if f"{PLUGIN_DIR}/pyproject.toml" in ck.files:
        tool = _pyproject(ck).get("tool")
        st = tool.get("setuptools") if isinstance(tool, dict) else None
        if isinstance(st, dict) and ("packages" in st or "py-modules" in st):
            return True
    return call is not None and any(kw.arg in ("packages", "py_modules") for kw in call.keywords)


def _module_file(ck: Checkpoint, dotted: str) -> str | None:
    """The file of module ``dotted`` inside the plugin folder, found as setuptools' ``attr:`` finds it
    (``find_package_path`` with the package's ``package_dir``, then ``<path>.py`` or
    ``<path>/__init__.py``)."""
    import posixpath

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
        if rel in ck.files:
            return rel
    return None


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level ``NAME = "literal"`` assignments (the last one wins, as when the module runs)."""
    out: dict[str, str] = {}
    for node in tree.body:
        targets: list[ast.expr] = []
        value = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        for t in targets:
            if isinstance(t, ast.Name):
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    out[t.id] = value.value
                else:
                    out.pop(t.id, None)  # reassigned to something computed: no literal any more
    return out


def _first_assignment(tree: ast.Module, name: str) -> str | None:
    """The value setuptools' ``attr:`` reads without importing: the FIRST module-level assignment to
    ``name`` (its ``StaticModule``), if a string literal; ``None`` otherwise (setuptools would then import
    the module and take what it computes)."""
    for node in tree.body:
        if isinstance(node, ast.Assign):
            pairs = [(t, node.value) for t in node.targets]
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            pairs = [(node.target, node.value)]
        else:
            continue
        for target, value in pairs:
            if isinstance(target, ast.Name) and target.id == name:
                return value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else None
    return None


def _parse_py(ck: Checkpoint, rel: str) -> ast.Module:
    text = _text(ck, rel)
    try:
        return ast.parse(text, filename=rel)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise _Unread(f"{rel} is not valid Python ({type(exc).__name__}: {exc})") from None


def _attr_version(ck: Checkpoint, attr: str, via: str) -> tuple[str, str]:
    """``pkg.module.NAME`` -> (version, where), read from the module's source without importing it."""
    module, _, name = attr.strip().rpartition(".")
    rel = _module_file(ck, module) if module else None
    if rel is None:
        raise _Unread(f"{via} names {attr!r}, whose module is not in {PLUGIN_DIR}/")
    value = _first_assignment(_parse_py(ck, rel), name)
    if value is None:
        raise _Unread(f"{via} names {attr!r}, which is not a string literal in {rel}")
    return value, f"{rel} ({name}, via {via})"


def _file_version(ck: Checkpoint, files: Any, via: str) -> tuple[str, str]:
    first = files[0] if isinstance(files, list) and files else files
    if not isinstance(first, str):
        raise _Unread(f"{via} names no version file")
    import posixpath

    rel = posixpath.normpath(f"{PLUGIN_DIR}/{first.strip()}")  # ./VERSION is VERSION
    if not rel.startswith(PLUGIN_DIR + "/") or rel not in ck.files:  # setuptools refuses a file outside, too
        raise _Unread(f"{via} names {first!r}, which is not a file in {PLUGIN_DIR}/")
    value = _text(ck, rel).strip()
    if len(value) > 64 or "\n" in value:
        raise _Unread(f"{rel} (named by {via}) holds no version: {len(value)} characters over several lines")
    return value, f"{rel} (via {via})"


def _pyproject(ck: Checkpoint) -> dict[str, Any]:
    rel = f"{PLUGIN_DIR}/pyproject.toml"
    try:
        data = _parse_toml(_text(ck, rel))
    except (ValueError, RecursionError, MemoryError) as exc:  # tomllib.TOMLDecodeError is a ValueError
        raise _Unread(f"{rel} is not valid TOML ({exc})") from None
    return data


def _from_pyproject(ck: Checkpoint) -> tuple[str | None, str | None, str | None]:
    """(name, version, where) from pyproject.toml; version None when it is not declared there."""
    rel = f"{PLUGIN_DIR}/pyproject.toml"
    if rel not in ck.files:
        return None, None, None
    data = _pyproject(ck)
    project = data.get("project")
    if not isinstance(project, dict):
        return None, None, None  # no [project]: setup.cfg / setup.py say it
    name = project.get("name") if isinstance(project.get("name"), str) else None
    dynamic = project.get("dynamic")
    is_dynamic = isinstance(dynamic, list) and "version" in dynamic
    if "version" in project and is_dynamic:
        raise _Unread(f"{rel} gives [project] version and lists it in dynamic: setuptools refuses to build it "
                      "(PEP 621)")
    if isinstance(project.get("version"), str):
        return name, project["version"], f"{rel} ([project] version)"
    if not is_dynamic:
        raise _Unread(f"{rel} has a [project] table with neither a version nor dynamic = [\"version\"]: "
                      "setuptools refuses to build it")
    tool = data.get("tool")
    setuptools = tool.get("setuptools") if isinstance(tool, dict) else None
    dyn = setuptools.get("dynamic") if isinstance(setuptools, dict) else None
    spec = dyn.get("version") if isinstance(dyn, dict) else None
    via = f"{rel} [tool.setuptools.dynamic]"
    if isinstance(spec, dict) and isinstance(spec.get("attr"), str):
        return (name, *_attr_version(ck, spec["attr"], via))
    if isinstance(spec, dict) and "file" in spec:
        return (name, *_file_version(ck, spec["file"], via))
    return name, None, None


def _read_cfg(ck: Checkpoint, rel: str) -> Any:
    import configparser

    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(_text(ck, rel), source=rel)
    except (configparser.Error, ValueError, RecursionError, MemoryError) as exc:
        raise _Unread(f"{rel} is not a valid setup.cfg ({type(exc).__name__})") from None
    return parser


def _from_setup_cfg(ck: Checkpoint) -> tuple[str | None, str | None, str | None]:
    rel = f"{PLUGIN_DIR}/setup.cfg"
    if rel not in ck.files:
        return None, None, None
    parser = _read_cfg(ck, rel)
    if not parser.has_section("metadata"):
        return None, None, None
    name = parser.get("metadata", "name", fallback=None)
    value = parser.get("metadata", "version", fallback=None)
    if value is None:
        return name, None, None
    value = value.strip()
    via = f"{rel} [metadata] version"
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
    """The one ``setup(...)`` call of setup.py, a statement of the module itself (``None`` when there is
    no call). Several calls, or one under ``if``/``def``/``for``/``with``/``try``, leave which one runs
    (and whether) to the run: not read."""
    rel = f"{PLUGIN_DIR}/setup.py"
    if rel not in ck.files:
        return None
    tree = _parse_py(ck, rel)
    top = [n.value for n in tree.body if isinstance(n, ast.Expr) and _is_setup(n.value)]
    every = [n for n in ast.walk(tree) if _is_setup(n)]
    if len(every) > len(top):
        raise _Unread(f"{rel} calls setup(...) inside a block (if/def/for/with/try or an expression): which call "
                      "runs is decided when it runs")
    if len(top) > 1:
        raise _Unread(f"{rel} calls setup(...) {len(top)} times: which call builds is decided when it runs")
    return top[0] if top else None  # type: ignore[return-value]


def _from_setup_py(ck: Checkpoint) -> tuple[str | None, str | None, str | None]:
    rel = f"{PLUGIN_DIR}/setup.py"
    call = _setup_call(ck)
    if call is None:
        return None, None, None
    consts = _constants(_parse_py(ck, rel))
    found: dict[str, str | None] = {}
    computed: set[str] = set()
    for kw in call.keywords:
        if kw.arg is None:
            raise _Unread(f"{rel} passes setup(**...): its keywords are decided when it runs")
        if kw.arg not in ("name", "version"):
            continue
        if isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
            found[kw.arg] = kw.value.value
        elif isinstance(kw.value, ast.Name) and kw.value.id in consts:
            found[kw.arg] = consts[kw.value.id]
        else:
            computed.add(kw.arg)
    if "version" in computed:
        return found.get("name"), None, "computed"
    version = found.get("version")
    return found.get("name"), version, f"{rel} (setup(version=...))" if version else None


def _from_dunder(ck: Checkpoint, name: str | None) -> tuple[str | None, str | None]:
    """A literal ``__version__`` in the plugin's package (``clef_vllm``), found through its ``package_dir``:
    only asked when setup.py computes its version (often by reading that literal)."""
    package = canonical_name(name or PLUGIN_NAME).replace("-", "_")
    for module in (package, f"{package}._version", f"{package}.version"):
        rel = _module_file(ck, module)
        if rel is not None:
            value = _constants(_parse_py(ck, rel)).get("__version__")
            if value is not None:
                return value, f"{rel} (__version__)"
    return None, None


def read_bundled_plugin(ck: Checkpoint) -> BundledPlugin | None:
    """The plugin a checkpoint ships in ``vllm_plugin/`` (``None`` when it ships none). Only files the
    reader listed inside the checkpoint are opened (a symlink leading out was never listed)."""
    inside = [rel for rel in ck.files if rel.startswith(PLUGIN_DIR + "/")]
    if not inside and not os.path.isdir(ck.path(PLUGIN_DIR)):
        if PLUGIN_DIR in ck.files or os.path.lexists(ck.path(PLUGIN_DIR)):
            return BundledPlugin(PLUGIN_DIR, None, f"{PLUGIN_DIR} is not a folder (pip install ./{PLUGIN_DIR} "
                                                   "cannot install a plugin from it)")
        return None
    where = PLUGIN_DIR + "/"
    try:
        name: str | None = None
        version: str | None = None
        computed = False
        # setuptools' own order (pip builds agree): pyproject.toml's [project] wins over setup(...)'s
        # keywords, which win over setup.cfg; a version setup.py computes overrides setup.cfg's
        for reader in (_from_pyproject, _from_setup_py, _from_setup_cfg):
            n, v, w = reader(ck)
            name = name or n
            computed = computed or (version is None and w == "computed")
            if v is not None and version is None and not computed:
                version, where = v, w or where
        if version is None and computed:  # e.g. a setup.py that reads __version__ from the package when it runs
            version, w = _from_dunder(ck, name)
            where = w or where
        if version is None and computed:
            raise _Unread(f"{PLUGIN_DIR}/setup.py computes the version when it runs (setup(version=...) is no "
                          "string literal) and the package holds no literal __version__")
        packaging = [f"{PLUGIN_DIR}/{f}" for f in ("setup.py", "setup.cfg", "pyproject.toml")
                     if f"{PLUGIN_DIR}/{f}" in ck.files]
        if version is None and name is not None and packaging:
            # nothing states a version (a [project] table would have refused): setuptools builds 0.0.0
            version, where = NO_VERSION, f"{packaging[0]} (no version stated: setuptools builds {NO_VERSION})"
    except _Unread as exc:
        return BundledPlugin(where, None, str(exc))
    if name is None:
        return BundledPlugin(where, None, f"{PLUGIN_DIR}/ declares no package name (no pyproject.toml [project] "
                                          "name, setup.cfg [metadata] name or setup(name=...) literal)")
    if canonical_name(name) != PLUGIN_NAME:
        return BundledPlugin(where, None, f"{PLUGIN_DIR}/ declares the package {name!r}, not {PLUGIN_NAME}")
    if version is None:
        return BundledPlugin(where, None, f"{PLUGIN_DIR}/ states no version that can be read without running "
                                          "its build (no literal in pyproject.toml, setup.cfg, setup.py or "
                                          "__version__)")
    return BundledPlugin(where, version.strip())
