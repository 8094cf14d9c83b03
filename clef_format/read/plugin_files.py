"""The primitives every reader of ``vllm_plugin/`` shares: bounded text, TOML, Python source as ``ast``.

Nothing here imports or runs what it reads. A file that cannot be read exactly (too large, not UTF-8,
not valid TOML or Python, outside the plugin folder) raises ``Unread``, which names the file and says
why: the caller turns it into a note, never an exception of its own.
"""

from __future__ import annotations

import ast
import os
import posixpath
import re

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any

    from clef_format.read.checkpoint import Checkpoint

from clef_format.spec.layouts import PLUGIN_DIR  # the folder a release ships its plugin in

#: Largest packaging or module file read (the real ones are a few KB).
MAX_SOURCE_BYTES = 1024 * 1024
PYPROJECT = f"{PLUGIN_DIR}/pyproject.toml"
SETUP_PY = f"{PLUGIN_DIR}/setup.py"
SETUP_CFG = f"{PLUGIN_DIR}/setup.cfg"
#: The files pip's build of the folder reads first (which backend, and setuptools' own sources).
PACKAGING_FILES = (PYPROJECT, SETUP_CFG, SETUP_PY)


class Unread(Exception):
    """The version cannot be read: ``file`` (checkpoint-relative) is the file the reason is about."""

    def __init__(self, file: str, message: str) -> None:
        super().__init__(message)
        self.file = file


def canonical_name(name: str) -> str:
    """PEP 503 normalisation (``Clef_VLLM`` -> ``clef-vllm``): packaging's, imported only when a plugin is there."""
    from packaging.utils import canonicalize_name

    return str(canonicalize_name(name))


def requirement_names(data: dict[str, Any]) -> set[str]:
    """The canonical names of ``[build-system] requires`` (``setuptools-scm>=8`` -> ``setuptools-scm``)."""
    requires = table(data, "build-system").get("requires")
    names = set()
    for req in requires if isinstance(requires, list) else ():
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req) if isinstance(req, str) else None
        if m:
            names.add(canonical_name(m.group(1)))
    return names


