"""A tensor missing from the backbone or from the tables file: the engine with the plugin refuses
to serve (at start-up: the gate runs verify's checks), the same engine without it starts and
serves (the gap the hooks close)."""

from __future__ import annotations

from typing import Any, Callable

import torch

import checkpoints as C
from engines import NEW, PROMPTS, engine_kwargs

IDS = [1, 2, 300]


def test_backbone_tensor_dropped_refused_at_start_up(engines: Any, checkpoint: Callable) -> None:
    """The serving gate runs every verify check, so a projection missing from the backbone is refused
    before vLLM's loader reads a weight (the completeness check behind it, for a loader that skips a
    tensor of a complete file, is proven with vLLM's own loader in tests/tier_vllm and tests/hooks)."""
    root = checkpoint("layout-2-backbone-tensor-dropped")
    engine = engines.get("backbone-tensor-dropped [0.2.1] generate", root, NEW, **engine_kwargs(root))
    assert not engine.ok
    log = engine.log
    assert "IncompatibleError" in log and "tensor-missing" in log
    assert C.DROPPED_BACKBONE.removesuffix(".weight") in log
    assert "UnwrittenParametersError" not in log  # refused before any weight was loaded


def test_backbone_tensor_dropped_served_without_plugin(engines: Any, checkpoint: Callable) -> None:
    root = checkpoint("layout-2-backbone-tensor-dropped")
    engine = engines.get("backbone-tensor-dropped [none] generate", root, None, **engine_kwargs(root))
    assert engine.ok, engine.error
    results = engine.generate(PROMPTS)
    assert [len(r["tokens"]) for r in results] == [2, 2]  # served, from a checkpoint with a projection missing
    (report,) = engine.probe("tables_report_plain", token_ids=IDS)
    assert report["embed"]["type"] == "VocabParallelEmbedding"  # vLLM's own BF16 table ...
    decoded = C.decoded_tables(root)[C.table_names(root)[0]]
    assert not torch.equal(torch.tensor(report["embedded"]), decoded[IDS].float())  # ... not the checkpoint's


def test_table_tensor_dropped_refused(engines: Any, checkpoint: Callable) -> None:
    root = checkpoint("layout-2-table-tensor-dropped")
    engine = engines.get("table-tensor-dropped [0.2.1] generate", root, NEW, **engine_kwargs(root))
    assert not engine.ok
    log = engine.log
    assert "[table-shape]" in log and C.DROPPED_TABLE in log  # the start-up gate reads the tables' headers
    assert "fix: " in log
    assert "Loading weights took" not in log


def test_table_tensor_dropped_served_without_plugin(engines: Any, checkpoint: Callable) -> None:
    root = checkpoint("layout-2-table-tensor-dropped")
    engine = engines.get("table-tensor-dropped [none] generate", root, None, **engine_kwargs(root))
    assert engine.ok, engine.error
    results = engine.generate(PROMPTS)
    assert [len(r["tokens"]) for r in results] == [2, 2]
    (report,) = engine.probe("tables_report_plain", token_ids=IDS)
    assert report["embed"]["type"] == "VocabParallelEmbedding"
    decoded = C.decoded_tables(root)[C.table_names(root)[0]]
    assert not torch.equal(torch.tensor(report["embedded"]), decoded[IDS].float())  # served rows not from the file
