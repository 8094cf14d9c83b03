"""The serving hooks against the real vLLM 0.28 on CPU: its Qwen3.5 text model, its loader.

Each test builds vLLM's ``Qwen3_5ForCausalLM`` for a tiny unquantized text-only fixture
(``hooks_support``) and loads it with ``get_model_loader(load_config).load_weights``, once with
vLLM alone and once with ``model.load_weights`` routed through ``clef_format.vllm.load_weights``,
as a plugin's model subclass routes it. Checkpoints are real safetensors files from
``fixtures.builders``; broken ones are those files with a tensor removed.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from safetensors.torch import load_file, save_file

from clef_format.compat import IncompatibleError
from clef_format.fixtures.builders import build_checkpoint, tables_bf16
from tests.support.torch_tensors import as_torch
from tests.support.torch_int8 import dequantize_rows
from clef_format.spec import layouts as L
from clef_format.spec import tables_format as TF
from clef_format.vllm import Int8VocabEmbedding, UnwrittenParametersError, backbone_weights
from clef_format.vllm import load_weights as clef_load_weights
from tests.tier_vllm import hooks_support as hs

NEW, OLD = "0.2.0", "0.1.3"
EMBED, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"  # text-only HF names


@pytest.fixture(scope="module", autouse=True)
def _tear_down_groups() -> Any:
    """Leave the process without vLLM's groups, as other vLLM-tier modules may build their own."""
    yield
    from vllm.distributed import parallel_state as ps

    ps.destroy_model_parallel()
    ps.destroy_distributed_environment()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``checkpoints(layout, drop=(), drop_table=None)``: tiny text-only bf16 checkpoints, built once."""
    base = tmp_path_factory.mktemp("hooks")
    cache: dict[tuple[Any, ...], Path] = {}

    def make(layout: str = "layout-2", drop: tuple[str, ...] = (), drop_table: str | None = None,
             multimodal: bool = False) -> Path:
        key = (layout, drop, drop_table, multimodal)
        if key not in cache:
            root = base / f"{layout}-{len(cache)}"
            build_checkpoint(root, layout=layout, build="bf16", num_layers=4, multimodal=multimodal)
            if drop:
                tensors = load_file(root / L.BACKBONE_SINGLE)
                for name in drop:
                    del tensors[name]
                save_file(tensors, str(root / L.BACKBONE_SINGLE), metadata={"format": "pt"})
            if drop_table:
                tensors = load_file(root / L.TABLES)
                del tensors[drop_table], tensors[TF.scale_name(drop_table)]
                from safetensors import safe_open

                with safe_open(str(root / L.TABLES), "pt") as f:
                    meta = f.metadata()
                save_file(tensors, str(root / L.TABLES), metadata=meta)
            cache[key] = root
        return cache[key]

    return make


def fresh_model(root: Path) -> tuple[Any, torch.nn.Module]:
    cfg = hs.engine_config(root)
    hs.ensure_distributed(cfg)
    return cfg, hs.build_model(cfg)


def load_with_hooks(root: Path, plugin_version: str = NEW) -> torch.nn.Module:
    """vLLM's loader, with ``model.load_weights`` routed through the hooks."""
    cfg, model = fresh_model(root)
    with hs.load_weights_replaced(model, lambda original: clef_load_weights(model, root, plugin_version, original)):
        hs.vllm_load(cfg, model)
    return model


def decoded(root: Path, name: str) -> torch.Tensor:
    t = load_file(root / L.TABLES)
    return dequantize_rows(t[name], t[TF.scale_name(name)], torch.bfloat16)


def all_ids(vocab: int = 512) -> torch.Tensor:
    return torch.cat([torch.arange(vocab), torch.tensor([0, vocab - 1, 7, 7])])


def test_embeddings_equal_decoded_int8_tables(checkpoints: Callable[..., Path]) -> None:
    root = checkpoints("layout-2")
    model = load_with_hooks(root)
    embed = model.model.embed_tokens
    assert isinstance(embed, Int8VocabEmbedding)
    assert embed.q.dtype == torch.int8 and embed.scale.dtype == torch.float32  # int8 in (device) memory
    assert not any(p.dtype == torch.bfloat16 and p.shape[0] == 512 for p in model.parameters())  # BF16 tables gone
    ids = all_ids()
    got = model.embed_input_ids(ids)  # vLLM's own entry point to the embedding
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, decoded(root, EMBED)[ids])
    # and the backbone came from the file through vLLM's loader
    st = load_file(root / L.BACKBONE_SINGLE)
    assert torch.equal(model.model.norm.weight, st["model.norm.weight"])
    assert torch.equal(model.model.layers[3].mlp.down_proj.weight, st["model.layers.3.mlp.down_proj.weight"])


