"""The plugins the user has, against the weights: the clef-vllm a release ships in ``vllm_plugin/``
(read statically, every way a packaging file states a version, hostile files), the one installed in
the running interpreter or in another environment (``--python``), and ``--plugin-version``.

The installed plugins are real: pip builds the fixture's ``vllm_plugin/`` folders and installs them
(``--target`` a folder on PYTHONPATH, or into a venv's site-packages), so the version the static
reader gives is checked against the one pip's build gives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from clef_format.fixtures.release import PLUGIN_KINDS, write_release_files, write_vllm_plugin
from clef_format.read.checkpoint import read_checkpoint
from clef_format.read.plugin_files import MAX_SOURCE_BYTES
from clef_format.read.plugin_source import read_bundled_plugin
from clef_format.verify import verify

CLI = [sys.executable, "-m", "clef_format"]
REPO = Path(__file__).resolve().parents[2]
#: the kinds whose version is read; the others compute it when setup.py runs (bundled-plugin-unread)
COMPUTED = ("example", "setup-py-reads-init")
READABLE = [k for k in PLUGIN_KINDS if k not in COMPUTED]


def run_cli(*args: str, pythonpath: list[Path] = ()) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), str(REPO)])
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=env, timeout=300)


def pip_install(source: Path, target: Path) -> None:
    """Build ``source`` with setuptools and install it into ``target`` (no download, no deps)."""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(target), str(source)], check=True, capture_output=True,
                   cwd=str(source.parent), timeout=300)


def installed_version(target: Path) -> str:
    from importlib.metadata import distributions

    (dist,) = [d for d in distributions(path=[str(target)]) if d.metadata["Name"] == "clef-vllm"]
    return dist.version


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    """(layout, plugin version) -> a release folder: weights, vllm_plugin/ and the build's other files."""
    from clef_format.fixtures.builders import build_checkpoint

    made: dict[tuple[str, str], Path] = {}

    def make(layout: str, version: str, kind: str = "pyproject") -> Path:
        key = (layout, version, kind)
        if key not in made:
            root = build_checkpoint(tmp_path_factory.mktemp("rel") / "clef", layout=layout)
            write_vllm_plugin(root, version, kind)
            write_release_files(root)
            made[key] = root
        return made[key]

    return make


# -- the bundled plugin: the pair rule, in each layout -------------------------------------------------

@pytest.mark.parametrize("layout,version,ok", [
    ("layout-2", "0.2.1", True), ("layout-2", "0.1.4", False),
    ("layout-1", "0.1.4", True), ("layout-1", "0.2.1", False),
])
def test_bundled_plugin_against_its_weights(releases, layout, version, ok):
    report = verify(str(releases(layout, version)))
    mismatch = [f for f in report.findings if f.code == "bundled-plugin-mismatch"]
    (row,) = report.to_dict()["plugins"]
    assert row == {"source": "bundled", "where": "vllm_plugin/pyproject.toml ([project] version)",
                   "version": version, "can_serve": ok}
    if ok:
        assert mismatch == [] and all(f.severity != "error" for f in report.findings), report.findings
    else:
        (f,) = mismatch
        assert f.severity == "error" and f.file == "vllm_plugin/pyproject.toml"
        assert f"clef-vllm {version}" in f.message
        assert "pull the whole repo again" in f.fix and f"pip install {releases(layout, version)}/vllm_plugin" in f.fix


def test_layout_2_with_a_0_1_plugin_folder_is_an_error_naming_the_fix(releases):
    root = releases("layout-2", "0.1.4")
    proc = run_cli("verify", str(root))
    assert proc.returncode == 1, proc.stdout
    assert "bundled-plugin-mismatch" in proc.stdout
    assert "bundled   clef-vllm 0.1.4 (shipped in vllm_plugin/pyproject.toml ([project] version)): cannot serve" \
        in proc.stdout
    assert f"fix: pull the whole repo again (weights and vllm_plugin/ of one revision), then reinstall the plugin " \
           f"from it: pip install {root}/vllm_plugin" in proc.stdout


def test_release_files_are_quiet_but_a_pickle_is_not(releases, tmp_path):
    import shutil

    root = tmp_path / "clef"
    shutil.copytree(releases("layout-2", "0.2.1"), root)
    from clef_format.fixtures.tensors import bf16, generator, save_file

    # weights inside vllm_plugin/ (test data of the plugin): vLLM loads only top-level *.safetensors
    (root / "vllm_plugin" / "tests").mkdir()
    save_file({"w": bf16((2, 2), generator(0))}, root / "vllm_plugin" / "tests" / "data.safetensors")
    report = verify(str(root))
    assert report.findings == (), report.findings
    assert {"recipe.yaml", "scripts/sensitivity_scan.json", "scripts/shrink_tables.py", "chat_template.jinja",
            "processor_config.json", "vllm_plugin/pyproject.toml"} <= set(report.details.files)
    (root / "vllm_plugin" / "clef_vllm" / "weights.pt").write_bytes(b"\x80\x04K\x01.")
    (root / "scripts" / "cache.pkl").write_bytes(b"\x80\x04K\x01.")
    unsafe = sorted(f.file for f in verify(str(root)).findings if f.code == "unsafe-file")
    assert unsafe == ["scripts/cache.pkl", "vllm_plugin/clef_vllm/weights.pt"]


