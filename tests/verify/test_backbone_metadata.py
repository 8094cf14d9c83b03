"""A backbone shard's ``__metadata__`` without ``format: pt`` (``{"format": "np"}``, ``{}``): the loaders that
serve Clef checkpoints read it, so verify does not refuse it. transformers 4 refused such a file in
``load_state_dict`` (``format`` not in pt/tf/flax/mlx: OSError); transformers 5 (5.20.2 and 5.24, the
versions the tiers install) no longer reads ``format`` at all, and vLLM reads the metadata only for
torchao checkpoints. This runs transformers' own ``load_state_dict`` on the very file verify judges."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file, save_file
from transformers.modeling_utils import load_state_dict

from clef_format.spec import layouts as L
from clef_format.verify.run import verify


@pytest.mark.parametrize("metadata", [{"format": "np"}, {}, {"format": "flax"}, None])
def test_a_backbone_without_format_pt_is_loaded_by_transformers_and_passes(fresh, metadata) -> None:
    root = fresh("layout-2", "fp8")
    path = root / L.BACKBONE_SINGLE
    tensors = load_file(str(path))
    save_file(tensors, str(path), metadata=metadata)
    loaded = load_state_dict(str(path))  # raises OSError where transformers refuses the metadata
    assert set(loaded) == set(tensors)
    report = verify(str(root))
    assert report.ok, [f for f in report.findings if f.severity == "error"]
