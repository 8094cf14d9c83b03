"""The int8 tables file: fixtures write it per the format (the validity rule: test_table_rule.py)."""

from __future__ import annotations

import json

import torch
from safetensors import safe_open

from clef_format.quant.int8 import dequantize_rows
from clef_format.spec import layouts as L
from clef_format.spec import tables_format as TF


def test_fixture_tables_follow_the_format(built):
    root = built("layout-2")
    with safe_open(str(root / L.TABLES), framework="pt") as f:
        assert TF.metadata_problems(f.metadata()) == []
        quality = json.loads(f.metadata()["quality"])
        for name in L.TABLE_NAMES:
            q, scale = f.get_tensor(name), f.get_tensor(TF.scale_name(name))
            assert q.dtype == torch.int8 and scale.dtype == torch.float32
            assert scale.shape == (q.shape[0], 1)
            assert int(q.abs().max()) <= TF.QMAX
            assert quality[name]["rel_error"] < 0.02 and quality[name]["mean_row_cosine"] > 0.999
            assert dequantize_rows(q, scale, torch.bfloat16).shape == q.shape