def test_bundled_plugin_in_a_hugging_face_cache_snapshot(releases, tmp_path):
    """A repo id in the cache: the snapshot's files are links into blobs/; the fix names the snapshot folder."""
    from tests.support.hub_cache import build_hub_cache

    cache = tmp_path / "hub"
    snap = build_hub_cache(cache, "someone/clef-flash-NVFP4", releases("layout-2", "0.1.4", "setup-cfg"))
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([*CLI, "verify", "someone/clef-flash-NVFP4", "--json"], capture_output=True, text=True,
                          env=env, timeout=300)
    payload = json.loads(proc.stdout)
    (f,) = [f for f in payload["findings"] if f["code"] == "bundled-plugin-mismatch"]
    assert f"pip install {snap}/vllm_plugin" in f["fix"]
    assert payload["plugins"][0] == {"source": "bundled", "where": "vllm_plugin/setup.cfg [metadata] version",
                                     "version": "0.1.4", "can_serve": False}


def test_the_serving_gate_and_migrate_do_not_judge_the_bundled_folder(releases):
    from clef_format.read.checkpoint import read_checkpoint as rc
    from clef_format.verify.run import verify_checkpoint

    from clef_format.compat import IncompatibleError, check_checkpoint

    root = releases("layout-2", "0.1.4")
    assert verify_checkpoint(rc(root), str(root)).details.plugins is None  # what migrate runs
    check_checkpoint(str(root), "0.2.1")  # the gate checks the plugin it runs in: 0.2.1 serves layout-2
    with pytest.raises(IncompatibleError) as exc:
        check_checkpoint(str(root), "0.1.4")
    assert exc.value.code == "plugin-incompatible"


# -- reading the version: every kind of packaging file, and pip agrees ---------------------------------

@pytest.mark.parametrize("kind", READABLE)
def test_static_version_is_the_version_pip_builds(releases, tmp_path, kind):
    root = releases("layout-2", "0.2.1", kind)
    plugin = read_bundled_plugin(read_checkpoint(root))
    assert plugin.version == "0.2.1" and plugin.note == "", plugin
    assert plugin.where.startswith("vllm_plugin/")
    pip_install(root / "vllm_plugin", tmp_path / "site")
    assert installed_version(tmp_path / "site") == plugin.version


def test_each_kind_names_its_file(releases):
    where = {k: read_bundled_plugin(read_checkpoint(releases("layout-2", "0.2.1", k))).where for k in READABLE}
    assert where == {
        "pyproject": "vllm_plugin/pyproject.toml ([project] version)",
        "pyproject-attr": "vllm_plugin/clef_vllm/__init__.py (__version__, via vllm_plugin/pyproject.toml "
                          "[tool.setuptools.dynamic])",
        "setup-cfg": "vllm_plugin/setup.cfg [metadata] version",
        "setup-py": "vllm_plugin/setup.py (setup(version=...))",
    }


@pytest.mark.parametrize("case,expected", [
    ("setup.py over setup.cfg", "0.1.9"), ("pyproject over setup.py", "0.2.1"),
    ("pyproject over a stale __version__", "0.2.1"), ("pyproject VERSION file", "0.2.3"),
])
def test_several_sources_the_one_setuptools_builds_wins(releases, tmp_path, case, expected):
    """Where two files state a version, the reader takes the one pip's build really gives."""
    import shutil

    kind = {"setup.py over setup.cfg": "setup-cfg"}.get(case, "pyproject")
    root = tmp_path / "clef"
    shutil.copytree(releases("layout-2", "0.2.1", kind), root)
    plugin = root / "vllm_plugin"
    if case == "setup.py over setup.cfg":
        (plugin / "setup.py").write_text('from setuptools import setup\n\nsetup(version="0.1.9")\n')
    elif case == "pyproject VERSION file":
        (plugin / "pyproject.toml").write_text((plugin / "pyproject.toml").read_text().replace(
            'version = "0.2.1"', 'dynamic = ["version"]') + '\n[tool.setuptools.dynamic]\nversion = {file = "./VERSION"}\n')
        (plugin / "VERSION").write_text("0.2.3\n")
    elif case == "pyproject over setup.py":
        (plugin / "setup.py").write_text('from setuptools import setup\n\nsetup(version="0.1.9")\n')
    else:
        (plugin / "clef_vllm" / "__init__.py").write_text('__version__ = "0.1.9"\n')
    assert read_bundled_plugin(read_checkpoint(root)).version == expected
    pip_install(plugin, tmp_path / "site")
    assert installed_version(tmp_path / "site") == expected


@pytest.mark.parametrize("kind", COMPUTED)
def test_a_version_set_at_build_time_is_a_warning_not_a_guess(releases, kind):
    """setup.py computes its version (from the environment; from __init__.py by a regex): never a fallback
    to the package's literal __version__, which may not be what the build gives."""
    report = verify(str(releases("layout-2", "0.1.4", kind)))
    (f,) = report.findings
    assert (f.code, f.severity, f.file) == ("bundled-plugin-unread", "warning", "vllm_plugin/setup.py")
    assert "is decided when the module runs, and clef-format never runs it" in f.message
    assert report.to_dict()["plugins"][0]["can_serve"] is None


_BUILD_ONLY = '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
_SRC_INIT = '__version__ = "0.1.4"\n'
_DECOY_INIT = '__version__ = "0.2.0"\n'