def text(ck: Checkpoint, rel: str) -> str:
    """A file the checkpoint reader listed inside the checkpoint, as UTF-8 text, at most ``MAX_SOURCE_BYTES``."""
    size = ck.files[rel]
    if size > MAX_SOURCE_BYTES:
        raise Unread(rel, f"{rel} is {size} bytes, over the {MAX_SOURCE_BYTES} limit; not read")
    try:
        with open(ck.path(rel), "rb") as fh:
            data = fh.read(MAX_SOURCE_BYTES + 1)
    except OSError as exc:
        raise Unread(rel, f"{rel} cannot be read: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Unread(rel, f"{rel} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def never_read(ck: Checkpoint, rel: str) -> str | None:
    """Why ``rel``, there in the folder, was never opened (its own reading finding says so: a symlink
    leading outside the checkpoint, a FIFO or device), or None: what it states is then not known, which
    is not the same as stating nothing."""
    if rel in ck.escaped:
        return f"{rel} is a symlink leading outside the checkpoint, never read (path-escape): what it states is not known"
    if rel in ck.special:
        return f"{rel} is not a regular file, never opened (special-file): what it states is not known"
    if rel not in ck.files and os.path.lexists(ck.path(rel)):  # a folder, or a symlink leading nowhere
        return f"{rel} is there but is not a file that can be read (a folder, or a symlink leading nowhere)"
    return None


def plugin_file(ck: Checkpoint, named: object, via: str, what: str = "file") -> str:
    """The checkpoint-relative path of a file a packaging setting names relative to ``vllm_plugin/``
    (``./x`` is ``x``); ``Unread`` when it is no string, leaves the folder or is not there (the build
    fails then, or reads something that is not the release's)."""
    if not isinstance(named, str) or not named.strip():
        raise Unread(via.split(" ")[0], f"{via} names no {what}")
    if named.strip().startswith("/"):
        raise Unread(via.split(" ")[0], f"{via} names {named!r}, a path outside {PLUGIN_DIR}/")
    rel = posixpath.normpath(f"{PLUGIN_DIR}/{named.strip()}")
    why = never_read(ck, rel)
    if why is not None:
        raise Unread(rel, f"{via} names {named!r}: {why}")
    if not rel.startswith(PLUGIN_DIR + "/") or rel not in ck.files:
        raise Unread(via.split(" ")[0], f"{via} names {named!r}, which is not a {what} in {PLUGIN_DIR}/")
    return rel


def parse_toml(text_: str) -> dict[str, Any]:
    try:
        import tomllib  # Python 3.11+
    except ImportError:  # Python 3.10: tomli when installed, else the small reader below
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError:
            return mini_toml(text_)
    return tomllib.loads(text_)


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


def mini_toml(text_: str) -> dict[str, Any]:
    """The few TOML forms a plugin's ``pyproject.toml`` states its name and version in (tables, string
    keys, one-line arrays and inline tables), for Python 3.10 without tomli. Anything else is skipped."""
    out: dict[str, Any] = {}
    table = out
    for line in text_.splitlines():
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


def pyproject(ck: Checkpoint) -> dict[str, Any]:
    """``vllm_plugin/pyproject.toml`` as a table (the caller checks that the file is there)."""
    try:
        data = parse_toml(text(ck, PYPROJECT))
    except (ValueError, RecursionError, MemoryError) as exc:  # tomllib.TOMLDecodeError is a ValueError
        raise Unread(PYPROJECT, f"{PYPROJECT} is not valid TOML ({exc})") from None
    return data


def table(data: dict[str, Any], *keys: str) -> dict[str, Any]:
    """``data[k1][k2]...`` when each is a table, else an empty one."""
    for key in keys:
        value = data.get(key)
        data = value if isinstance(value, dict) else {}
    return data


def pep621_name_and_dynamic(project: dict[str, Any], backend: str) -> tuple[str | None, bool]:
    """PEP 621's ``[project]``, as every backend reads it: (name, whether version is dynamic); a version
    both given and listed in ``dynamic`` is refused by every backend, so it is ``Unread``."""
    name = project.get("name") if isinstance(project.get("name"), str) else None
    dynamic = project.get("dynamic")
    is_dynamic = isinstance(dynamic, list) and "version" in dynamic
    if "version" in project and is_dynamic:
        raise Unread(PYPROJECT, f"{PYPROJECT} gives [project] version and lists it in dynamic: {backend} refuses "
                                "to build it (PEP 621)")
    return name, is_dynamic


def parse_py(ck: Checkpoint, rel: str) -> ast.Module:
    source = text(ck, rel)
    try:
        return ast.parse(source, filename=rel)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise Unread(rel, f"{rel} is not valid Python ({type(exc).__name__}: {exc})") from None


#: Calls that may bind any name of the module they run in (``exec(open("v.py").read())``, ``globals()[k] = v``).
_BINDS_ANY = frozenset({"exec", "eval", "globals", "vars", "locals", "setattr", "delattr", "__import__"})


#: How a statement that binds a name other than by ``NAME = "literal"`` is named in a note.
_STATEMENTS = {"AugAssign": "an augmented assignment", "Assign": "an assignment of an expression or to a tuple",
               "AnnAssign": "an assignment of an expression", "Expr": "an assignment expression (:=)",
               "If": "under if", "For": "a for loop", "AsyncFor": "a for loop", "While": "a while loop",
               "Try": "under try", "TryStar": "under try", "With": "under with", "AsyncWith": "under with",
               "Match": "under match", "Import": "an import", "ImportFrom": "an import", "Delete": "del",
               "FunctionDef": "a def", "AsyncFunctionDef": "a def", "ClassDef": "a class", "TypeAlias": "a type alias"}


def _how_bound(stmt: ast.stmt, name: str) -> str | None:
    """How ``stmt`` (a statement of the module itself) binds, or may bind, the module-level ``name``,
    other than by a plain string-literal assignment (the caller takes those); ``None`` when it does not.
    Nested function, lambda and class bodies are scopes of their own: only ``global``/``nonlocal`` and the
    calls that may bind any name count there. Iterative: a hostile nesting cannot overflow the stack."""
    stack: list[tuple[ast.AST, bool]] = [(stmt, True)]  # (node, in the module's own scope)
    while stack:
        node, here = stack.pop()
        if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return f"declares {name} global in a function"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _BINDS_ANY:
            return f"calls {node.func.id}(), which may bind any name"
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return "imports * from a module, which may bind any name"
        if isinstance(node, ast.Attribute) and (node.attr == "__dict__" or (
                node.attr == name and isinstance(node.ctx, (ast.Store, ast.Del)))):
            return f"sets {name} or __dict__ as an attribute (the module through sys.modules)"
        if here:
            bound = (isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, (ast.Store, ast.Del))
                     or isinstance(node, (ast.Import, ast.ImportFrom))
                     and any((a.asname or a.name.split(".")[0]) == name for a in node.names)
                     or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name
                     or isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name == name
                     or isinstance(node, ast.MatchMapping) and node.rest == name)
            if bound:
                kind = _STATEMENTS.get(type(stmt).__name__, f"a {type(stmt).__name__} statement")
                return f"binds {name} other than by a plain string literal ({kind})"
        if isinstance(node, ast.AnnAssign) and node.value is None and node is stmt:
            stack.append((node.annotation, here))  # ``NAME: str`` alone binds nothing
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            outer: list[ast.AST] = [*args.defaults, *(d for d in args.kw_defaults if d is not None)]
            if not isinstance(node, ast.Lambda):
                outer += [*node.decorator_list, *(a.annotation for a in (*args.posonlyargs, *args.args,
                          *args.kwonlyargs, args.vararg, args.kwarg) if a is not None and a.annotation is not None)]
                outer += [node.returns] if node.returns is not None else []
            stack += [(n, here) for n in outer]
            stack += [(n, False) for n in (node.body if isinstance(node.body, list) else [node.body])]
        elif isinstance(node, ast.ClassDef):
            stack += [(n, here) for n in (*node.decorator_list, *node.bases, *node.keywords)]
            stack += [(n, False) for n in node.body]
        else:
            stack += [(n, here) for n in ast.iter_child_nodes(node)]
    return None


