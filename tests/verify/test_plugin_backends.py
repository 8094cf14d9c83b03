"""The bundled plugin's version under every build backend pip may run for ``vllm_plugin/``: hatchling,
flit-core, poetry-core, pdm-backend (and the setuptools plugins that take it from git), read statically.

Each form is a real ``vllm_plugin/`` folder. Where the backend is installed, the backend itself builds
the folder's metadata (its ``prepare_metadata_for_build_wheel``, in a subprocess) and the version it
writes must be the one read here; where it is not, that comparison is skipped and the reading still
is checked. A version only the build can decide (version control, code it runs, an unknown backend)
is a ``bundled-plugin-unread`` warning naming the file and why, never a made-up version.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from clef_format.read.checkpoint import read_checkpoint
from clef_format.read.plugin_source import read_bundled_plugin
from clef_format.verify import verify

REPO = Path(__file__).resolve().parents[2]
_DESC = 'description = "Clef serving plugin (fixture copy)"\n'


def _toml(backend: str, requires: str, body: str) -> str:
    return f'[build-system]\nrequires = ["{requires}"]\nbuild-backend = "{backend}"\n\n{body}'


HATCH = ("hatchling.build", "hatchling")
FLIT = ("flit_core.buildapi", "flit_core>=3.4")
POETRY = ("poetry.core.masonry.api", "poetry-core>=2")
PDM = ("pdm.backend", "pdm-backend")
SETUPTOOLS = ("setuptools.build_meta", "setuptools>=77")


def write_form(plugin: Path, form: str, version: str) -> str | None:
    """Write ``plugin`` (a vllm_plugin/ folder) as clef-vllm ``version`` in ``form``; returns the module
    name of the backend that builds it (None: no backend here can build it: the version is unread)."""
    pkg = plugin / "clef_vllm"
    pkg.mkdir(parents=True, exist_ok=True)
    init = f'"""clef-vllm (fixture copy)."""\n\n__version__ = "{version}"\n'
    (pkg / "__init__.py").write_text(init)
    (plugin / "README.md").write_text("clef-vllm\n")
    project = '[project]\nname = "clef-vllm"\n'
    py = plugin / "pyproject.toml"
    if form == "hatch-static":
        py.write_text(_toml(*HATCH, project + f'version = "{version}"\n' + _DESC))
    elif form == "hatch-path":
        (pkg / "__about__.py").write_text(f"# the version\n__version__ = 'v{version}'\n")
        (pkg / "__init__.py").write_text('"""clef-vllm."""\n\n__version__ = "9.9.9"  # not the one hatchling reads\n')
        py.write_text(_toml(*HATCH, project + 'dynamic = ["version"]\n' + _DESC
                            + '\n[tool.hatch.version]\npath = "clef_vllm/__about__.py"\n'))
    elif form == "hatch-ignores-setup-py":  # hatchling never reads setup.py or setup.cfg: their 9.9.9 is a decoy
        (plugin / "setup.py").write_text('from setuptools import setup\nsetup(name="clef-vllm", version="9.9.9")\n')
        (plugin / "setup.cfg").write_text("[metadata]\nname = clef-vllm\nversion = 9.9.9\n")
        (pkg / "__about__.py").write_text(f'__version__ = "{version}"\n')
        py.write_text(_toml(*HATCH, project + 'dynamic = ["version"]\n' + _DESC
                            + '\n[tool.hatch.version]\npath = "clef_vllm/__about__.py"\n'))
    elif form == "flit-static":
        py.write_text(_toml(*FLIT, project + f'version = "{version}"\n' + _DESC))
    elif form == "flit-dynamic":
        py.write_text(_toml(*FLIT, project + 'dynamic = ["version", "description"]\n'))
    elif form == "flit-init-over-version-py":  # flit reads version.py, then __init__.py: the last found wins
        (pkg / "version.py").write_text('__version__ = "9.9.9"\n')
        py.write_text(_toml(*FLIT, project + 'dynamic = ["version"]\n' + _DESC))
    elif form == "flit-src-module":  # [tool.flit.module] name, in src/
        shutil.rmtree(pkg)
        (plugin / "src" / "clef_serving").mkdir(parents=True)
        (plugin / "src" / "clef_serving" / "__init__.py").write_text(
            f'"""clef-vllm."""\nimport os\n\n__version__ = os.environ.get("X", "9.9.9")\n__version__ = "{version}"\n')
        py.write_text(_toml(*FLIT, project + 'dynamic = ["version"]\n' + _DESC
                            + '\n[tool.flit.module]\nname = "clef_serving"\n'))
    elif form == "poetry-tool":
        py.write_text(_toml(*POETRY, f'[tool.poetry]\nname = "clef-vllm"\nversion = "{version}"\n'
                            'description = "Clef serving plugin"\nauthors = ["Clef <clef@example.com>"]\n'
                            'packages = [{include = "clef_vllm"}]\n'))
    elif form == "poetry-project":  # [project] version wins over [tool.poetry]'s (a decoy here)
        py.write_text(_toml(*POETRY, project + f'version = "{version}"\n' + _DESC
                            + '\n[tool.poetry]\nversion = "9.9.9"\npackages = [{include = "clef_vllm"}]\n'))
    elif form == "poetry-dynamic":  # PEP 621 with the version kept in [tool.poetry]
        py.write_text(_toml(*POETRY, project + 'dynamic = ["version"]\n' + _DESC
                            + f'\n[tool.poetry]\nversion = "{version}"\npackages = [{{include = "clef_vllm"}}]\n'))
    elif form == "pdm-static":
        py.write_text(_toml(*PDM, project + f'version = "{version}"\n' + _DESC))
    elif form == "pdm-file":
        (pkg / "__init__.py").write_text(f'"""clef-vllm."""\n\n__version__ = "{version}"  # set by the release\n')
        py.write_text(_toml(*PDM, project + 'dynamic = ["version"]\n' + _DESC
                            + '\n[tool.pdm.version]\nsource = "file"\npath = "clef_vllm/__init__.py"\n'))
    elif form == "pdm-nothing":  # pdm-backend's own default when no version is configured
        py.write_text(_toml(*PDM, project + 'dynamic = ["version"]\n' + _DESC))
        return PDM[0]
    # what only the build can decide: unread
    elif form == "hatch-vcs":
        py.write_text('[build-system]\nrequires = ["hatchling", "hatch-vcs"]\nbuild-backend = "hatchling.build"\n\n'
                      + project + 'dynamic = ["version"]\n' + _DESC + '\n[tool.hatch.version]\nsource = "vcs"\n')
        return None
    elif form == "hatch-code":
        py.write_text(_toml(*HATCH, project + 'dynamic = ["version"]\n' + _DESC
                            + '\n[tool.hatch.version]\nsource = "code"\npath = "clef_vllm/__init__.py"\n'))
        return None
    elif form == "hatch-pattern":
        py.write_text(_toml(*HATCH, project + 'dynamic = ["version"]\n' + _DESC
                            + '\n[tool.hatch.version]\npath = "clef_vllm/__init__.py"\npattern = "(a+)+$"\n'))
        return None
    elif form == "hatch-metadata-hook":  # a hook (hatch_build.py, code) may set the dynamic version
        py.write_text(_toml(*HATCH, project + 'dynamic = ["version"]\n' + _DESC
                            + '\n[tool.hatch.version]\npath = "clef_vllm/__init__.py"\n'
                            '\n[tool.hatch.metadata.hooks.custom]\n'))
        return None
    elif form == "pdm-pattern":
        py.write_text(_toml(*PDM, project + 'dynamic = ["version"]\n' + _DESC
                            + '\n[tool.pdm.version]\nsource = "file"\npath = "clef_vllm/__init__.py"\n'
                            'pattern = "__version__ = .(.+)."\n'))
        return None
    elif form == "flit-computed":
        (pkg / "__init__.py").write_text('"""clef-vllm."""\nimport os\n\n__version__ = os.environ["CLEF_VERSION"]\n')
        py.write_text(_toml(*FLIT, project + 'dynamic = ["version"]\n' + _DESC))
        return None
    elif form == "pdm-scm":
        py.write_text(_toml(*PDM, project + 'dynamic = ["version"]\n' + _DESC + '\n[tool.pdm.version]\nsource = "scm"\n'))
        return None
    elif form == "pdm-call":
        py.write_text(_toml(*PDM, project + 'dynamic = ["version"]\n' + _DESC
                            + '\n[tool.pdm.version]\nsource = "call"\ngetter = "clef_vllm:get_version"\n'))
        return None
    elif form == "setuptools-scm-requires":
        py.write_text('[build-system]\nrequires = ["setuptools>=77", "setuptools_scm[toml]>=8"]\n'
                      'build-backend = "setuptools.build_meta"\n\n' + project + 'dynamic = ["version"]\n' + _DESC)
        return None
    elif form == "setuptools-scm-table":
        (plugin / "setup.cfg").write_text(f"[metadata]\nname = clef-vllm\nversion = {version}\n")
        py.write_text(_toml(*SETUPTOOLS, "[tool.setuptools_scm]\n"))
        return None
    elif form == "setuptools-scm-setup-py":
        py.write_text(_toml(*SETUPTOOLS, ""))
        (plugin / "setup.py").write_text('from setuptools import setup\nsetup(name="clef-vllm", use_scm_version=True)\n')
        return None
    elif form == "poetry-dynamic-versioning":
        py.write_text('[build-system]\nrequires = ["poetry-core", "poetry-dynamic-versioning"]\n'
                      'build-backend = "poetry_dynamic_versioning.backend"\n\n[tool.poetry]\nname = "clef-vllm"\n'
                      'version = "0.0.0"\n\n[tool.poetry-dynamic-versioning]\nenable = true\n')
        return None
    elif form == "unknown-backend":
        py.write_text(_toml("maturin", "maturin>=1", project + 'dynamic = ["version"]\n'))
        return None
    elif form == "in-tree-backend":
        py.write_text('[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["_build"]\n\n'
                      + project + f'version = "{version}"\n')
        return None
    else:
        raise ValueError(form)
    return py.read_text().split('build-backend = "')[1].split('"')[0]


READ = {  # form -> where the version is read from
    "hatch-static": "vllm_plugin/pyproject.toml ([project] version)",
    "hatch-path": "vllm_plugin/clef_vllm/__about__.py (__version__, via vllm_plugin/pyproject.toml "
                  "[tool.hatch.version] path)",
    "hatch-ignores-setup-py": "vllm_plugin/clef_vllm/__about__.py (__version__, via vllm_plugin/pyproject.toml "
                              "[tool.hatch.version] path)",
    "flit-static": "vllm_plugin/pyproject.toml ([project] version)",
    "flit-dynamic": "vllm_plugin/clef_vllm/__init__.py (__version__, via flit's dynamic version)",
    "flit-init-over-version-py": "vllm_plugin/clef_vllm/__init__.py (__version__, via flit's dynamic version)",
    "flit-src-module": "vllm_plugin/src/clef_serving/__init__.py (__version__, via flit's dynamic version)",
    "poetry-tool": "vllm_plugin/pyproject.toml ([tool.poetry] version)",
    "poetry-project": "vllm_plugin/pyproject.toml ([project] version)",
    "poetry-dynamic": "vllm_plugin/pyproject.toml ([tool.poetry] version)",
    "pdm-static": "vllm_plugin/pyproject.toml ([project] version)",
    "pdm-file": "vllm_plugin/clef_vllm/__init__.py (__version__, via vllm_plugin/pyproject.toml "
                "[tool.pdm.version] path)",
}
UNREAD = {  # form -> (the file the warning names, what it says)
    "hatch-vcs": ("vllm_plugin/pyproject.toml", 'source = "vcs": hatch-vcs sets the version from version control'),
    "hatch-code": ("vllm_plugin/pyproject.toml", "source = 'code': the version is decided when the build runs"),
    "hatch-pattern": ("vllm_plugin/pyproject.toml", "custom pattern"),
    "hatch-metadata-hook": ("vllm_plugin/pyproject.toml", "[tool.hatch.metadata.hooks]: code the build runs"),
    "pdm-pattern": ("vllm_plugin/pyproject.toml", "custom pattern"),
    "flit-computed": ("vllm_plugin/clef_vllm/__init__.py", "flit imports the module when it builds"),
    "pdm-scm": ("vllm_plugin/pyproject.toml", 'source = "scm": the version comes from version control'),
    "pdm-call": ("vllm_plugin/pyproject.toml", "source = 'call': the version is decided when the build runs"),
    "setuptools-scm-requires": ("vllm_plugin/pyproject.toml", "requires setuptools-scm: setuptools-scm sets the "
                                "version from version control"),
    "setuptools-scm-table": ("vllm_plugin/pyproject.toml", "[tool.setuptools_scm] table"),
    "setuptools-scm-setup-py": ("vllm_plugin/setup.py", "setup(use_scm_version=...)"),
    "poetry-dynamic-versioning": ("vllm_plugin/pyproject.toml", "poetry-dynamic-versioning sets the version from "
                                  "version control"),
    "unknown-backend": ("vllm_plugin/pyproject.toml", "builds with 'maturin', a backend whose version clef-format "
                        "does not read statically"),
    "in-tree-backend": ("vllm_plugin/pyproject.toml", "in-tree backend"),
}
_BACKEND_MODULE = {HATCH[0]: "hatchling", FLIT[0]: "flit_core", POETRY[0]: "poetry.core", PDM[0]: "pdm.backend"}


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """layout -> a checkpoint with no vllm_plugin/, built once; each test copies it."""
    from clef_format.fixtures.builders import build_checkpoint

    return {lay: build_checkpoint(tmp_path_factory.mktemp(lay) / "clef", layout=lay) for lay in ("layout-1", "layout-2")}


def _release(layouts, tmp_path: Path, form: str, version: str, layout: str = "layout-2") -> tuple[Path, str | None]:
    root = tmp_path / "clef"
    shutil.copytree(layouts[layout], root)
    return root, write_form(root / "vllm_plugin", form, version)


def backend_version(plugin: Path, backend: str, out: Path) -> str:
    """The version the backend itself writes into the metadata it prepares (its own process, in the folder)."""
    module = _BACKEND_MODULE[backend]
    if importlib.util.find_spec(module.split(".")[0]) is None or importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed: the backend's own answer cannot be had here")
    out.mkdir()
    code = ("import importlib, sys\nb = importlib.import_module(sys.argv[1])\n"
            "print(b.prepare_metadata_for_build_wheel(sys.argv[2]))\n")
    proc = subprocess.run([sys.executable, "-c", code, backend, str(out)], cwd=str(plugin), capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr
    distinfo = proc.stdout.strip().splitlines()[-1]
    meta = (out / distinfo / "METADATA").read_text()
    return next(line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Version:"))


@pytest.mark.parametrize("form", sorted(READ))
def test_each_backend_form_reads_the_version_the_backend_builds(layouts, tmp_path, form):
    root, backend = _release(layouts, tmp_path, form, "0.2.1")
    plugin = read_bundled_plugin(read_checkpoint(root))
    assert (plugin.version, plugin.where, plugin.note) == ("0.2.1", READ[form], ""), plugin
    assert Version(backend_version(root / "vllm_plugin", backend, tmp_path / "meta")) == Version(plugin.version)


def test_pdm_with_no_version_configured_builds_0_0_0(layouts, tmp_path):
    """pdm-backend's own default (as setuptools'): what the folder builds, not a guess; it cannot serve layout-2."""
    root, backend = _release(layouts, tmp_path, "pdm-nothing", "0.2.1")
    plugin = read_bundled_plugin(read_checkpoint(root))
    assert plugin.version == "0.0.0" and "pdm-backend builds 0.0.0" in plugin.where
    assert backend_version(root / "vllm_plugin", backend, tmp_path / "meta") == "0.0.0"
    assert "bundled-plugin-mismatch" in {f.code for f in verify(str(root)).findings}


@pytest.mark.parametrize("form", ["hatch-path", "flit-dynamic", "poetry-tool", "pdm-file"])
@pytest.mark.parametrize("layout,version,ok", [("layout-2", "0.1.4", False), ("layout-1", "0.1.4", True),
                                               ("layout-1", "0.2.1", False)])
def test_each_backend_is_judged_by_the_one_pair_rule(layouts, tmp_path, form, layout, version, ok):
    root, _ = _release(layouts, tmp_path, form, version, layout)
    report = verify(str(root))
    (row,) = report.to_dict()["plugins"]
    assert (row["source"], row["version"], row["can_serve"]) == ("bundled", version, ok)
    mismatch = [f for f in report.findings if f.code == "bundled-plugin-mismatch"]
    if ok:
        assert mismatch == []
    else:
        (f,) = mismatch
        assert f.severity == "error" and f.file == READ[form].split(" ")[0]
        assert f"clef-vllm {version} ({READ[form]})" in f.message and "pull the whole repo again" in f.fix


@pytest.mark.parametrize("form", sorted(UNREAD))
def test_a_version_only_the_build_decides_is_a_warning_naming_the_file(layouts, tmp_path, form):
    root, backend = _release(layouts, tmp_path, form, "0.1.4")
    assert backend is None
    report = verify(str(root))
    (row,) = report.to_dict()["plugins"]
    assert (row["version"], row["can_serve"]) == (None, None), row
    (f,) = report.findings
    file, why = UNREAD[form]
    assert (f.code, f.severity, f.file) == ("bundled-plugin-unread", "warning", file)
    assert file in f.message and why in f.message, f.message
    assert f.fix and "pip install" in f.fix and "vllm_plugin" in f.fix


def test_the_cli_says_it_in_one_json_object_and_exit_0(layouts, tmp_path):
    root, _ = _release(layouts, tmp_path, "hatch-vcs", "0.1.4")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "clef_format", "verify", str(root), "--json"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    payload = json.loads(proc.stdout)
    assert [f["code"] for f in payload["findings"]] == ["bundled-plugin-unread"]
    assert "0.0.0" not in proc.stdout  # never a made-up version


@pytest.mark.parametrize("case", ["path-outside", "path-absolute", "path-missing", "no-match", "static-and-dynamic",
                                  "flit-two-modules", "flit-int-version", "flit-no-docstring", "poetry-no-version",
                                  "hatch-no-config"])
def test_hostile_or_broken_backend_settings_are_unread_never_a_traceback(layouts, tmp_path, case):
    root, _ = _release(layouts, tmp_path, "hatch-path", "0.2.1")
    plugin = root / "vllm_plugin"
    py = plugin / "pyproject.toml"
    text = py.read_text()
    if case.startswith("path-"):
        target = {"path-outside": "../config.json", "path-absolute": "/clef_vllm/__about__.py",
                  "path-missing": "nowhere.py"}[case]
        py.write_text(text.replace('path = "clef_vllm/__about__.py"', f'path = "{target}"'))
    elif case == "no-match":
        (plugin / "clef_vllm" / "__about__.py").write_text("version = compute()\n")
    elif case == "static-and-dynamic":
        py.write_text(text.replace('dynamic = ["version"]', 'version = "0.2.1"\ndynamic = ["version"]'))
    elif case == "hatch-no-config":
        py.write_text(text.split("[tool.hatch.version]")[0])
    elif case.startswith("flit-"):
        write_form(plugin, "flit-dynamic", "0.2.1")
        if case == "flit-two-modules":
            (plugin / "clef_vllm.py").write_text('__version__ = "0.2.1"\n')
        elif case == "flit-no-docstring":  # flit imports the module then (its dynamic description)
            (plugin / "clef_vllm" / "__init__.py").write_text('__version__ = "0.2.1"\n')
        else:
            (plugin / "clef_vllm" / "__init__.py").write_text('"""clef-vllm."""\n__version__ = 21\n')
    elif case == "poetry-no-version":
        write_form(plugin, "poetry-tool", "0.2.1")
        py.write_text(py.read_text().replace('version = "0.2.1"\n', ""))
    bundled = read_bundled_plugin(read_checkpoint(root))
    assert bundled.version is None and bundled.note and bundled.file.startswith("vllm_plugin/"), bundled
    (f,) = verify(str(root)).findings
    assert f.code == "bundled-plugin-unread"


def test_mini_toml_reads_the_backend_tables_as_tomllib_does(layouts, tmp_path):
    import tomllib

    from clef_format.read.plugin_files import mini_toml

    for form in [*READ, "pdm-scm", "hatch-vcs"]:
        plugin = tmp_path / form / "vllm_plugin"
        write_form(plugin, form, "0.2.1")
        text = (plugin / "pyproject.toml").read_text()
        full, mini = tomllib.loads(text), mini_toml(text)
        for keys in (("build-system", "build-backend"), ("project", "version"), ("project", "dynamic"),
                     ("tool", "hatch", "version"), ("tool", "pdm", "version"), ("tool", "poetry", "version"),
                     ("tool", "flit", "module")):
            a, b = full, mini
            for k in keys:
                a, b = a.get(k, {}), b.get(k, {})
            assert a == b, (form, keys)
