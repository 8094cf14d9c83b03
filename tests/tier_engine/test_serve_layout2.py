"""Layout 2 served by a >= 0.2 plugin in a real vLLM engine: int8 tables in the worker, answers
equal to transformers on the decoded tables, within the int8 error of the BF16 originals."""

from __future__ import annotations

import json
from typing import Callable

import pytest
import torch

import checkpoints as C
import compare
from engines import NEW, PROMPTS, Served
from reference import Reference, reference

from clef_format.spec import layouts as L
from clef_format.spec.marker import without_marker

OPTION_IDS = [3, 17, 17, 100, 256, 511, 0]


@pytest.fixture(scope="session")
def served(served_layout2: Served) -> Served:
    return served_layout2


@pytest.fixture(scope="session")
def ref_decoded(ref_layout2: Reference) -> Reference:
    return ref_layout2


@pytest.fixture(scope="session")
def ref_original(checkpoint: Callable) -> Reference:
    root = checkpoint("layout-2")
    return reference(root, C.bf16_tables(root), PROMPTS)


def test_plugin_runs_in_the_worker_at_its_version(served: Served) -> None:
    r = served.report
    assert r["plugin_version"] == NEW
    assert r["model_class"] == "ClefQwen3_5ForConditionalGeneration"
    assert r["pid"] != served.host_pid  # the model lives in vLLM's worker process, not in the LLM's


def test_worker_holds_int8_tables_and_no_bf16_table(served: Served) -> None:
    r = served.report
    for table in ("embed", "lm_head"):
        assert r[table]["type"] == "Int8VocabEmbedding"
        assert r[table]["buffers"] == {"q": ["torch.int8", [C.VOCAB, 128]], "scale": ["torch.float32", [C.VOCAB, 1]]}
        assert r[table]["params"] == {}
    assert r["vocab_float_tensors"] == []  # no [vocab, hidden] floating tensor anywhere in the model


def test_embeddings_equal_decoded_table(served: Served) -> None:
    decoded = C.decoded_tables(served.root)[L.EMBED_TOKENS]
    assert served.report["embedded_dtype"] == "torch.bfloat16"
    got = torch.tensor(served.report["embedded"])
    assert torch.equal(got, decoded[OPTION_IDS].float())


def test_lexical_rows_of_option_tokens_equal_decoded_rows(served: Served) -> None:
    decoded = C.decoded_tables(served.root)[L.LM_HEAD]
    rows = torch.tensor(served.report["lexical"])
    assert served.report["lexical_dtype"] == "torch.bfloat16"
    assert torch.equal(rows, decoded[OPTION_IDS].float())
    original = C.bf16_tables(served.root)[L.LM_HEAD][OPTION_IDS].float()
    cos = torch.nn.functional.cosine_similarity(rows, original, dim=-1)
    assert float(cos.min()) > 0.999  # the lm_head rows, to within the int8 error ...
    assert not torch.equal(rows, C.decoded_tables(served.root)[L.EMBED_TOKENS][OPTION_IDS].float())  # ... not embed's


def test_head_built_from_checked_config(served: Served) -> None:
    config = json.loads((served.root / L.HEAD_CONFIG).read_text())
    assert L.MARKER_KEY in config
    assert served.report["head"] == {"class": "JointSchemaHead", "config": without_marker(config)}


def test_hidden_states_equal_transformers_on_decoded_tables(served: Served, ref_decoded: Reference,
                                                           record: Callable) -> None:
    assert served.hidden is not None
    assert [tuple(h.shape) for h in served.hidden] == [(len(p), 128) for p in PROMPTS]
    rows = compare.check_hidden(served.hidden, ref_decoded)
    record("layout-2 hidden states vs transformers fp32 on decoded tables", rows)
    for row in rows:
        assert row["err"] <= row["tol"], row
        assert row["cos_min"] > 0.99, row


def test_hidden_states_within_int8_error_of_bf16_originals(served: Served, ref_decoded: Reference,
                                                           ref_original: Reference, record: Callable) -> None:
    assert served.hidden is not None
    rows = compare.check_hidden_int8(served.hidden, ref_decoded, ref_original)
    record("layout-2 hidden states vs transformers fp32 on the BF16 originals", rows)
    for row in rows:
        assert row["err"] <= row["tol"], row
        assert 0 < row["int8"] < 0.1, row  # the int8 tables move the answer, by little


def test_logprobs_equal_transformers_on_decoded_tables(served: Served, ref_decoded: Reference,
                                                       record: Callable) -> None:
    rows = compare.check_logprobs(served.generated, ref_decoded)
    record("layout-2 prompt log-probs vs transformers fp32 on decoded tables", rows)
    for row in rows:
        assert row["n"] >= 5 * (len(PROMPTS[0]) - 1)
        assert row["err"] <= row["tol"], row
    for served_token, ref_token, margin in compare.greedy_agrees(served.generated, ref_decoded):
        if margin > 0.1:
            assert served_token == ref_token


def test_logprobs_within_int8_error_of_bf16_originals(served: Served, ref_decoded: Reference,
                                                      ref_original: Reference, record: Callable) -> None:
    rows = compare.check_logprobs_int8(served.generated, ref_decoded, ref_original)
    record("layout-2 prompt log-probs vs transformers fp32 on the BF16 originals", rows)
    for row in rows:
        assert row["err"] <= row["tol"], row
