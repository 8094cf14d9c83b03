"""The import rules of docs/ARCHITECTURE.md, enforced: who may import whom, and who may import torch,
vllm or tqdm; and the light packages really stay light when imported in a fresh interpreter.

Imports are read from the source with ``ast`` (every import statement, at module level or inside a
function, except those under ``if TYPE_CHECKING:``, which never run), so an arrow added anywhere in
a module is seen without importing it.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "clef_format"

#: Package (first component under clef_format) -> the clef_format packages it may import.
ALLOWED: dict[str, set[str]] = {
    "records": set(),
    "errors": set(),
    "progress": set(),
    "shell": set(),
    "spec": {"records", "errors", "shell"},
    "read": {"spec", "records", "errors", "shell"},
    "report": {"spec", "records", "shell"},
    "vllm_rules": {"spec", "read", "records", "errors", "shell"},
    "verify": {"spec", "read", "vllm_rules", "records", "errors", "report", "progress", "shell"},
    "quant": {"spec", "errors", "records"},
    "migrate": {"spec", "read", "verify", "quant", "migrations", "records", "errors", "report", "progress", "shell"},
    "migrations": {"spec", "read", "errors", "records", "migrate.plan", "migrate.build", "shell"},
    "fixtures": {"spec", "read", "quant", "records", "errors", "shell"},
    "vllm": {"spec", "read", "vllm_rules", "verify", "quant", "records", "errors", "report", "progress", "shell"},
    "cli": {"spec", "read", "vllm_rules", "verify", "quant", "migrate", "migrations", "fixtures", "records",
            "errors", "report", "progress", "shell"},
    # import paths kept for plugins: re-exports only
    "compat": {"errors", "spec", "vllm"},
    "int8_gather": {"vllm"},
    "__main__": {"cli"},
    "__init__": set(),
}
#: Third-party packages only some packages may import.
RESTRICTED: dict[str, set[str]] = {
    # torch only where tensors meet a device: the serving hooks and their int8 gather kernel. The torch
    # reference quantizer and the torch test helpers live in tests/support/, outside the package.
    "torch": {"vllm"},
    "triton": {"vllm"},
    "vllm": {"vllm"},
    "tqdm": {"cli"},
    "rich": set(),  # not a dependency any more: the progress bars are tqdm's
    # the template sources: only scripts/generate_templates.py (make templates), outside the package
    "transformers": set(),
    "compressed_tensors": set(),
}


def _modules() -> list[Path]:
    """Every module of the package, migrations/ and fixtures/ included (symlinked folders are followed)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(PKG, followlinks=True):
        # fixtures/head_references: joint_schema_model.py files a checkpoint ships (torch modules), written
        # into built checkpoints as text; no module of clef_format imports them
        dirnames[:] = [d for d in dirnames if d not in ("__pycache__", "head_references")]
        out.extend(Path(dirpath) / f for f in filenames if f.endswith(".py"))
    return sorted(out)


def _package(path: Path) -> str:
    rel = path.relative_to(PKG).with_suffix("")
    return rel.parts[0]


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def imports_of(path: Path) -> list[str]:
    """Absolute module names a file imports at run time (relative imports resolved)."""
    tree = ast.parse(path.read_text())
    here = ["clef_format", *path.relative_to(PKG).with_suffix("").parts]
    out: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level] if path.name != "__init__.py" else here[: len(here) - node.level]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.append(mod)
            out.extend(f"{mod}.{a.name}" for a in node.names)  # `from pkg import submodule`
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


#: The repository's top-level folders installed inside clef_format through symlinks: an import of
#: ``migrations.x`` or ``fixtures.x`` (the repository root on ``sys.path``) loads the same file as
#: ``clef_format.migrations.x``, so it is checked as that.
SYMLINKED = ("migrations", "fixtures")


def canonical(name: str) -> str:
    """The ``clef_format.`` name of an import (top-level ``migrations``/``fixtures`` resolved to the package)."""
    return f"clef_format.{name}" if name.split(".")[0] in SYMLINKED else name


