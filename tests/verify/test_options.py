"""``VerifyOptions`` reach every check and the per-layer view: one ``verify_checkpoint`` call, one vLLM
build on the version asked for, shared by the pattern check and the view."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from clef_format.read.checkpoint import read_checkpoint
from clef_format.spec import layouts as L
from clef_format.verify.layers import layers_view
from clef_format.verify.layers_report import layers_report
from clef_format.verify.options import VerifyOptions
from clef_format.verify.run import verify_checkpoint


def _shard_ignore(root: Path) -> None:
    """An ignore regex meant for one shard of a fused layer: vLLM 0.28 refuses to build the layer, 0.33
    builds it unquantized (``fused_name_ignore`` in the version table)."""
    config = json.loads((root / L.CONFIG).read_text())
    config["quantization_config"]["ignore"].append(r"re:.*in_proj_qkv")
    (root / L.CONFIG).write_text(json.dumps(config))


def _errors(report) -> list[str]:  # type: ignore[no-untyped-def]
    return sorted({f.code for f in report.findings if f.severity == "error"})


def test_the_vllm_version_asked_for_decides_the_findings_and_the_view(fresh: Callable[..., Path]) -> None:
    root = fresh("layout-2", "nvfp4")
    _shard_ignore(root)
    old = verify_checkpoint(read_checkpoint(root), str(root), VerifyOptions(layers=True))
    assert "fused-scheme-mismatch" in _errors(old) and "layer-unquantized" not in _errors(old)
    assert old.details.vllm_version is None and "vllm_version" not in old.to_dict()  # the default, unstated
    assert old.details.layers == layers_view(json.loads((root / L.CONFIG).read_text()))
    assert "error: ValueError" in {g for r in old.details.layers.rows for g in r.groups.values()}
    new = verify_checkpoint(read_checkpoint(root), str(root), VerifyOptions(vllm_version="0.33", layers=True))
    assert "layer-unquantized" in _errors(new)
    (e,) = [f for f in new.findings if f.code == "layer-unquantized" and f.severity == "error"]
    assert "not on vLLM 0.28" in e.message  # compared with the other proven version, from 0.33's side
    assert new.details.vllm_version == "0.33" and new.to_dict()["vllm_version"] == "0.33"
    assert new.details.layers == layers_view(json.loads((root / L.CONFIG).read_text()), version="0.33")
    assert "error: ValueError" not in {g for r in new.details.layers.rows for g in r.groups.values()}


def test_verify_layers_and_the_layers_command_give_one_view(fresh: Callable[..., Path]) -> None:
    root = fresh("layout-2", "hybrid", num_layers=4)
    config = json.loads((root / L.CONFIG).read_text())
    config["quantization_config"]["ignore"].append("re:.*layers\\.1\\.mlp\\..*")  # one layer kept BF16
    (root / L.CONFIG).write_text(json.dumps(config))
    for version in ("0.28", "0.33"):
        verified = verify_checkpoint(read_checkpoint(root), str(root), VerifyOptions(vllm_version=version, layers=True),
                                     bundled=True)
        layers = layers_report(str(root), version)
        assert verified.details.layers is not None and layers.details.view == verified.details.layers
        assert layers.to_dict()["vllm_version"] == version
        assert {k: v for k, v in layers.to_dict().items() if k not in ("command", "vllm_version")} == \
            {**{k: v for k, v in verified.to_dict()["layers"].items()},
             **{k: verified.to_dict()[k] for k in ("path", "layout", "ok", "findings")}}
        assert [r.groups for r in verified.details.layers.rows][1] != [r.groups for r in verified.details.layers.rows][0]
