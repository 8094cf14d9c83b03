"""vLLM's own weights tracking against clef_format's storage check (WriteTracker), measured.

vLLM's ``DefaultModelLoader`` checks, after ``model.load_weights``, that every parameter name was
loaded ("Following weights were not initialized from checkpoint"). It is on by default only for
unquantized models and can be forced with ``model_loader_extra_config={"enable_weights_track": true}``
(``default_loader.py`` ``load_weights`` / ``track_weights_loading``). In 0.28 every parameter of a
module with a ``quant_method`` is exempt; 0.33 keeps that exemption for unquantized models but, for a
quantized model with tracking forced on, requires every such parameter by name. Names are all it
checks: a fused parameter counts as loaded once any shard wrote it. WriteTracker judges storage.

Each case removes one tensor from a real safetensors checkpoint and loads it with vLLM's loader three
ways: vLLM's default, vLLM with ``enable_weights_track`` forced on, and vLLM's default with
WriteTracker armed around it. The outcome matrix is asserted per version and printed (-s).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file, save_file

from clef_format.fixtures.builders import build_checkpoint
from clef_format.spec import layouts as L
from clef_format.vllm import UnwrittenParametersError, WriteTracker
from tests.tier_vllm import hooks_support as hs
from tests.tier_vllm import oracle

#: case -> (build, layout, dropped tensor (HF text-only names)).
CASES = {
    "fused shard (bf16 in_proj_z)": ("bf16", "layout-2", ("model.layers.0.linear_attn.in_proj_z.weight",)),
    "table (bf16 embed_tokens)": ("bf16", "layout-1", ("model.embed_tokens.weight",)),
    "fused shard (fp8 in_proj_z + its scale)": ("fp8", "layout-1", ("model.layers.0.linear_attn.in_proj_z.weight",
                                                                    "model.layers.0.linear_attn.in_proj_z.weight_scale")),
    "scale (fp8 down_proj weight_scale)": ("fp8", "layout-1", ("model.layers.3.mlp.down_proj.weight_scale",)),
    "scale of a fused shard (fp8 in_proj_z weight_scale)": ("fp8", "layout-1",
                                                            ("model.layers.0.linear_attn.in_proj_z.weight_scale",)),
    "table (fp8 embed_tokens)": ("fp8", "layout-1", ("model.embed_tokens.weight",)),
}
#: Measured outcome per version: (vLLM default, vLLM enable_weights_track, WriteTracker); True = caught.
#: 0.28 cannot build FP8 layers on a CPU-only machine (their kernels need CUDA): those cases are 0.33 only.
EXPECTED: dict[str, dict[str, tuple[bool, bool, bool]]] = {
    "0.28": {
        "fused shard (bf16 in_proj_z)": (False, False, True),
        "table (bf16 embed_tokens)": (False, False, True),
    },
    "0.33": {
        "fused shard (bf16 in_proj_z)": (False, False, True),
        "table (bf16 embed_tokens)": (False, False, True),
        "fused shard (fp8 in_proj_z + its scale)": (False, False, True),
        "scale (fp8 down_proj weight_scale)": (False, True, True),
        "scale of a fused shard (fp8 in_proj_z weight_scale)": (False, False, True),
        "table (fp8 embed_tokens)": (False, True, True),
    },
}
RESULTS: dict[str, tuple[bool, bool, bool]] = {}


@pytest.fixture(scope="module", autouse=True)
def _tear_down_groups() -> Any:
    yield
    from vllm.distributed import parallel_state as ps

    ps.destroy_model_parallel()
    ps.destroy_distributed_environment()


def _checkpoint(base: Path, build: str, layout: str, drop: tuple[str, ...]) -> Path:
    root = base / f"{build}-{layout}-{abs(hash(drop))}"
    build_checkpoint(root, layout=layout, build=build, num_layers=4, multimodal=False)
    tensors = load_file(root / L.BACKBONE_SINGLE)
    for name in drop:
        del tensors[name]
    save_file(tensors, str(root / L.BACKBONE_SINGLE), metadata={"format": "pt"})
    return root


def _caught(root: Path, track: bool | None, tracker: bool) -> bool:
    """Load ``root`` with vLLM's loader; True when the load raised (vLLM) or WriteTracker raised."""
    extra = {} if track is None else {"model_loader_extra_config": {"enable_weights_track": track}}
    cfg = hs.engine_config(root, **extra)
    hs.ensure_distributed(cfg)
    model = hs.build_model(cfg)
    armed = WriteTracker(model).arm() if tracker else None
    try:
        hs.vllm_load(cfg, model)
    except ValueError as e:
        assert "not initialized from checkpoint" in str(e), e
        return True
    if armed is not None:
        with pytest.raises(UnwrittenParametersError):
            armed.check()
        return True
    return False


@pytest.mark.vllm
@pytest.mark.parametrize("case", sorted(EXPECTED.get(oracle.VERSION, {})))
def test_what_each_check_catches(case: str, tmp_path: Path) -> None:
    build, layout, drop = CASES[case]
    root = _checkpoint(tmp_path, build, layout, drop)
    got = (_caught(root, None, False), _caught(root, True, False), _caught(root, None, True))
    RESULTS[case] = got
    assert got == EXPECTED[oracle.VERSION][case]


def test_report_weights_track_matrix() -> None:
    """Prints the measured matrix (run with -s); collected last in this file."""
    print(f"\nvLLM {oracle.VERSION}: dropped tensor -> caught by (vLLM default, enable_weights_track, WriteTracker)")
    for case, got in RESULTS.items():
        print(f"  {case}: {got}")
