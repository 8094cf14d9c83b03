"""The module constant a bundled plugin's version is read from, followed as the module runs
(``plugin_files.bound_string``), and a ``setup(version=...)`` expression never replaced by a guess.

Each case is a real ``vllm_plugin/`` folder beside layout-2 weights (served only by clef-vllm>=0.2.0).
Where setuptools would build a version the static reader cannot know, the verdict is a
``bundled-plugin-unread`` warning naming the file and line, with the fix to install the folder and look
at the version pip gives, never a version taken from another file (the hostile pass's F7, F8):

* F7: ``setup(version=open("VERSION").read().strip())`` beside a package whose ``__version__`` says
  something else (both ways round), and a computed setup.py over setup.cfg's literal;
* F8: a constant augmented before ``setup(...)`` (``+= "rc1"``), reassigned after it (the value at the
  call is the one built), and an ``attr:`` constant reassigned or augmented in its module (setuptools
  reads the first literal without running it, an import the last: not read unless they agree);
* the rule's other bindings (a tuple target, ``if``/``try``/``for``, an import, ``global``, ``del``,
  ``exec``, ``globals()``, ``:=``, ``import *``, a name bound only after the call);
* a setuptools ``file`` source (pyproject.toml ``{file = ...}``, setup.cfg ``file:``): several files
  (setuptools joins them, ``0.2.0`` + ``rc1`` builds 0.2.0rc1) or a file that is not exactly one version
  (blank lines, surrounding whitespace: ``"\\n  0.2.0  \\n\\n"`` fails pyproject.toml's build, setup.cfg's
  builds 0.2.0) are unread, never the first file's version;
* controls: a simple constant (or ``attr:`` literal) read as before, both a version that serves and
  one that does not.

setuptools itself (its ``prepare_metadata_for_build_wheel``, in a subprocess, offline, on a copy of
the folder) builds every case: the version read is the one it builds, or nothing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clef_format.read.checkpoint import read_checkpoint
from clef_format.read.plugin_source import read_bundled_plugin
from clef_format.verify import verify

_BUILD = '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
_ATTR = (_BUILD + '[project]\nname = "clef-vllm"\ndynamic = ["version"]\n[tool.setuptools]\npackages = ["clef_vllm"]\n'
         '[tool.setuptools.dynamic]\nversion = {attr = "clef_vllm.VERSION"}\n')
_SETUP = "from setuptools import setup\n"
_CALL = "setup(name='clef-vllm', version=VERSION, packages=['clef_vllm'])\n"
_READ_FILE = "setup(name='clef-vllm', version=open('VERSION').read().strip(), packages=['clef_vllm'])\n"
_DYN_FILE = (_BUILD + '[project]\nname = "clef-vllm"\ndynamic = ["version"]\n[tool.setuptools]\npackages = ["clef_vllm"]\n'
             '[tool.setuptools.dynamic]\nversion = {file = %s}\n')
_CFG_FILE = "[metadata]\nname = clef-vllm\nversion = file: %s\n[options]\npackages = clef_vllm\n"

#: case -> (files of vllm_plugin/, version setuptools builds, version read (None: unread), file:line named)
CASES: dict[str, tuple[dict[str, str], str | None, str | None, str | None]] = {
    # F7: an expression setup.py evaluates: never the package's __version__ in its place
    "F7-setup-reads-VERSION-file": ({"setup.py": _SETUP + _READ_FILE, "VERSION": "0.2.1\n",
                                     "clef_vllm/__init__.py": "__version__ = '0.1.0'\n"},
                                    "0.2.1", None, "setup.py line 2"),
    "F7-reverse": ({"setup.py": _SETUP + _READ_FILE, "VERSION": "0.1.0\n",
                    "clef_vllm/__init__.py": "__version__ = '0.2.1'\n"}, "0.1.0", None, "setup.py line 2"),
    "F7-computed-over-setup-cfg": ({"setup.cfg": "[metadata]\nname = clef-vllm\nversion = 0.2.1\n",
                                    "setup.py": _SETUP + "\nsetup(version='.'.join(['0', '1', '7']))\n",
                                    "clef_vllm/__init__.py": "__version__ = '0.2.1'\n"},
                                   "0.1.7", None, "setup.py line 3"),
    # F8: the value where setup(...) uses it
    "F8-augmented-before-setup": ({"setup.py": _SETUP + "VERSION = '0.2.0'\nVERSION += 'rc1'\n" + _CALL},
                                  "0.2.0rc1", None, "setup.py line 3"),
    "F8-reassigned-after-setup": ({"setup.py": _SETUP + "VERSION = '0.2.0'\n" + _CALL + "VERSION = '0.1.0'\n"},
                                  "0.2.0", "0.2.0", None),
    "F8-dynamic-pyproject-setup-py-constant": ({"pyproject.toml": '[project]\nname = "clef-vllm"\ndynamic = ["version"]\n',
                                                "setup.py": _SETUP + "V = '0.1.0'\nsetup(name='clef-vllm', version=V)\n"
                                                "V = '0.2.0'\n"}, "0.1.0", "0.1.0", None),
    # F8: attr: (setuptools reads the first literal without running the module; an import gives the last)
    "F8-attr-augmented": ({"pyproject.toml": _ATTR, "clef_vllm/__init__.py": "VERSION = '0.2.0'\nVERSION += 'rc1'\n"},
                          "0.2.0", None, "clef_vllm/__init__.py line 2"),
    "F8-attr-reassigned": ({"pyproject.toml": _ATTR, "clef_vllm/__init__.py": "VERSION = '0.2.0'\nVERSION = '0.1.0'\n"},
                           "0.2.0", None, "clef_vllm/__init__.py"),
    # the rule's other bindings before setup(...)
    "tuple-target": ({"setup.py": _SETUP + "VERSION, X = '0.2.1', 1\n" + _CALL}, "0.2.1", None, "setup.py line 2"),
    "expression": ({"setup.py": _SETUP + "VERSION = '0.2' + '.1'\n" + _CALL}, "0.2.1", None, "setup.py line 2"),
    "under-if": ({"setup.py": _SETUP + "import sys\nVERSION = '0.2.1'\nif sys.version_info > (3,):\n"
                  "    VERSION = '0.1.0'\n" + _CALL}, "0.1.0", None, "setup.py line 4"),
    "under-try": ({"setup.py": _SETUP + "VERSION = '0.2.1'\ntry:\n    VERSION = '0.1.0'\nexcept ImportError:\n"
                   "    pass\n" + _CALL}, "0.1.0", None, "setup.py line 3"),
    "for-target": ({"setup.py": _SETUP + "VERSION = '0.2.1'\nfor VERSION in ['0.1.0']:\n    pass\n" + _CALL},
                   "0.1.0", None, "setup.py line 3"),
    "import": ({"setup.py": _SETUP + "VERSION = '0.2.1'\nfrom clef_vllm import __version__ as VERSION\n" + _CALL,
                "clef_vllm/__init__.py": "__version__ = '0.1.0'\n"}, "0.1.0", None, "setup.py line 3"),
    "global-in-def": ({"setup.py": _SETUP + "VERSION = '0.2.1'\ndef f():\n    global VERSION\n    VERSION = '0.1.0'\n"
                       "f()\n" + _CALL}, "0.1.0", None, "setup.py line 3"),
    "exec": ({"setup.py": _SETUP + "VERSION = '0.2.1'\nexec(open('v.py').read())\n" + _CALL,
              "v.py": "VERSION = '0.1.0'\n"}, "0.1.0", None, "setup.py line 3"),
    "globals": ({"setup.py": _SETUP + "VERSION = '0.2.1'\nglobals()['VERSION'] = '0.1.0'\n" + _CALL},
                "0.1.0", None, "setup.py line 3"),
    "walrus-in-the-call": ({"setup.py": _SETUP + "VERSION = '0.2.1'\nsetup(name=(VERSION := '0.1.0') and 'clef-vllm', "
                            "version=VERSION, packages=['clef_vllm'])\n"}, "0.1.0", None, "setup.py line 3"),
    "import-star": ({"setup.py": _SETUP + "VERSION = '0.2.1'\nfrom clef_vllm.v import *\n" + _CALL,
                     "clef_vllm/v.py": "VERSION = '0.1.0'\n"}, "0.1.0", None, "setup.py line 3"),
    "del": ({"setup.py": _SETUP + "VERSION = '0.2.1'\ndel VERSION\n" + _CALL}, None, None, "setup.py line 3"),
    "bound-only-after-setup": ({"setup.py": _SETUP + _CALL + "VERSION = '0.2.1'\n"}, None, None, "setup.py"),
    # a setuptools file source (pyproject.toml {file = ...}, setup.cfg file:): one file holding exactly one
    # version is read; several files (setuptools joins them with a newline, packaging reads the result: a
    # suffix file makes rc1/.dev0/.post1 from pyproject.toml, setup.cfg's build fails) or a file with blank
    # lines or surrounding whitespace are unread, never the first file's version
    "file-list-rc": ({"pyproject.toml": _DYN_FILE % '["VERSION", "SUFFIX"]', "VERSION": "0.2.0", "SUFFIX": "rc1"},
                     "0.2.0rc1", None, "pyproject.toml"),
    "file-list-dev": ({"pyproject.toml": _DYN_FILE % '["VERSION", "SUFFIX"]', "VERSION": "0.2.0", "SUFFIX": "dev"},
                      "0.2.0.dev0", None, "pyproject.toml"),
    "file-list-post": ({"pyproject.toml": _DYN_FILE % '["VERSION", "SUFFIX"]', "VERSION": "0.2.0", "SUFFIX": "1"},
                       "0.2.0.post1", None, "pyproject.toml"),
    "file-list-second-missing": ({"pyproject.toml": _DYN_FILE % '["VERSION", "SUFFIX"]', "VERSION": "0.2.0"},
                                 "0.2.0", None, "pyproject.toml"),
    "file-whitespace": ({"pyproject.toml": _DYN_FILE % '"VERSION"', "VERSION": "\n  0.2.0  \n\n"},
                        None, None, "VERSION"),
    "file-blank-line-after": ({"pyproject.toml": _DYN_FILE % '"VERSION"', "VERSION": "0.2.0\n\n"},
                              "0.2.0", None, "VERSION"),
    "file-blank-line-before": ({"pyproject.toml": _DYN_FILE % '"VERSION"', "VERSION": "\n0.2.0"},
                               "0.2.0", None, "VERSION"),
    "file-two-lines": ({"pyproject.toml": _DYN_FILE % '"VERSION"', "VERSION": "0.2.0\nrc1\n"},
                       None, None, "VERSION"),
    "cfg-file-list-rc": ({"setup.cfg": _CFG_FILE % "VERSION, SUFFIX", "VERSION": "0.2.0", "SUFFIX": "rc1"},
                         None, None, "setup.cfg"),
    "cfg-file-list-dev": ({"setup.cfg": _CFG_FILE % "VERSION, SUFFIX", "VERSION": "0.2.0", "SUFFIX": "dev"},
                          None, None, "setup.cfg"),
    "cfg-file-list-post": ({"setup.cfg": _CFG_FILE % "VERSION, SUFFIX", "VERSION": "0.2.0", "SUFFIX": "1"},
                           None, None, "setup.cfg"),
    "cfg-file-trailing-comma": ({"setup.cfg": _CFG_FILE % "VERSION,", "VERSION": "0.2.0\n"},
                                "0.2.0", None, "setup.cfg"),
    "cfg-file-whitespace": ({"setup.cfg": _CFG_FILE % "VERSION", "VERSION": "\n  0.2.0  \n\n"},
                            "0.2.0", None, "VERSION"),  # setup.cfg builds what pyproject.toml's build refuses
    "cfg-file-two-lines": ({"setup.cfg": _CFG_FILE % "VERSION", "VERSION": "0.2.0\nrc1\n"},
                           None, None, "VERSION"),
    # controls: one file, one version (a final newline, CRLF as text-mode open() reads it, a one-item list)
    "control-file": ({"pyproject.toml": _DYN_FILE % '"VERSION"', "VERSION": "0.2.1\n"}, "0.2.1", "0.2.1", None),
    "control-file-no-newline": ({"pyproject.toml": _DYN_FILE % '["VERSION"]', "VERSION": "0.2.1"},
                                "0.2.1", "0.2.1", None),
    "control-file-crlf": ({"pyproject.toml": _DYN_FILE % '"VERSION"', "VERSION": "0.2.1\r\n"}, "0.2.1", "0.2.1", None),
    "control-file-too-old": ({"pyproject.toml": _DYN_FILE % '"VERSION"', "VERSION": "0.1.4\n"},
                             "0.1.4", "0.1.4", None),
    "control-cfg-file": ({"setup.cfg": _CFG_FILE % "VERSION", "VERSION": "0.2.1\n"}, "0.2.1", "0.2.1", None),
    "control-cfg-file-too-old": ({"setup.cfg": _CFG_FILE % "VERSION", "VERSION": "0.1.4"}, "0.1.4", "0.1.4", None),
    # controls: a simple constant is read as before (a local of a function, an annotation, other names: no binding)
    "control-constant": ({"setup.py": _SETUP + "import os\nVERSION: str = '0.2.1'\nNAME = 'clef-vllm'\n"
                          "def helper():\n    VERSION = 'x'\n    return VERSION\n" + _CALL}, "0.2.1", "0.2.1", None),
    "control-constant-too-old": ({"setup.py": _SETUP + "VERSION = '0.1.4'\n" + _CALL}, "0.1.4", "0.1.4", None),
    "control-attr": ({"pyproject.toml": _ATTR, "clef_vllm/__init__.py": '"""clef-vllm."""\nVERSION = "0.2.1"\n'},
                     "0.2.1", "0.2.1", None),
}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A layout-2 release whose vllm_plugin/ the cases replace."""
    from clef_format.fixtures.builders import build_checkpoint
    from clef_format.fixtures.release import write_release_files, write_vllm_plugin

    root = build_checkpoint(tmp_path_factory.mktemp("rel") / "clef", layout="layout-2")
    write_vllm_plugin(root, "0.2.1", "setup-cfg")
    write_release_files(root)
    return root