def _target(name: str) -> str | None:
    """The clef_format package an import names (``migrate.plan`` kept whole for the planning primitives)."""
    parts = canonical(name).split(".")
    if parts[0] != "clef_format" or len(parts) < 2:
        return None
    if parts[1] == "migrate" and len(parts) > 2 and parts[2] in ("plan", "build"):
        return f"migrate.{parts[2]}"
    return parts[1] if (PKG / parts[1]).exists() or (PKG / f"{parts[1]}.py").exists() else None


def violations() -> list[str]:
    bad = []
    for path in _modules():
        pkg = _package(path)
        allowed = ALLOWED[pkg] | {pkg}
        for name in imports_of(path):
            target = _target(name)
            if target is not None:
                ok = target in allowed or (target.startswith("migrate.") and "migrate" in allowed)
                if not ok:
                    bad.append(f"{path.relative_to(PKG)} imports {name} ({pkg} -> {target})")
            top = name.split(".")[0]
            if top in RESTRICTED and pkg not in RESTRICTED[top]:
                bad.append(f"{path.relative_to(PKG)} imports {top}, allowed only in {sorted(RESTRICTED[top])}")
    return bad


def module_file(name: str, root: Path | None = None) -> Path | None:
    """The module file an import loads: ``clef_format.a.b`` -> ``a/b.py`` or ``a/b/__init__.py`` under the
    package (the symlinked migrations/ and fixtures/ followed); ``None`` outside clef_format."""
    root = PKG if root is None else root
    parts = canonical(name).split(".")
    if parts[0] != "clef_format":
        return None
    base = root.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py") if len(parts) > 1 else None, base / "__init__.py"):
        if candidate is not None and candidate.is_file():
            return candidate
    return None


