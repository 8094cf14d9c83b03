"""Layout 1 (BF16 tables inside the backbone) served by a 0.1.x plugin, checked the same way."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import checkpoints as C
import compare
from engines import OLD, PROMPTS, Served, serve
from reference import Reference, reference

from clef_format.spec import layouts as L

OPTION_IDS = [3, 17, 17, 100, 256, 511, 0]


@pytest.fixture(scope="session")
def served(engines: Any, checkpoint: Callable) -> Served:
    return serve(engines, "layout-1", checkpoint("layout-1"), OLD, OPTION_IDS)


@pytest.fixture(scope="session")
def ref(checkpoint: Callable) -> Reference:
    return reference(checkpoint("layout-1"), {}, PROMPTS)  # the tables are in the backbone file


def test_old_plugin_serves_layout1_with_vllms_bf16_tables(served: Served) -> None:
    r = served.report
    assert r["plugin_version"] == OLD
    assert r["model_class"] == "ClefQwen3_5ForConditionalGeneration"
    assert r["pid"] != served.host_pid
    for table in ("embed", "lm_head"):
        assert r[table]["type"] in ("VocabParallelEmbedding", "ParallelLMHead")
        assert r[table]["params"] == {"weight": ["torch.bfloat16", [C.VOCAB, 128]]}


def test_embeddings_and_lexical_rows_are_the_backbone_tables(served: Served) -> None:
    tables = C.backbone_tables(served.root)
    assert torch.equal(torch.tensor(served.report["embedded"]), tables[L.EMBED_TOKENS][OPTION_IDS].float())
    assert torch.equal(torch.tensor(served.report["lexical"]), tables[L.LM_HEAD][OPTION_IDS].float())


def test_hidden_states_equal_transformers(served: Served, ref: Reference, record: Callable) -> None:
    assert served.hidden is not None
    rows = compare.check_hidden(served.hidden, ref)
    record("layout-1 hidden states vs transformers fp32", rows)
    for row in rows:
        assert row["err"] <= row["tol"], row
        assert row["cos_min"] > 0.99, row


def test_logprobs_equal_transformers(served: Served, ref: Reference, record: Callable) -> None:
    rows = compare.check_logprobs(served.generated, ref)
    record("layout-1 prompt log-probs vs transformers fp32", rows)
    for row in rows:
        assert row["err"] <= row["tol"], row
    for served_token, ref_token, margin in compare.greedy_agrees(served.generated, ref):
        if margin > 0.1:
            assert served_token == ref_token