def test_multimodal_class_loads_with_hooks(checkpoints: Callable[..., Path]) -> None:
    """The class the real checkpoints name (vision tower included): tables under language_model."""
    root = checkpoints("layout-2", multimodal=True)
    model = load_with_hooks(root)
    assert type(model).__name__ == "Qwen3_5ForConditionalGeneration"
    assert isinstance(model.language_model.model.embed_tokens, Int8VocabEmbedding)
    ids = torch.tensor([0, 9, 511])
    assert torch.equal(model.embed_input_ids(ids), decoded(root, L.EMBED_TOKENS)[ids])
    assert torch.equal(model.language_model.lm_head.rows(ids), decoded(root, L.LM_HEAD)[ids])


def test_lexical_rows_are_the_lm_head_rows(checkpoints: Callable[..., Path]) -> None:
    root = checkpoints("layout-2")
    model = load_with_hooks(root)
    ids = torch.tensor([[3, 17, 511], [0, 0, 256]])
    rows = model.lm_head.rows(ids)
    assert rows.shape == (2, 3, 64) and rows.dtype == torch.bfloat16
    assert torch.equal(rows, decoded(root, LM_HEAD)[ids])
    # ... and they are the release's lm_head rows to within the int8 error (not embed_tokens rows)
    import json

    source = as_torch(tables_bf16(json.loads((root / L.CONFIG).read_text()), seed=0)[LM_HEAD]).float()[ids]
    cos = torch.nn.functional.cosine_similarity(rows.float(), source, dim=-1)
    assert float(cos.min()) > 0.999
    assert not torch.equal(rows, decoded(root, EMBED)[ids])


def test_layout2_unmarked_refused_before_anything_loads(checkpoints: Callable[..., Path]) -> None:
    root = checkpoints("layout-2-unmarked")
    cfg, model = fresh_model(root)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    calls: list[str] = []

    def hook(original: Callable[..., Any]) -> Any:
        def counted(weights: Any) -> Any:
            calls.append("vllm load_weights")
            return original(weights)

        return clef_load_weights(model, root, NEW, counted)

    with hs.load_weights_replaced(model, hook), pytest.raises(IncompatibleError) as exc:
        hs.vllm_load(cfg, model)
    assert exc.value.code == "marker-missing" and "migrate" in exc.value.fix
    assert calls == []  # vLLM's load_weights never ran
    assert isinstance(model.model.embed_tokens, torch.nn.Module) and not isinstance(model.model.embed_tokens,
                                                                                    Int8VocabEmbedding)
    for n, p in model.named_parameters():  # not one byte of any parameter changed
        assert torch.equal(p.detach().view(torch.uint8), before[n].view(torch.uint8)), n
    with pytest.raises(IncompatibleError):  # the iterator refuses when called, before the first next()
        backbone_weights(root, OLD)


def test_layout2_through_vllm_alone_leaves_tables_unwritten(checkpoints: Callable[..., Path]) -> None:
    """The 2026-10-07 gap itself: vLLM loads a layout-2 backbone "OK" with no tables in it."""
    root = checkpoints("layout-2")
    cfg, model = fresh_model(root)
    with torch.no_grad():
        model.model.embed_tokens.weight.fill_(float("nan"))
    hs.vllm_load(cfg, model)  # vLLM alone: no error
    assert torch.isnan(model.model.embed_tokens.weight).all()  # ... and nothing wrote the embedding


def test_layout1_for_int8_plugin_refused_and_served_by_old_plugin(checkpoints: Callable[..., Path]) -> None:
    root = checkpoints("layout-1")
    with pytest.raises(IncompatibleError) as exc:
        backbone_weights(root, NEW)
    assert exc.value.code == "plugin-incompatible" and "layout-2" in exc.value.fix
    model = load_with_hooks(root, OLD)  # plugin 0.1.x: BF16 tables through vLLM, all checked
    st = load_file(root / L.BACKBONE_SINGLE)
    assert torch.equal(model.model.embed_tokens.weight[:512], st[EMBED])
    assert torch.equal(model.lm_head.weight[:512], st[LM_HEAD])


