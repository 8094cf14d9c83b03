"""KV-cache scales of a compressed-tensors checkpoint without ``kv_cache_scheme``, loaded by the real vLLM.

clef-format calls them a warning, not an error (docs/FORMAT.md): ``CompressedTensorsConfig`` gives
every ``Attention`` its KV-cache method whatever ``kv_cache_scheme`` says, so the parameters exist and
the cache-scale mapper loads the stored values. Measured here: the stored value reaches the layer's
``k_scale`` (its placeholder is -1.0) and the load does not fail.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clef_format.fixtures.builders import build_checkpoint
from clef_format.verify.run import verify
from tests.tier_vllm import hooks_support as hs


@pytest.fixture(scope="module", autouse=True)
def _tear_down_groups() -> Any:
    yield
    from vllm.distributed import parallel_state as ps

    ps.destroy_model_parallel()
    ps.destroy_distributed_environment()


@pytest.mark.vllm
def test_kv_scales_without_a_scheme_are_loaded(tmp_path: Path) -> None:
    root = build_checkpoint(tmp_path / "ck", layout="layout-1", build="fp8_kv", num_layers=4, multimodal=False)
    config = json.loads((root / "config.json").read_text())
    config["quantization_config"].pop("kv_cache_scheme")
    (root / "config.json").write_text(json.dumps(config))
    report = verify(str(root))
    assert report.ok and [f.severity for f in report.findings if f.code == "tensor-unexpected"] == ["warning"]

    cfg = hs.engine_config(root)
    hs.ensure_distributed(cfg)
    model = hs.build_model(cfg)
    seen: dict[str, float] = {}
    original = model.load_weights

    def load_weights(weights: Any) -> Any:
        out = original(weights)
        seen.update({n: float(p.item()) for n, p in model.named_parameters() if n.endswith("attn.k_scale")})
        return out

    model.load_weights = load_weights  # type: ignore[method-assign]
    hs.vllm_load(cfg, model)
    assert seen, "no Attention has a k_scale parameter"
    assert all(abs(v - 0.05) < 1e-3 for v in seen.values()), seen  # the stored 0.05, not the -1.0 placeholder