def _packaging(plugin: Path, case: str) -> None:
    """A vllm_plugin/ whose packaging a naive reader gets wrong (0.2.0 would serve layout-2; setuptools
    builds something else, or refuses)."""
    for rel in ("pyproject.toml", "setup.py", "setup.cfg"):
        (plugin / rel).unlink(missing_ok=True)
    (plugin / "pyproject.toml").write_text(_BUILD_ONLY)
    if case in ("setup-under-if", "setup-in-def", "two-setups"):
        first = {"setup-under-if": 'if False:\n    setup(name="clef-vllm", version="0.2.0")\n',
                 "setup-in-def": 'def unused():\n    setup(name="clef-vllm", version="0.2.0")\n',
                 "two-setups": 'setup(name="clef-vllm", version="0.2.0", packages=["clef_vllm"])\n'}[case]
        (plugin / "setup.py").write_text(f'from setuptools import setup\n{first}'
                                         'setup(name="clef-vllm", version="0.1.4", packages=["clef_vllm"])\n')
    elif case.startswith("src-"):
        (plugin / "src" / "clef_vllm").mkdir(parents=True)
        (plugin / "src" / "clef_vllm" / "__init__.py").write_text(_SRC_INIT)
        (plugin / "clef_vllm" / "__init__.py").write_text(_DECOY_INIT)
        if case == "src-discovered":  # no package-dir, no packages: setuptools discovers the src layout
            (plugin / "pyproject.toml").write_text(
                _BUILD_ONLY + '[project]\nname = "clef-vllm"\ndynamic = ["version"]\n'
                '[tool.setuptools.dynamic]\nversion = {attr = "clef_vllm.__version__"}\n')
            return
        if case == "src-pyproject":
            (plugin / "pyproject.toml").write_text(
                _BUILD_ONLY + '[project]\nname = "clef-vllm"\ndynamic = ["version"]\n[tool.setuptools]\n'
                'package-dir = {"" = "src"}\npackages = ["clef_vllm"]\n'
                '[tool.setuptools.dynamic]\nversion = {attr = "clef_vllm.__version__"}\n')
            return
        (plugin / "setup.cfg").write_text(
            "[metadata]\nname = clef-vllm\nversion = attr: clef_vllm.__version__\n[options]\npackages = clef_vllm\n"
            + ("package_dir =\n    =src\n" if case == "src-setup-cfg" else ""))
        (plugin / "setup.py").write_text("from setuptools import setup\nsetup("
                                         + ("package_dir={'': 'src'}" if case == "src-setup-py" else "") + ")\n")
    elif case == "attr-first-assignment":  # setuptools reads the first literal; an import would give the last
        (plugin / "pyproject.toml").write_text(
            _BUILD_ONLY + '[project]\nname = "clef-vllm"\ndynamic = ["version"]\n[tool.setuptools]\n'
            'packages = ["clef_vllm"]\n[tool.setuptools.dynamic]\nversion = {attr = "clef_vllm.__version__"}\n')
        (plugin / "clef_vllm" / "__init__.py").write_text(_SRC_INIT + _DECOY_INIT)
    elif case == "no-version":
        (plugin / "setup.py").write_text('from setuptools import setup\nsetup(name="clef-vllm", packages=["clef_vllm"])\n')
        (plugin / "clef_vllm" / "__init__.py").write_text(_DECOY_INIT)
    elif case == "static-and-dynamic":
        (plugin / "pyproject.toml").write_text(
            _BUILD_ONLY + '[project]\nname = "clef-vllm"\nversion = "0.2.0"\ndynamic = ["version"]\n'
            '[tool.setuptools]\npackages = ["clef_vllm"]\n')


