"""The int8 tables file: fixtures write it per the format (the validity rule: test_table_rule.py)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from tests.support.torch_int8 import dequantize_rows
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


def test_problems_describe_each_kind_in_words() -> None:
    """The text verify and migrate print for bad scales and values (``Problems.describe``)."""
    import struct

    scales = struct.pack("<6f", 1.0, float("nan"), -2.0, 3e38, float("inf"), 0.5)
    problems = TF.scale_problems(scales)
    assert problems.describe() == ("1 negative (at [2]); 2 NaN or infinite (at [1, 4]); "
                                   f"1 above {TF.SCALE_MAX:.4g} (times 127 they overflow BF16) (at [3])")
    assert TF.int8_problems(b"\x01\x80\x7f\x80").describe() == "2 outside [-127, 127] (-128) (at [1, 3])"
    assert TF.Problems().describe() == ""


def test_problems_keep_the_first_five_indexes_and_count_all() -> None:
    import struct

    problems = TF.scale_problems(struct.pack("<8f", *([-1.0] * 7 + [1.0])))
    assert problems.counts == {"negative": 7} and problems.first == {"negative": [0, 1, 2, 3, 4]}
    adjacent = TF.int8_problems(b"\x80\x80\x80\x00\x80\x80\x80")
    assert adjacent.counts == {"out-of-range": 6} and adjacent.first == {"out-of-range": [0, 1, 2, 4, 5]}


@pytest.mark.parametrize("value, ok", [
    (0.01, True), (0, True), (1, True), (-3.5, True), (10**400, True),  # a huge int is finite
    ("NaN", False), ("Infinity", False), ("-Infinity", False), ("1e999", False),  # JSON floats that are not finite
    ('"0.01"', False), ("true", False), ("null", False), ("[0.01]", False),
])
def test_quality_figures_must_be_finite_numbers(value, ok):
    figures = ", ".join(f'"{k}": {value if k == "rel_error" else 0.5}' for k in TF.QUALITY_FIGURES)
    meta = TF.metadata_for("BF16", {})
    meta["quality"] = '{"lm_head.weight": {' + figures + "}}"
    problems = TF.metadata_notes(meta, ("lm_head.weight",))
    assert problems == ([] if ok else ["metadata 'quality' of 'lm_head.weight' lacks finite rel_error"])


def test_metadata_of_the_format_has_no_problem_and_each_missing_key_is_named() -> None:
    meta = TF.metadata_for("BF16", {"lm_head.weight": dict.fromkeys(TF.QUALITY_FIGURES, 0.5)})
    assert TF.metadata_notes(meta, ("lm_head.weight",)) == []
    del meta["source_dtype"], meta["clef_layout"]
    assert TF.metadata_notes(meta, ("lm_head.weight",)) == ["metadata lacks 'clef_layout'",
                                                                "metadata lacks 'source_dtype'"]


def test_a_source_dtype_outside_the_float_dtypes_is_reported() -> None:
    meta = TF.metadata_for("I8", {})
    assert TF.metadata_notes(meta) == ["metadata source_dtype='I8', expected one of BF16, F16, F32"]


@pytest.mark.parametrize("quality, tables, problem", [
    ("[1]", None, "metadata 'quality' is not a JSON object"),
    ("{}", ("embed_tokens.weight", "lm_head.weight"),
     "metadata 'quality' describes [], expected the tables ['embed_tokens.weight', 'lm_head.weight']"),
    ('{"lm_head.weight": {"rel_error": 0.1}}', None,
     "metadata 'quality' of 'lm_head.weight' lacks finite mean_row_cosine, min_row_cosine, max_row_rel_error"),
])
def test_each_quality_problem_says_what_it_found(quality: str, tables, problem: str) -> None:
    meta = TF.metadata_for("BF16", {})
    meta["quality"] = quality
    assert TF.metadata_notes(meta, tables) == [problem]


def test_problems_of_chunks_merge_into_the_whole() -> None:
    """A table read in chunks: counts add up and the first indexes are shifted by each chunk's offset."""
    import struct

    whole = TF.Problems()
    whole.merge(TF.scale_problems(struct.pack("<3f", -1.0, 1.0, -1.0)), offset=0)
    whole.merge(TF.scale_problems(struct.pack("<3f", -1.0, float("nan"), -1.0)), offset=3)
    assert whole.counts == {"negative": 4, "nonfinite": 1}
    assert whole.first == {"negative": [0, 2, 3, 5], "nonfinite": [4]}