def _release(base: Path, where: Path, case: str) -> Path:
    root = where / "clef"
    shutil.copytree(base, root)
    plugin = root / "vllm_plugin"
    for rel in ("pyproject.toml", "setup.py", "setup.cfg"):
        (plugin / rel).unlink(missing_ok=True)
    (plugin / "clef_vllm" / "__init__.py").write_text('"""clef-vllm (fixture copy)."""\n')
    (plugin / "pyproject.toml").write_text(_BUILD)
    for rel, text in CASES[case][0].items():
        (plugin / rel).parent.mkdir(parents=True, exist_ok=True)
        (plugin / rel).write_text(text)
    return root


def _setuptools_builds(plugin: Path, work: Path) -> str | None:
    """The version setuptools' own build backend writes for ``plugin`` (a copy is built: the egg-info it
    writes stays out of the release); ``None`` when it refuses."""
    copy = work / "build"
    shutil.copytree(plugin, copy)
    out = work / "meta"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-c", "import sys; from setuptools.build_meta import "
                           "prepare_metadata_for_build_wheel as p; print(p(sys.argv[1]))", str(out)],
                          cwd=str(copy), capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return None
    dist_info = proc.stdout.strip().splitlines()[-1]  # clef_vllm-0.2.1.dist-info
    assert dist_info.startswith("clef_vllm-") and dist_info.endswith(".dist-info"), proc.stdout
    return dist_info[len("clef_vllm-"):-len(".dist-info")]