def _built_version(plugin: Path, out: Path) -> str | None:
    """The version pip's build of ``plugin`` gives (None: the build refuses)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "--no-index", "-w", str(out), str(plugin)], capture_output=True, timeout=300,
                          cwd=str(plugin.parent))
    if proc.returncode != 0:
        return None
    (wheel,) = out.glob("clef_vllm-*.whl")
    return wheel.name.split("-")[1]


@pytest.mark.parametrize("case,built", [
    ("src-setup-cfg", "0.1.4"), ("src-pyproject", "0.1.4"), ("src-setup-py", "0.1.4"), ("no-version", "0.0.0"),
    ("src-discovered", "0.1.4"),
])
def test_what_setuptools_resolves_is_what_is_read(releases, tmp_path, case, built):
    """attr: through package_dir (a decoy package outside it says 0.2.0), and no version at all (0.0.0,
    not the package's __version__): the version read is the one pip builds, and it cannot serve layout-2."""
    import shutil

    root = tmp_path / "clef"
    shutil.copytree(releases("layout-2", "0.2.1", "setup-cfg"), root)
    _packaging(root / "vllm_plugin", case)
    assert _built_version(root / "vllm_plugin", tmp_path / "wheels") == built
    report = verify(str(root))
    (row,) = report.to_dict()["plugins"]
    assert (row["version"], row["can_serve"]) == (built, False), row
    assert "bundled-plugin-mismatch" in {f.code for f in report.findings}


@pytest.mark.parametrize("case,built,why", [
    ("setup-under-if", "0.1.4", "inside a block"), ("setup-in-def", "0.1.4", "inside a block"),
    ("two-setups", None, "calls setup(...) 2 times"),
    # setuptools reads attr:'s first literal without running the module, an import gives the last
    ("attr-first-assignment", "0.1.4", "2 different string literals"),
    ("static-and-dynamic", None, "setuptools refuses to build it"),
])
def test_a_version_only_the_run_decides_is_unread_not_guessed(releases, tmp_path, case, built, why):
    import shutil

    root = tmp_path / "clef"
    shutil.copytree(releases("layout-2", "0.2.1", "setup-cfg"), root)
    _packaging(root / "vllm_plugin", case)
    got = _built_version(root / "vllm_plugin", tmp_path / "wheels")
    assert got == built and got != "0.2.0"
    report = verify(str(root))
    (row,) = report.to_dict()["plugins"]
    assert (row["version"], row["can_serve"]) == (None, None), row
    (f,) = [f for f in report.findings if f.code == "bundled-plugin-unread"]
    assert f.severity == "warning" and why in f.message, f.message


def _hostile(root: Path, case: str) -> None:
    plugin = root / "vllm_plugin"
    py = plugin / "pyproject.toml"
    if case == "huge":
        py.write_text("# x\n" * (MAX_SOURCE_BYTES // 4 + 10))
    elif case == "not-utf8":
        py.write_bytes(b'[project]\nname = "clef-vllm"\nversion = "\xff\xfe"\n')
    elif case == "bad-toml":
        py.write_text('[project\nname = "clef-vllm"\n')
    elif case == "setup-py-syntax":
        py.write_text('[build-system]\nrequires = ["setuptools"]\n')
        (plugin / "setup.py").write_text("setup(version='0.2.1'\n")
    elif case == "setup-py-null":
        py.write_text('[build-system]\nrequires = ["setuptools"]\n')
        (plugin / "setup.py").write_bytes(b"setup(version='0.2.1')\x00\n")
    elif case == "deep-nesting":
        py.write_text('[build-system]\nrequires = ["setuptools"]\n')
        (plugin / "setup.py").write_text("x = " + "(" * 200_000 + ")" * 200_000 + "\n")
    elif case == "constant-recomputed":
        py.write_text('[build-system]\nrequires = ["setuptools"]\n')
        (plugin / "setup.py").write_text('import os\nfrom setuptools import setup\n\nVERSION = "0.2.1"\n'
                                         'VERSION = os.environ["V"]\nsetup(name="clef-vllm", version=VERSION)\n')
        (plugin / "clef_vllm" / "__init__.py").write_text("")
    elif case == "bad-setup-cfg":
        py.write_text('[build-system]\nrequires = ["setuptools"]\n')
        (plugin / "setup.cfg").write_text("[metadata]\nname = clef-vllm\nname = other\n")
    elif case == "other-package":
        py.write_text(py.read_text().replace('name = "clef-vllm"', 'name = "clef-systemone"'))
    elif case == "not-a-version":
        py.write_text(py.read_text().replace('version = "0.2.1"', 'version = "two"'))
    elif case == "attr-missing-module":
        py.write_text(py.read_text().replace('version = "0.2.1"', 'dynamic = ["version"]')
                      + '\n[tool.setuptools.dynamic]\nversion = {attr = "clef_vllm.nowhere.__version__"}\n')
    elif case in ("file-outside", "file-not-a-version"):
        target = "../config.json" if case == "file-outside" else "README.md"
        py.write_text(py.read_text().replace('version = "0.2.1"', 'dynamic = ["version"]')
                      + f'\n[tool.setuptools.dynamic]\nversion = {{file = "{target}"}}\n')
        (plugin / "README.md").write_text("clef-vllm\n\nthe serving plugin\n")
    elif case == "symlink-out":
        outside = root.parent / "outside.toml"
        outside.write_text('[project]\nname = "clef-vllm"\nversion = "0.2.1"\n')
        py.unlink()
        py.symlink_to(outside)


@pytest.mark.parametrize("case", ["huge", "not-utf8", "bad-toml", "setup-py-syntax", "setup-py-null", "deep-nesting",
                                  "constant-recomputed", "bad-setup-cfg", "other-package", "not-a-version", "attr-missing-module",
                                  "file-outside", "file-not-a-version", "symlink-out"])
def test_hostile_plugin_files_are_a_note_never_a_traceback(releases, tmp_path, case):
    import shutil

    root = tmp_path / "clef"
    shutil.copytree(releases("layout-2", "0.2.1"), root)
    _hostile(root, case)
    proc = run_cli("verify", str(root), "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    payload = json.loads(proc.stdout)
    bundled = [r for r in payload["plugins"] if r["source"] == "bundled"]
    assert bundled and bundled[0]["version"] in (None, "two") and bundled[0]["can_serve"] is None
    codes = {f["code"] for f in payload["findings"]}
    assert "bundled-plugin-unread" in codes and "bundled-plugin-mismatch" not in codes
    assert proc.returncode == (1 if case == "symlink-out" else 0)  # path-escape is the error there


@pytest.mark.parametrize("case", ["pyproject-symlink-out", "pyproject-fifo", "setup-cfg-fifo", "attr-module-symlink-out"])
def test_a_packaging_file_never_read_is_named_as_unread_not_as_stating_nothing(releases, tmp_path, case):
    """A ``pyproject.toml`` that is a symlink out of the checkpoint or a FIFO is never opened (its own
    finding says so); the plugin's note said the folder "declares no package name", as if the file stated
    nothing, and its fix was to ``pip install`` the folder, whose build reads the same file (and waits
    forever on a FIFO). Now the note names the file and why it was not read, and the fix is to replace it."""
    import shutil

    kind = {"setup-cfg-fifo": "setup-cfg", "attr-module-symlink-out": "pyproject-attr"}.get(case, "pyproject")
    root = tmp_path / "clef"
    shutil.copytree(releases("layout-2", "0.2.1", kind), root)
    plugin = root / "vllm_plugin"
    rel = {"pyproject-symlink-out": "pyproject.toml", "pyproject-fifo": "pyproject.toml",
           "setup-cfg-fifo": "setup.cfg", "attr-module-symlink-out": "clef_vllm/__init__.py"}[case]
    if case.endswith("symlink-out"):
        outside = tmp_path / "outside"
        shutil.copy(plugin / rel, outside)
        (plugin / rel).unlink()
        (plugin / rel).symlink_to(outside)
        why, code = "is a symlink leading outside the checkpoint, never read (path-escape)", "path-escape"
    else:
        (plugin / rel).unlink(missing_ok=True)
        os.mkfifo(plugin / rel)
        why, code = "is not a regular file, never opened (special-file)", "special-file"
    proc = run_cli("verify", str(root), "--json")
    payload = json.loads(proc.stdout)
    [bundled] = [r for r in payload["plugins"] if r["source"] == "bundled"]
    [unread] = [f for f in payload["findings"] if f["code"] == "bundled-plugin-unread"]
    assert bundled["version"] is None and f"vllm_plugin/{rel} {why}" in bundled["note"], bundled
    assert unread["file"] == f"vllm_plugin/{rel}" and "declares no package name" not in unread["message"], unread
    assert unread["fix"].startswith(f"replace vllm_plugin/{rel} with the real file"), unread
    assert code in {f["code"] for f in payload["findings"]} and proc.returncode == 1


@pytest.mark.parametrize("case", ["dangling-symlink", "looping-symlink", "a-folder", "plugin-dir-is-a-file"])
def test_a_packaging_file_that_cannot_be_read_or_a_plugin_folder_that_is_a_file_gets_a_fix_that_works(
        releases, tmp_path, case):
    """``pyproject.toml`` a symlink leading nowhere, one to itself, or a folder: the row said the plugin
    "declares no package name" and the fix was ``pip install`` of the folder, whose build fails on the
    same file. ``vllm_plugin`` a file: the note said pip cannot install from it and the fix was to pip
    install it. Now the note names the file and the fix is to replace it; followed (the file put back),
    verify reads the version again."""
    import shutil

    root = tmp_path / "clef"
    shutil.copytree(releases("layout-2", "0.2.1"), root)
    plugin = root / "vllm_plugin"
    kept = tmp_path / "kept"
    shutil.move(plugin, kept)
    if case == "plugin-dir-is-a-file":
        plugin.write_text("hi\n")
        rel = "vllm_plugin"
    else:
        shutil.copytree(kept, plugin)
        py = plugin / "pyproject.toml"
        py.unlink()
        {"dangling-symlink": lambda: py.symlink_to("nowhere"), "looping-symlink": lambda: py.symlink_to("pyproject.toml"),
         "a-folder": py.mkdir}[case]()
        rel = "vllm_plugin/pyproject.toml"
    payload = json.loads(run_cli("verify", str(root), "--json").stdout)
    [unread] = [f for f in payload["findings"] if f["code"] == "bundled-plugin-unread"]
    assert unread["file"] == rel and "declares no package name" not in unread["message"], unread
    assert "pip install" not in unread["fix"] and unread["fix"].startswith(f"replace {rel} with the "), unread
    if plugin.is_dir() and not plugin.is_symlink():
        shutil.rmtree(plugin)
    else:
        plugin.unlink()
    shutil.copytree(kept, plugin)  # the fix followed
    payload = json.loads(run_cli("verify", str(root), "--json").stdout)
    assert [(r["source"], r["version"], r["can_serve"]) for r in payload["plugins"]][0] == ("bundled", "0.2.1", True)


def test_mini_toml_reader_of_python_3_10_reads_what_tomllib_reads(releases):
    import tomllib

    from clef_format.read.plugin_files import mini_toml as _mini_toml

    for kind in ("pyproject", "pyproject-attr"):
        text = (releases("layout-2", "0.2.1", kind) / "vllm_plugin" / "pyproject.toml").read_text()
        full, mini = tomllib.loads(text), _mini_toml(text)
        assert mini["project"]["name"] == full["project"]["name"]
        assert mini["project"].get("version") == full["project"].get("version")
        assert mini["project"].get("dynamic") == full["project"].get("dynamic")
        assert mini.get("tool", {}).get("setuptools", {}).get("dynamic") == \
            full.get("tool", {}).get("setuptools", {}).get("dynamic")
    text = _BUILD_ONLY + '[tool.setuptools]\npackage-dir = {"" = "src", clef_vllm = "lib/clef"}\n'
    assert _mini_toml(text)["tool"] == tomllib.loads(text)["tool"]


# -- the installed plugin: the running interpreter and --python ----------------------------------------

@pytest.fixture(scope="module")
def installed(releases, tmp_path_factory):
    """plugin version -> a folder pip installed that release's vllm_plugin/ into."""
    made: dict[str, Path] = {}

    def make(version: str) -> Path:
        if version not in made:
            made[version] = tmp_path_factory.mktemp("site") / f"clef-vllm-{version}"
            pip_install(releases("layout-1" if version < "0.2" else "layout-2", version) / "vllm_plugin", made[version])
        return made[version]

    return make


def test_an_installed_0_1_plugin_cannot_serve_layout_2(releases, installed):
    root = releases("layout-2", "0.2.1")
    proc = run_cli("verify", str(root), "--json", pythonpath=[installed("0.1.4")])
    assert proc.returncode == 1, proc.stdout
    payload = json.loads(proc.stdout)
    (f,) = payload["findings"]
    assert (f["code"], f["severity"]) == ("plugin-incompatible", "error")
    assert "clef-vllm 0.1.4 installed in this Python" in f["message"]
    assert f["fix"].startswith(f"install the plugin shipped with these weights: pip install {root}/vllm_plugin")
    bundled, inst = payload["plugins"]
    assert bundled["can_serve"] is True
    assert (inst["source"], inst["version"], inst["can_serve"]) == ("installed", "0.1.4", False)
    assert inst["where"].startswith(sys.executable) and str(installed("0.1.4")) in inst["where"]
    text = run_cli("verify", str(root), pythonpath=[installed("0.1.4")]).stdout
    assert "installed clef-vllm 0.1.4 (installed in " in text and "): cannot serve these weights" in text


def test_a_stale_pair_of_both_is_two_errors_and_the_fix_is_the_whole_repo(releases, installed):
    """Weights pulled alone on 2026-10-07 into a folder and an environment that both hold 0.1.4."""
    root = releases("layout-2", "0.1.4")
    payload = json.loads(run_cli("verify", str(root), "--json", pythonpath=[installed("0.1.4")]).stdout)
    by_code = {f["code"]: f for f in payload["findings"]}
    assert set(by_code) == {"bundled-plugin-mismatch", "plugin-incompatible"}
    fix = by_code["plugin-incompatible"]["fix"]
    assert fix.startswith("install a clef-vllm the weights admit (pip install 'clef-vllm>=0.2.0')")
    assert f"{root}/vllm_plugin" not in by_code["plugin-incompatible"]["fix"]  # that folder cannot serve them either
    assert [(r["source"], r["can_serve"]) for r in payload["plugins"]] == [("bundled", False), ("installed", False)]


def test_an_installed_plugin_that_can_serve_adds_no_finding(releases, installed):
    proc = run_cli("verify", str(releases("layout-2", "0.2.1")), "--json", pythonpath=[installed("0.2.1")])
    assert proc.returncode == 0, proc.stdout
    payload = json.loads(proc.stdout)
    assert payload["findings"] == []
    assert [(r["source"], r["version"], r["can_serve"]) for r in payload["plugins"]] == [
        ("bundled", "0.2.1", True), ("installed", "0.2.1", True)]


def test_plugin_version_is_the_explicit_choice(releases, installed):
    """--plugin-version replaces the installed plugin: the environment is not looked at."""
    proc = run_cli("verify", str(releases("layout-2", "0.2.1")), "--json", "--plugin-version", "0.2.1",
                   pythonpath=[installed("0.1.4")])
    assert proc.returncode == 0, proc.stdout
    assert [r["source"] for r in json.loads(proc.stdout)["plugins"]] == ["bundled", "argument"]


def test_python_option_checks_another_environment(releases, installed, tmp_path):
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    root = releases("layout-1", "0.1.4")
    proc = run_cli("verify", str(root), "--json", "--python", str(python))
    payload = json.loads(proc.stdout)
    assert payload["plugins"][-1] == {"source": "python", "where": str(python), "version": None, "can_serve": None}
    pip_install(releases("layout-2", "0.2.1") / "vllm_plugin", site)
    proc = run_cli("verify", str(root), "--json", "--python", str(python))
    assert proc.returncode == 1, proc.stdout
    payload = json.loads(proc.stdout)
    row = payload["plugins"][-1]
    assert (row["source"], row["version"], row["can_serve"]) == ("python", "0.2.1", False)
    assert row["where"].startswith(str(python))
    (f,) = [f for f in payload["findings"] if f["code"] == "plugin-incompatible"]
    assert "installed in the environment of --python" in f["message"] and "layout-1" in f["message"]


def test_a_python_whose_child_keeps_the_pipes_open_is_read_when_it_exits(releases, tmp_path):
    """A ``--python`` that answers and exits, leaving a background child holding its stdout and stderr (a
    wrapper script starting a daemon): verify waited for the pipes to close, until its 20 s limit, and
    then said the interpreter did not answer. Now what the program said when it exited is its answer,
    and the child is killed with its process group."""
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    site = Path(subprocess.run([str(env / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    pip_install(releases("layout-2", "0.2.1") / "vllm_plugin", site)
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f"#!/bin/sh\nsleep 60 &\nexec {env / 'bin' / 'python'} \"$@\"\n")
    wrapper.chmod(0o755)
    proc = run_cli("verify", str(releases("layout-2", "0.2.1")), "--json", "--python", str(wrapper))
    payload = json.loads(proc.stdout)
    row = payload["plugins"][-1]
    assert proc.returncode == 0 and payload["findings"] == [], payload
    assert (row["source"], row["version"], row["can_serve"]) == ("python", "0.2.1", True), row
    assert row["where"].startswith(f"{wrapper}: "), row


def test_a_python_whose_startup_prints_a_lot_is_still_read(releases, tmp_path):
    """An environment whose sitecustomize (or .pth) prints 100 KB at start-up: the answer is the last
    line, and it is read (it was "did not run as a Python interpreter": only the first 16 KB were kept)."""
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    site = Path(subprocess.run([str(env / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    pip_install(releases("layout-2", "0.2.1") / "vllm_plugin", site)
    (site / "sitecustomize.py").write_text("print('banner ' * 20_000)\n")
    proc = run_cli("verify", str(releases("layout-2", "0.2.1")), "--json", "--python", str(env / "bin" / "python"))
    payload = json.loads(proc.stdout)
    row = payload["plugins"][-1]
    assert proc.returncode == 0 and payload["findings"] == [], payload
    assert (row["source"], row["version"], row["can_serve"]) == ("python", "0.2.1", True), row


@pytest.mark.parametrize("bundled", [True, False], ids=["ships-its-plugin", "weights-only"])
def test_an_unreadable_installed_version_under_python_is_fixed_with_that_environments_pip(releases, tmp_path, bundled):
    """A clef-vllm in the --python environment whose metadata gives no valid version: the fix said ``pip
    install --force-reinstall clef-vllm`` (whichever pip is on PATH, not that environment's) and named
    ``vllm_plugin`` even where the folder ships none. Now it is that environment's ``-m pip``, from the
    folder's own plugin when it ships one, else from the registry."""
    import shutil

    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    meta = site / "clef_vllm-0.1.4.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: clef-vllm\nVersion: bogus\n")
    root = tmp_path / "clef"
    shutil.copytree(releases("layout-2", "0.2.1"), root)
    if not bundled:
        shutil.rmtree(root / "vllm_plugin")
    payload = json.loads(run_cli("verify", str(root), "--json", "--python", str(python)).stdout)
    [f] = [f for f in payload["findings"] if f["code"] == "installed-plugin-unread"]
    source = f"{root}/vllm_plugin" if bundled else "clef-vllm"
    assert f["fix"] == f"reinstall the plugin ({python} -m pip install --force-reinstall {source}), then run verify again"


def test_an_install_fix_for_another_environment_names_its_pip(releases, installed, tmp_path):
    """The fix of a plugin --python found unable to serve installs into that environment (``PY -m pip``), not
    with whichever pip is first on PATH, and names a registry install as such (not "shipped")."""
    from clef_format.shell import quote_path

    env = tmp_path / "my env"
    venv.EnvBuilder(with_pip=False).create(env)
    python = env / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    pip_install(releases("layout-1", "0.1.4") / "vllm_plugin", site)
    for bundled, first in (("0.2.1", f"install the plugin shipped with these weights: {quote_path(str(python))} -m pip "
                                     "install "),
                           ("0.1.4", f"install a clef-vllm the weights admit ({quote_path(str(python))} -m pip install "
                                     "'clef-vllm>=0.2.0')")):
        payload = json.loads(run_cli("verify", str(releases("layout-2", bundled)), "--json", "--python", str(python)).stdout)
        (f,) = [f for f in payload["findings"] if f["code"] == "plugin-incompatible"]
        assert f["fix"].startswith(first), f["fix"]
        assert " pip install" not in f["fix"].replace(" -m pip install", ""), f["fix"]


def test_python_resolves_as_a_shell_does(releases, tmp_path):
    """A relative --python is from the current folder, a bare name a command on PATH; the row names the
    interpreter found, its venv symlink kept (resolving it would leave the venv)."""
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)  # as python -m venv makes it on POSIX
    python = env_dir / "bin" / "python"
    assert python.is_symlink()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "clefpython").symlink_to(python)
    root = releases("layout-1", "0.1.4")
    # a relative PATH entry, as a shell takes it: from the current folder
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"bin{os.pathsep}{os.environ['PATH']}"}
    for given, where in (("venv/bin/python", python), ("./venv/../venv/bin/python", python),
                         ("clefpython", bin_dir / "clefpython")):
        proc = subprocess.run([*CLI, "verify", str(root), "--json", "--python", given], capture_output=True, text=True,
                              env=env, cwd=str(tmp_path), timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert json.loads(proc.stdout)["plugins"][-1] == {"source": "python", "where": str(where), "version": None,
                                                          "can_serve": None}


@pytest.mark.parametrize("given,says,fix", [
    ("venv", "--python venv: no command of that name on PATH", "give --python ./venv/bin/python"),
    ("./venv", "--python ./venv ({tmp}/venv) is a folder, not an interpreter", "--python {tmp}/venv/bin/python"),
    ("python-here", "--python python-here: no command of that name on PATH", "give --python ./python-here"),
    ("no-such-command-xyz", "--python no-such-command-xyz: no command of that name on PATH", "or a command on PATH"),
    ("venv/bin/nothing", "--python venv/bin/nothing ({tmp}/venv/bin/nothing): no such file", "a path"),
    ("notes.txt", "--python notes.txt: no command of that name on PATH", "give --python ./notes.txt"),
    ("./notes.txt", "--python ./notes.txt ({tmp}/notes.txt) is not an executable file", "a path"),
])
def test_a_python_that_is_not_there_says_what_to_give(releases, tmp_path, given, says, fix):
    venv.EnvBuilder(with_pip=False).create(tmp_path / "venv")
    (tmp_path / "python-here").symlink_to(tmp_path / "venv" / "bin" / "python")
    (tmp_path / "notes.txt").write_text("not a python\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([*CLI, "verify", str(releases("layout-2", "0.2.1")), "--json", "--python", given],
                          capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (f,) = json.loads(proc.stdout)["findings"]
    assert f["code"] == "usage-error" and f["message"] == says.format(tmp=tmp_path), f
    assert fix.format(tmp=tmp_path) in f["fix"], f["fix"]


@pytest.mark.parametrize("bad", ["/definitely/not/python", "file", "not-python"])
def test_a_bad_python_is_a_usage_error(releases, tmp_path, bad):
    if bad == "file":
        path = tmp_path / "python"
        path.write_text("not executable")
    elif bad == "not-python":
        path = tmp_path / "python"
        path.write_text("#!/bin/sh\necho hello\n")
        path.chmod(0o755)
    else:
        path = Path(bad)
    proc = run_cli("verify", str(releases("layout-2", "0.2.1")), "--json", "--python", str(path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    payload = json.loads(proc.stdout)
    assert payload["findings"][0]["code"] == "usage-error" and "--python" in payload["error"]


def test_a_program_that_only_prints_json_is_not_an_interpreter(releases, tmp_path):
    """A shell script printing what the probe would print: the answer lacks the token only Python computes."""
    fake = tmp_path / "python"
    fake.write_text('#!/bin/sh\necho \'{"version": "0.2.0", "location": "/x", "python": [3, 11, 7], "token": "0"}\'\n')
    fake.chmod(0o755)
    proc = run_cli("verify", str(releases("layout-2", "0.2.1")), "--json", "--python", str(fake))
    assert proc.returncode == 2, proc.stdout
    payload = json.loads(proc.stdout)
    assert payload["findings"][0]["code"] == "usage-error"
    assert "did not run as a Python interpreter (exit 0: " in payload["error"] and '"version": "0.2.0"' in payload["error"]


def test_a_python_that_hangs_is_stopped_with_its_children(tmp_path, monkeypatch):
    """The probe has a deadline, and nothing it started is left running after it."""
    import time

    from clef_format.errors import UsageError
    from clef_format.read import installed_plugin

    pidfile = tmp_path / "child.pid"
    hang = tmp_path / "python"
    hang.write_text(f"#!/bin/sh\nsleep 1000 &\necho $! > {pidfile}\nwait\n")
    hang.chmod(0o755)
    monkeypatch.setattr(installed_plugin, "PYTHON_TIMEOUT_S", 1)
    start = time.monotonic()
    with pytest.raises(UsageError) as exc:
        installed_plugin.installed_in(str(hang))
    assert time.monotonic() - start < 15
    assert "no answer within 1 s" in str(exc.value)
    child = int(pidfile.read_text())
    for _ in range(50):  # the kill is asynchronous: give the kernel a moment to reap it
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{child}/stat").read_text().split(")")[-1].split()[0] == "Z":
            break  # killed, a zombie of init until reaped
        time.sleep(0.1)
    else:
        os.kill(child, 9)
        raise AssertionError("the hanging program's child was left running")


def test_a_python_that_floods_its_output_is_read_only_so_far(releases, tmp_path):
    """A --python printing 100 MB: verify reads a few KB, stays small, and says what it printed."""
    flood = tmp_path / "python"
    flood.write_text("#!/bin/sh\nhead -c 100000000 /dev/zero | tr '\\0' 'x'\n")
    flood.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    measure = ("import json, resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
               "print(json.dumps([p.returncode, p.stdout, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))")
    out = subprocess.run([sys.executable, "-c", measure, *CLI, "verify", str(releases("layout-2", "0.2.1")), "--json",
                          "--python", str(flood)], capture_output=True, text=True, env=env, timeout=300, check=True)
    code, stdout, max_rss_kb = json.loads(out.stdout)
    assert code == 2
    error = json.loads(stdout)["error"]
    assert "printed more than" in error and "'xxxx" in error and len(error) < 1000
    assert max_rss_kb < 80_000, max_rss_kb


def test_a_vllm_plugin_that_is_a_file_is_unread_not_silent(releases, tmp_path):
    import shutil

    root = tmp_path / "clef"
    shutil.copytree(releases("layout-2", "0.2.1"), root)
    shutil.rmtree(root / "vllm_plugin")
    (root / "vllm_plugin").write_text("clef-vllm 0.2.1\n")
    report = verify(str(root))
    (row,) = report.to_dict()["plugins"]
    assert (row["source"], row["version"], row["can_serve"]) == ("bundled", None, None)
    (f,) = [f for f in report.findings if f.code == "bundled-plugin-unread"]
    assert f.severity == "warning" and "not a folder" in f.message


@pytest.mark.parametrize("metadata_version", ["garbage", ""])
def test_an_installed_plugin_whose_version_cannot_be_read_is_a_warning(releases, installed, tmp_path,
                                                                        metadata_version):
    import re
    import shutil

    site = tmp_path / "site"
    shutil.copytree(installed("0.2.1"), site)
    (meta,) = site.glob("clef_vllm-*.dist-info/METADATA")
    meta.write_text(re.sub(r"(?m)^Version: .*$", f"Version: {metadata_version}".rstrip(), meta.read_text()))
    proc = run_cli("verify", str(releases("layout-2", "0.2.1")), "--json", pythonpath=[site])
    assert proc.returncode == 0, proc.stdout
    payload = json.loads(proc.stdout)
    (f,) = payload["findings"]
    assert (f["code"], f["severity"]) == ("installed-plugin-unread", "warning")
    assert "installed in this Python" in f["message"] and "not a PEP 440 version" in f["message"]
    row = payload["plugins"][-1]
    assert (row["source"], row["can_serve"]) == ("installed", None) and str(site) in row["where"]


def test_python_and_plugin_version_together_is_a_usage_error(releases):
    proc = run_cli("verify", str(releases("layout-2", "0.2.1")), "--json", "--python", sys.executable,
                   "--plugin-version", "0.2.1")
    assert proc.returncode == 2 and json.loads(proc.stdout)["findings"][0]["code"] == "usage-error"


def test_no_plugin_installed_costs_no_importlib_metadata(installed):
    """The structure path stays light: importlib.metadata is imported only when a clef_vllm metadata
    folder is on sys.path (and then gives the answer)."""
    probe = ("import sys; from clef_format.read.installed_plugin import installed_here; p = installed_here(); "
             "print(p.version, 'importlib.metadata' in sys.modules)")
    for path, expected in (([], "None False"), ([installed("0.2.1")], "0.2.1 True")):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, path), str(REPO)])}
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
        assert out.stdout.strip() == expected


def test_layers_shows_verify_verdict_with_the_bundled_plugin(releases):
    proc = run_cli("layers", str(releases("layout-2", "0.1.4")), "--json")
    assert proc.returncode == 1
    assert "bundled-plugin-mismatch" in {f["code"] for f in json.loads(proc.stdout)["findings"]}