def _imported(node: ast.AST, path: Path) -> list[tuple[str, str | None]]:
    """(module, name) pairs of one import statement: ``(mod, None)`` for ``import mod``, ``(mod, name)`` for
    ``from mod import name`` (relative imports resolved against ``path``)."""
    if isinstance(node, ast.Import):
        return [(a.name, None) for a in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        here = ["clef_format", *path.relative_to(PKG).with_suffix("").parts]
        mod = ".".join(here[: len(here) - node.level] + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    return [(mod, a.name) for a in node.names]


def _runtime_imports(path: Path) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a file that runs (not those under ``if TYPE_CHECKING:``)."""
    out: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return out


def file_graph() -> dict[Path, set[Path]]:
    """File -> the module files of clef_format it imports (``from pkg import sub`` counts as ``pkg.sub``
    when ``sub`` is a module, else as ``pkg``)."""
    graph: dict[Path, set[Path]] = {}
    for path in _modules():
        edges: set[Path] = set()
        for node in _runtime_imports(path):
            for mod, name in _imported(node, path):
                target = (module_file(f"{mod}.{name}") if name else None) or module_file(mod)
                if target is not None and target != path:  # a module importing itself (a __main__ block) is no circle
                    edges.add(target)
        graph[path] = edges
    return graph


def circles(graph: dict[Path, set[Path]]) -> list[list[str]]:
    """The import circles between files: every strongly connected component of more than one file (Tarjan)."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on_stack: set[Path] = set()
    found: list[list[str]] = []

    def strong(v: Path) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(str(w.relative_to(PKG)))
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sorted(found)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_reaches() -> list[str]:
    """Every use of another module's private (underscore) name: ``from mod import _name``, and
    ``alias._name`` where ``alias`` is a clef_format module this file imported."""
    bad = []
    for path in _modules():
        rel = path.relative_to(PKG)
        aliases: dict[str, Path] = {}
        for node in _runtime_imports(path):
            for mod, name in _imported(node, path):
                if module_file(mod) is None:
                    continue
                as_module = module_file(f"{mod}.{name}") if name else module_file(mod)
                bound = next(a for a in node.names if a.name == (name or mod))
                if name and _private(name) and as_module is None:
                    bad.append(f"{rel} imports {name} from {mod}")
                if as_module is not None and as_module != path:
                    if _private((name or mod).split(".")[-1]):
                        bad.append(f"{rel} imports the private module {mod}{'.' + name if name else ''}")
                    if bound.asname or name:  # `import a.b` binds `a`, not the module: only aliases are followed
                        aliases[bound.asname or name or mod] = as_module
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and _private(node.attr)):
                bad.append(f"{rel} reaches {node.value.id}.{node.attr}")
    return bad


def test_no_import_circle_between_files() -> None:
    """No file imports, directly or through others, a file that imports it (lazy imports inside functions
    count: a circle is one job cut in two, whatever the import order papers over)."""
    assert circles(file_graph()) == []


def test_no_module_reaches_into_anothers_private_names() -> None:
    """A name shared between modules is public: an underscore name is its module's own."""
    assert private_reaches() == []


def test_the_symlinked_packages_are_resolved() -> None:
    """The arrows of migrations/ and fixtures/ are checked: their imports resolve to the files behind the
    symlinks, under either name."""
    graph = file_graph()
    session, steps = PKG / "migrate" / "session.py", PKG / "migrations" / "__init__.py"
    builders = PKG / "fixtures" / "builders.py"
    assert steps in graph[session]
    assert PKG / "migrate" / "plan.py" in graph[steps]
    assert PKG / "cli" / "commands" / "example_cmd.py" in {p for p, e in graph.items() if builders in e}
    assert module_file("fixtures.builders") == module_file("clef_format.fixtures.builders") == builders
    assert _target("migrations.v0001_int8_tables") == "migrations"


#: The libraries of the test tiers, which no module of the fixture builders may import: the builders (and
#: so ``clef-format example``) need only numpy and the standard library.
TEST_LIBRARIES = {"torch", "safetensors", "transformers", "compressed_tensors", "pytest", "hypothesis", "tests"}


def test_the_fixture_builders_need_no_test_libraries() -> None:
    bad = [f"fixtures/{path.name} imports {name}" for path in _modules() if _package(path) == "fixtures"
           for name in imports_of(path) if name.split(".")[0] in TEST_LIBRARIES]
    assert bad == []


def test_the_package_imports_no_test_code() -> None:
    """Only the product ships: nothing under clef_format/ imports tests/ or scripts/ (test and maintainer code)."""
    bad = [f"{p.relative_to(PKG)} imports {n}" for p in _modules() for n in imports_of(p)
           if n.split(".")[0] in ("tests", "scripts")]
    assert bad == []


def test_every_package_has_rules() -> None:
    assert {_package(p) for p in _modules()} <= set(ALLOWED)


def test_no_import_breaks_the_rules() -> None:
    assert violations() == []


def test_the_rules_catch_an_upward_arrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker itself: a step that imports the engine is reported."""
    import shutil

    copy = tmp_path / "clef_format"  # a copy: the real tree is never written (other tests read it in parallel)
    shutil.copytree(PKG, copy, symlinks=False, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "migrations" / "_arrow_probe.py").write_text("def f():\n    from clef_format.migrate.session import migrate\n")
    monkeypatch.setattr(sys.modules[__name__], "PKG", copy)
    assert any("_arrow_probe" in v for v in violations())


@pytest.mark.parametrize("module, heavy", [
    ("clef_format.spec.layouts", ("torch", "numpy", "packaging", "huggingface_hub", "tqdm", "clef_format.read")),
    ("clef_format.spec.findings", ("torch", "numpy", "packaging", "typing")),
    ("clef_format.read.checkpoint", ("torch", "numpy", "huggingface_hub", "tqdm", "safetensors")),
    ("clef_format.verify.run", ("torch", "numpy", "huggingface_hub", "tqdm", "safetensors", "clef_format.migrate")),
    ("clef_format.vllm_rules.matching", ("torch", "vllm", "compressed_tensors", "transformers")),
    ("clef_format.migrate.session", ("torch", "vllm", "tqdm")),
    ("clef_format.migrate.manifest_writer", ("torch", "vllm", "tqdm")),
    ("clef_format.vllm", ("torch", "vllm", "triton")),
    ("clef_format.compat", ("torch", "vllm")),
    # clef-format example on a plain install: the builders read frozen templates and write with numpy
    ("clef_format.fixtures.builders", ("torch", "transformers", "compressed_tensors", "safetensors", "tqdm")),
    ("clef_format.cli.commands.example_cmd", ("torch", "transformers", "compressed_tensors")),
])
def test_importing_stays_light(module: str, heavy: tuple[str, ...]) -> None:
    # against what the interpreter had loaded before (a site or sitecustomize may import typing at startup,
    # as the device image's does): only what importing the module adds counts
    code = (f"import sys\nbefore = set(sys.modules)\nimport {module}\n"
            f"print([m for m in {heavy!r} if m in sys.modules and m not in before])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"{module} imports {out.strip()}"


#: Packages that may write to the filesystem (docs/ARCHITECTURE.md): the migration engine (and the
#: manifest writer in it) and the fixture builders.
WRITERS = {"migrate", "fixtures"}
_OS_WRITES = {"rename", "replace", "unlink", "remove", "mkdir", "makedirs", "rmdir", "removedirs", "link", "symlink",
              "truncate", "ftruncate", "write", "pwrite", "pwritev", "chmod", "fchmod", "renames", "mkfifo",
              "copy_file_range", "sendfile"}
_SHUTIL_WRITES = {"rmtree", "copy", "copy2", "copyfile", "copytree", "move", "copymode", "copystat"}
_PATH_WRITES = {"write_text", "write_bytes", "mkdir", "unlink", "rmdir", "touch", "rename", "chmod"}  # not replace: str has it


def _writes(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            if (f.value.id == "os" and f.attr in _OS_WRITES) or (f.value.id == "shutil" and f.attr in _SHUTIL_WRITES):
                found.append(f"{f.value.id}.{f.attr}")
        elif isinstance(f, ast.Attribute) and f.attr in _PATH_WRITES and not isinstance(f.value, ast.Name):
            found.append(f".{f.attr}")
        elif isinstance(f, ast.Name) and f.id == "open":
            mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
            if isinstance(mode, ast.Constant) and isinstance(mode.value, str) and set(mode.value) & set("wax+"):
                found.append(f"open(..., {mode.value!r})")
    return found


def test_only_the_writers_write() -> None:
    bad = [f"{p.relative_to(PKG)}: {', '.join(w)}" for p in _modules()
           if _package(p) not in WRITERS and (w := _writes(p))]
    assert bad == []


def test_the_core_install_has_no_torch() -> None:
    """torch is in the ``vllm``, ``fixtures`` and ``test`` extras only: verify, migrate and manifest run without it."""
    import tomllib

    project = tomllib.loads((PKG.parent / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.split(">")[0].split("=")[0].strip() == "torch"]
    assert any(d.startswith("torch") for d in project["optional-dependencies"]["vllm"])


def test_the_extras() -> None:
    """The core install: no torch, transformers, compressed-tensors or rich (example runs without them);
    ``fixtures`` brings the template sources and torch, ``test`` everything the main tier imports."""
    import re
    import tomllib

    project = tomllib.loads((PKG.parent / "pyproject.toml").read_text())["project"]

    def names(reqs: list[str]) -> set[str]:
        return {re.split(r"[<>=!~;\[ ]", r, maxsplit=1)[0].strip().lower().replace("_", "-") for r in reqs}

    core = names(project["dependencies"])
    extras = {k: names(v) for k, v in project["optional-dependencies"].items()}
    assert core == {"packaging", "safetensors", "huggingface-hub", "blake3", "numpy", "tqdm"}
    assert extras["fixtures"] == {"torch", "transformers", "compressed-tensors"}
    assert extras["vllm"] == {"torch"}
    assert {"clef-format", "pytest", "hypothesis", "pytest-xdist", "setuptools"} <= extras["test"]