@pytest.mark.parametrize("case", list(CASES))
def test_the_verdict_rests_on_the_value_the_build_uses_or_is_unread(base, tmp_path, case):
    _, _, read, named = CASES[case]
    root = _release(base, tmp_path, case)
    report = verify(str(root))
    (row,) = report.to_dict()["plugins"]
    codes = [f.code for f in report.findings]
    if read is None:
        assert (row["version"], row["can_serve"]) == (None, None), row
        assert "bundled-plugin-mismatch" not in codes and report.ok, report.findings
        (f,) = report.findings
        assert (f.code, f.severity) == ("bundled-plugin-unread", "warning"), f
        file, _, line = named.partition(" ")
        assert f.file == f"vllm_plugin/{file}" and f"vllm_plugin/{named}" in f.message, f.message
        assert f"pip install {root}/vllm_plugin" in f.fix and "version pip reports" in f.fix, f.fix
        return
    serves = read.startswith("0.2.")
    assert (row["version"], row["can_serve"]) == (read, serves), row
    if serves:
        assert report.findings == () and report.ok, report.findings
    else:
        assert codes == ["bundled-plugin-mismatch"] and not report.ok, report.findings


@pytest.mark.parametrize("case", list(CASES))
def test_the_version_read_is_the_one_setuptools_builds(base, tmp_path, case):
    """setuptools' own metadata build of the folder (offline, no isolation): the version read statically
    is the one it writes, or none is read; never another."""
    _, built, read, _ = CASES[case]
    root = _release(base, tmp_path, case)
    got = read_bundled_plugin(read_checkpoint(root)).version
    assert got == read
    assert _setuptools_builds(root / "vllm_plugin", tmp_path) == built
    assert got is None or got == built


@pytest.mark.parametrize("setup_py", [
    _SETUP + "setup(name='clef-vllm', version=" + "+".join(["'0'"] * 1500) + ")\n",
    _SETUP + "VERSION = " + "+".join(["'0'"] * 1500) + "\n" + _CALL,
])
def test_a_hostile_nesting_ast_parses_but_cannot_unparse_is_a_note_never_a_traceback(base, tmp_path, setup_py):
    root = _release(base, tmp_path, "control-constant")
    (root / "vllm_plugin" / "setup.py").write_text(setup_py)
    plugin = read_bundled_plugin(read_checkpoint(root))
    assert (plugin.version, plugin.file) == (None, "vllm_plugin/setup.py") and "line 2" in plugin.note, plugin