@pytest.mark.parametrize("dropped, param", [
    ("model.layers.0.linear_attn.in_proj_z.weight", "model.layers.0.linear_attn.in_proj_qkvz.weight"),
    ("model.layers.3.mlp.down_proj.weight", "model.layers.3.mlp.down_proj.weight"),
    ("model.layers.3.self_attn.v_proj.weight", "model.layers.3.self_attn.qkv_proj.weight"),
])
def test_dropped_projection_caught_by_hooks_not_by_vllm(checkpoints: Callable[..., Path], dropped: str,
                                                        param: str) -> None:
    """vLLM alone loads it; the hooks refuse it at the gate (verify's exactness check), before a
    weight is read; and behind the gate, the completeness check alone names the fused parameter
    vLLM's own loader left unwritten."""
    from clef_format.vllm import WriteTracker

    root = checkpoints("layout-2", drop=(dropped,))
    cfg, model = fresh_model(root)
    hs.vllm_load(cfg, model)  # the gap: vLLM alone does NOT raise
    with pytest.raises(IncompatibleError) as refused:
        load_with_hooks(root)
    assert refused.value.code == "tensor-missing" and dropped.removesuffix(".weight") in str(refused.value)
    cfg, model = fresh_model(root)
    tracker = WriteTracker(model).arm()
    hs.vllm_load(cfg, model)
    with pytest.raises(UnwrittenParametersError) as exc:
        tracker.check()
    # (layout 2 keeps the tables out of vLLM's loader: the hooks install them, so they are unwritten here too)
    assert [n for n in exc.value.unwritten if n not in (EMBED, LM_HEAD)] == [param]
    assert param in str(exc.value)


def test_dropped_table_in_layout1_caught_by_hooks_not_by_vllm(checkpoints: Callable[..., Path]) -> None:
    root = checkpoints("layout-1", drop=(EMBED,))
    cfg, model = fresh_model(root)
    hs.vllm_load(cfg, model)  # vLLM alone: loads, embed_tokens never written
    with pytest.raises(IncompatibleError) as exc:
        load_with_hooks(root, OLD)
    assert exc.value.code == "tables-missing"


def test_dropped_table_in_layout1_caught_by_completeness_check(checkpoints: Callable[..., Path]) -> None:
    """Past the file checks, the storage check alone catches the table vLLM never wrote."""
    from clef_format.vllm import WriteTracker

    root = checkpoints("layout-1", drop=(LM_HEAD,))
    cfg, model = fresh_model(root)
    tracker = WriteTracker(model).arm()
    hs.vllm_load(cfg, model)
    with pytest.raises(UnwrittenParametersError) as exc:
        tracker.check()
    assert list(exc.value.unwritten) == ["lm_head.weight"]


def test_dropped_table_in_tables_file_refused(checkpoints: Callable[..., Path]) -> None:
    root = checkpoints("layout-2", drop_table=LM_HEAD)
    with pytest.raises(IncompatibleError) as exc:
        load_with_hooks(root)
    assert exc.value.code == "table-shape" and LM_HEAD in exc.value.reason


# ---------------------------------------------------------------------------------------------
# tensor parallel: 2 processes, vLLM's TP group over gloo


def _tp_worker(rank: int, root: str, init: str, out_dir: str) -> None:
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    from clef_format.compat import check_checkpoint
    from clef_format.vllm import load_int8_tables, vllm_tensor_parallel

    with set_current_vllm_config(VllmConfig()):
        ps.init_distributed_environment(world_size=2, rank=rank, local_rank=rank, distributed_init_method=init,
                                        backend="gloo")
        ps.initialize_model_parallel(2, 1)
        tp_rank, tp_size, reduce = vllm_tensor_parallel()
        assert (tp_rank, tp_size) == (rank, 2) and reduce is not None
        tables = load_int8_tables(check_checkpoint(root, NEW), "cpu", tp_rank, tp_size, all_reduce=reduce)
        ids = torch.cat([torch.arange(512), torch.tensor([0, 255, 256, 511])]).view(4, -1)
        torch.save({"embed": tables.embed(ids), "rows": tables.rows(ids), "ids": ids,
                    "shard": (tables.embed.vocab_start, tables.embed.vocab_end), "held": tables.embed.q.shape[0]},
                   os.path.join(out_dir, f"rank{rank}.pt"))
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()


def test_tensor_parallel_sharded_embedding_equals_unsharded(checkpoints: Callable[..., Path],
                                                             tmp_path: Path) -> None:
    root = checkpoints("layout-2")
    init = f"tcp://127.0.0.1:{hs.free_port()}"
    torch.multiprocessing.start_processes(_tp_worker, args=(str(root), init, str(tmp_path)), nprocs=2,
                                          join=True, start_method="spawn")
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert [r["shard"] for r in results] == [(0, 256), (256, 512)]
    assert [r["held"] for r in results] == [256, 256]  # each rank holds half the rows
    ids = results[0]["ids"]
    for r in results:  # every rank ends with the full, exact decode
        assert torch.equal(r["embed"], decoded(root, EMBED)[ids])
        assert torch.equal(r["rows"], decoded(root, LM_HEAD)[ids])
