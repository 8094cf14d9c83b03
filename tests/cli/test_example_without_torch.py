"""``clef-format example`` on a plain install: torch, transformers and compressed-tensors cannot be imported.

A ``sitecustomize`` on ``PYTHONPATH`` puts a meta-path finder first that raises ``ImportError`` for
those three packages (and everything under them), in the subprocess and in any interpreter it
starts. In there the README's first commands run (example as layout 1, migrate, verify --layers)
and every build and layout verifies as it should; the files it writes are byte for byte the ones
the tests' fixtures build in-process (one builder for both).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clef_format.cli.commands.example_cmd import BUILD_CHOICES, LAYOUT_CHOICES
from clef_format.fixtures.builders import BUILDS, LAYOUTS, build_checkpoint

ROOT = Path(__file__).resolve().parents[2]
BLOCKED = ("torch", "transformers", "compressed_tensors")

SITECUSTOMIZE = f'''
import sys

BLOCKED = {BLOCKED!r}


class _Blocker:
    """Refuses the packages a plain install of clef-format does not have."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{{name}} is blocked: a plain install has no {{name.split('.')[0]}}")
        return None


sys.meta_path.insert(0, _Blocker())
'''


@pytest.fixture(scope="module")
def blocked_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    site = tmp_path_factory.mktemp("blocker")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join([str(site), str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    return {**os.environ, "PYTHONPATH": path}


def _run(env: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clef_format", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def test_the_blocker_blocks(blocked_env: dict[str, str]) -> None:
    for name in (*BLOCKED, "torch.nn", "compressed_tensors.quantization"):
        proc = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, env=blocked_env)
        assert proc.returncode == 1 and "ImportError" in proc.stderr and "blocked" in proc.stderr, name
    ok = subprocess.run([sys.executable, "-c", "import numpy, safetensors, clef_format.fixtures.builders"],
                        capture_output=True, text=True, env=blocked_env)
    assert ok.returncode == 0, ok.stderr


def test_the_readme_commands_without_torch(blocked_env: dict[str, str], tmp_path: Path) -> None:
    """``make example``'s three commands: build a layout-1 download, migrate it to layout 2, verify with layers."""
    ex = tmp_path / "example"
    built = _run(blocked_env, "example", str(ex), "--layout", "layout-1", "--json")
    assert built.returncode == 0, built.stderr
    payload = json.loads(built.stdout)
    assert payload["ok"] is True and payload["layout"] == "layout-1"
    assert [f["code"] for f in payload["findings"]] == ["legacy-layout"]  # a warning: the old layout verifies OK
    migrated = _run(blocked_env, "migrate", str(ex), "--to", "layout-2", "--json")
    assert migrated.returncode == 0, migrated.stderr
    assert json.loads(migrated.stdout)["ok"] is True
    verified = _run(blocked_env, "verify", str(ex), "--layers", "--json")
    assert verified.returncode == 0, verified.stderr
    report = json.loads(verified.stdout)
    assert report["ok"] is True and report["layout"] == "layout-2" and report["findings"] == []
    assert {g for row in report["layers"]["rows"] for g in row["groups"].values()} >= {"fp8-w8a8", "nvfp4-w4a4"}
    human = _run(blocked_env, "example", str(tmp_path / "human"))
    assert human.returncode == 0 and "layout-2" in human.stdout, human.stderr


_EVERY_CASE = '''
import json, sys
from clef_format.cli.main import main
out = {}
for name, args in json.loads(sys.argv[1]).items():
    out[name] = main(["example", *args, "--no-verify"])
    assert not [m for m in sys.modules if m.split(".")[0] in ("torch", "transformers", "compressed_tensors")]
print(json.dumps(out))
'''


def _cases() -> dict[str, list[str]]:
    cases = {f"{layout}-{build}": ["--layout", layout, "--build", build] for layout in LAYOUT_CHOICES for build in BUILD_CHOICES}
    cases.update({f"full-{layout}-{build}": ["--layout", layout, "--build", build, "--full-size"]
                  for layout in ("layout-1", "layout-2") for build in ("hybrid", "bf16")})
    return cases


def _files(root: Path) -> dict[str, tuple[int, bytes]]:
    """Each file's size and content; for a file over 64 MB (the full-size sparse ones: a header and a
    hole) its first 1 MB, which holds the whole header."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            size = p.stat().st_size
            with open(p, "rb") as fh:
                out[p.relative_to(root).as_posix()] = (size, fh.read(2**20 if size > 2**26 else size))
    return out


def test_every_example_is_the_fixture_byte_for_byte(blocked_env: dict[str, str], tmp_path: Path) -> None:
    """Every layout x build (and full-size ones) built by the CLI without torch equals what the tests'
    ``build_checkpoint`` builds in this process, file by file: names, dtypes, shapes, configs, data."""
    assert tuple(BUILD_CHOICES) == tuple(BUILDS) and set(LAYOUT_CHOICES) == {str(x) for x in LAYOUTS}
    cases = _cases()
    out = tmp_path / "cli"
    out.mkdir()
    args = {name: [str(out / name), *a] for name, a in cases.items()}
    proc = subprocess.run([sys.executable, "-c", _EVERY_CASE, json.dumps(args)], capture_output=True, text=True,
                          env=blocked_env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert set(json.loads(proc.stdout.splitlines()[-1]).values()) == {0}
    for name, a in cases.items():
        layout, build = a[1], a[3]
        ref = build_checkpoint(tmp_path / "ref" / name, layout=layout, build=build, full_size="--full-size" in a)
        assert _files(out / name) == _files(ref), name


@pytest.mark.parametrize("layout", ["layout-2", "original-release", "layout-2-unmarked"])
def test_examples_verify_as_their_layout_says(blocked_env: dict[str, str], tmp_path: Path, layout: str) -> None:
    proc = _run(blocked_env, "example", str(tmp_path / "ex"), "--layout", layout, "--build", "mixed", "--json")
    payload = json.loads(proc.stdout)
    assert payload["layout"] == layout
    if layout == "layout-2-unmarked":  # the 2026-10-07 state: never to be served
        assert proc.returncode == 1 and [f["code"] for f in payload["findings"]] == ["marker-missing"]
    else:
        assert proc.returncode == 0 and payload["ok"] is True and payload["findings"] == [], proc.stderr