def bound_string(tree: ast.Module, rel: str, name: str, until: ast.stmt | None = None, use: str = "") -> str:
    """The string the module-level ``name`` of ``rel`` holds where it is used, read without running it: THE
    rule for every module constant a version is read from (``setup(version=NAME)``, ``attr:``).

    The module's own statements are followed in order up to ``until``, the statement that uses the name
    (``setup(...)``; ``None``: the end of the module, the module as imported, for ``attr:``); that
    statement itself is looked at too. Each ``NAME = "literal"`` (or ``NAME: str = "literal"``) sets the
    value; anything else that binds or may bind the name (``+=``, an expression, a tuple target, a binding
    under ``if``/``for``/``while``/``try``/``with``/``match``, an import, ``global``, ``del``, a ``def``,
    ``exec``/``globals()``...) makes it unknown: ``Unread`` naming the file and line, never a guess. For
    ``attr:`` (``until=None``) setuptools reads the FIRST assignment without running the module and
    imports the module when it cannot, so the literals must all agree: one that differs is ``Unread``
    too. A name never bound before its use is ``Unread`` (the build stops on a ``NameError``)."""
    use = use or (f"setup(...) at line {until.lineno}" if until is not None else "the end of the module")
    values: list[str] = []
    for stmt in tree.body:
        if stmt is until:
            break
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(
            stmt, ast.AnnAssign) and stmt.value is not None else []
        value = literal(stmt.value) if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
        if (value is not None and all(isinstance(t, ast.Name) for t in targets)
                and any(isinstance(t, ast.Name) and t.id == name for t in targets)):
            values.append(value)
            continue
        why = _how_bound(stmt, name)
        if why is not None:
            raise Unread(rel, f"{rel} line {stmt.lineno} {why} before {use}: its value there is decided "
                              "when the module runs, and clef-format never runs it")
    why = _how_bound(until, name) if until is not None else None
    if until is not None and why is not None:
        raise Unread(rel, f"{rel} line {until.lineno} {why} in {use}: its value there is decided when the "
                          "module runs, and clef-format never runs it")
    if not values:
        raise Unread(rel, f"{rel} assigns no string literal to {name} before {use}")
    if until is None and len(set(values)) > 1:
        raise Unread(rel, f"{rel} assigns {name} {len(values)} different string literals ({values[0]!r} first, "
                          f"{values[-1]!r} last): setuptools reads the first without running the module, an "
                          "import gives the last; which one a build gets is not read")
    return values[-1]


def literal(value: ast.expr | None) -> str | None:
    """A string literal's text; ``None`` for anything computed."""
    return value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else None
