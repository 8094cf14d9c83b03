"""The serving hooks' CPU parts with torch only (no vLLM): head config, iterator, int8 module, completeness.

The real-vLLM side (vLLM's Qwen3.5 model and loader) is tests/tier_vllm/test_hooks.py. Here a plain
torch module named like vLLM's text-only Qwen3.5 stands in for the model, and a plain
copy-by-name function for ``model.load_weights``: enough to run ``clef_format.vllm.load_weights``
end to end on real fixture files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable

import pytest
import torch
from safetensors.torch import load_file, save_file

from clef_format.compat import IncompatibleError
from clef_format.fixtures.builders import HEAD_CODE
from tests.support.torch_int8 import dequantize_rows, quantize_rows
from clef_format.read.checkpoint import read_checkpoint
from clef_format.read.safetensors import read_header
from clef_format.spec import layouts as L
from clef_format.spec import tables_format as TF
from clef_format.vllm import (
    Int8VocabEmbedding,
    UnwrittenParametersError,
    WriteTracker,
    backbone_weights,
    head_config,
    install_int8_tables,
    load_int8_tables,
    load_weights,
    shard_range,
)

NEW, OLD = "0.2.0", "0.1.3"
EMBED = "model.embed_tokens.weight"


def text_ck(built: Any, layout: str = "layout-2", **kw: Any) -> Path:
    return built(layout, "bf16", num_layers=4, multimodal=False, **kw)


def decoded(root: Path, name: str) -> torch.Tensor:
    t = load_file(root / L.TABLES)
    return dequantize_rows(t[name], t[TF.scale_name(name)], torch.bfloat16)


# ---------------------------------------------------------------------------------------------
# imports


def test_package_import_is_light() -> None:
    code = ("import sys, clef_format.vllm as v; v.head_config; v.backbone_weights; "
            "bad = [m for m in ('torch', 'vllm', 'triton') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_int8_module_needs_no_vllm() -> None:
    code = ("import sys, clef_format.vllm as v; v.Int8VocabEmbedding; v.WriteTracker; v.load_weights; "
            "assert 'vllm' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------
# head config


def test_head_config_has_no_marker_and_builds_the_head(built: Any) -> None:
    root = built("layout-2", "bf16", num_layers=4)
    cfg = head_config(root, NEW)
    assert L.MARKER_KEY not in cfg and L.MARKER_KEY in json.loads((root / L.HEAD_CONFIG).read_text())
    scope: dict[str, Any] = {}
    exec(HEAD_CODE, scope)  # the reference code the fixture ships, a real torch module
    with torch.device("meta"):
        head = scope["JointSchemaHead"](**cfg)
    stored = read_header(root / L.HEAD_WEIGHTS).tensors
    assert {k: tuple(v.shape) for k, v in head.state_dict().items()} == {k: i.shape for k, i in stored.items()}
    with pytest.raises(TypeError), torch.device("meta"):  # why the marker must go: it breaks the constructor
        scope["JointSchemaHead"](**json.loads((root / L.HEAD_CONFIG).read_text()))


def test_head_config_checks_the_pair(built: Any) -> None:
    with pytest.raises(IncompatibleError) as exc:
        head_config(built("layout-2-unmarked", "bf16", num_layers=4), NEW)
    assert exc.value.code == "marker-missing"
    with pytest.raises(IncompatibleError) as exc:
        head_config(built("layout-2", "bf16", num_layers=4), OLD)
    assert exc.value.code == "plugin-incompatible"
    assert head_config(built("layout-1", "bf16", num_layers=4), OLD)["width"] > 0


@pytest.mark.parametrize("edit, code", [({"extra": 1}, "head-unexpected"), ({"width": None}, "head-incomplete")])
def test_head_config_refuses_what_the_head_would(fresh: Any, edit: dict[str, Any], code: str) -> None:
    root = fresh("layout-2", "bf16", num_layers=4)
    cfg = json.loads((root / L.HEAD_CONFIG).read_text())
    cfg.update(edit)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    (root / L.HEAD_CONFIG).write_text(json.dumps(cfg))
    with pytest.raises(IncompatibleError) as exc:
        head_config(root, NEW)
    assert exc.value.code == code


# ---------------------------------------------------------------------------------------------
# backbone iterator


def test_iterator_layout2_yields_backbone_only(built: Any) -> None:
    root = text_ck(built)
    got = dict(backbone_weights(root, NEW))
    want = load_file(root / L.BACKBONE_SINGLE)
    assert got.keys() == want.keys() and EMBED not in got and L.LM_HEAD not in got
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_iterator_layout1_old_plugin_yields_the_tables(built: Any) -> None:
    got = dict(backbone_weights(text_ck(built, "layout-1"), OLD))
    assert EMBED in got and L.LM_HEAD in got


def test_iterator_reads_every_shard(built: Any) -> None:
    root = built("layout-2", "bf16", num_layers=4, shards=3)
    ck = read_checkpoint(root)
    assert len(ck.backbone_files) == 3
    assert {n for n, _ in backbone_weights(ck, NEW)} == set(ck.backbone)


@pytest.mark.parametrize("layout, version, code", [
    ("layout-2-unmarked", NEW, "marker-missing"),
    ("layout-2-unmarked", OLD, "marker-missing"),
    ("layout-1", NEW, "plugin-incompatible"),
    ("layout-2", OLD, "plugin-incompatible"),
])
def test_iterator_refuses_when_called(built: Any, layout: str, version: str, code: str) -> None:
    with pytest.raises(IncompatibleError) as exc:
        backbone_weights(text_ck(built, layout), version)  # no next(): refused at the call
    assert exc.value.code == code


# ---------------------------------------------------------------------------------------------
# int8 embedding


def table(vocab: int = 200, hidden: int = 24, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(vocab, hidden, generator=g) * torch.exp(torch.randn(vocab, 1, generator=g))
    rows[3] = 0
    return quantize_rows(rows.to(torch.bfloat16))


def test_module_decodes_like_the_format() -> None:
    q, scale = table()
    emb = Int8VocabEmbedding.from_table(q, scale)
    ids = torch.tensor([[0, 3, 199], [5, 5, 7]])
    assert torch.equal(emb(ids), dequantize_rows(q, scale, torch.bfloat16)[ids])
    assert torch.equal(emb.rows(ids), emb(ids))
    assert emb.q.dtype == torch.int8 and list(emb.parameters()) == [] and emb.state_dict() == {}
    f32 = Int8VocabEmbedding.from_table(q, scale, out_dtype=torch.float32)
    assert torch.equal(f32(ids), dequantize_rows(q, scale)[ids])


@pytest.mark.parametrize("vocab, tp, want", [
    (512, 2, [(0, 256), (256, 512)]),
    (500, 2, [(0, 256), (256, 500)]),  # padded to 512 first, as VocabParallelEmbedding does
    (248320, 4, [(0, 62080), (62080, 124160), (124160, 186240), (186240, 248320)]),
    (100, 4, [(0, 32), (32, 64), (64, 96), (96, 100)]),
])
def test_shard_ranges(vocab: int, tp: int, want: list[tuple[int, int]]) -> None:
    padded = -(-vocab // 64) * 64
    per = padded // tp
    expect = [(min(r * per, vocab), min(r * per + per, vocab)) for r in range(tp)]
    assert [shard_range(vocab, r, tp) for r in range(tp)] == expect
    assert expect == want


@pytest.mark.parametrize("rank, size", [(2, 2), (4, 4), (-1, 2), (0, 0)])
def test_a_rank_outside_its_group_is_refused(rank: int, size: int) -> None:
    """``tp_rank == tp_size`` is the off-by-one a loader makes: it would read past the last shard (an empty
    range at the vocab's end) instead of failing. (The unsampled mutmut run's survivor ``<`` -> ``<=``.)"""
    with pytest.raises(ValueError, match=f"tp_rank {rank} outside a group of {size}"):
        shard_range(512, rank, size)


def test_shards_sum_to_the_whole_table() -> None:
    """What the all-reduce does, in one process: each id is decoded by one shard, zeros elsewhere."""
    q, scale = table(vocab=500)
    ids = torch.tensor([0, 255, 256, 499, 3, 100])
    parts = [Int8VocabEmbedding.from_table(q, scale, r, 2, all_reduce=lambda t: t)(ids) for r in range(2)]
    assert torch.equal(parts[0] + parts[1], dequantize_rows(q, scale, torch.bfloat16)[ids])
    assert (parts[1][[0, 1, 4, 5]] == 0).all() and (parts[0][[2, 3]] == 0).all()  # out-of-shard ids: zeros


def _gloo_worker(rank: int, init: str, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    q, scale = table(vocab=500)
    emb = Int8VocabEmbedding.from_table(q, scale, rank, 2)  # default all-reduce: torch.distributed
    ids = torch.arange(500).view(20, 25)
    torch.save({"out": emb(ids), "rows": emb.q.shape[0]}, os.path.join(out, f"{rank}.pt"))
    torch.distributed.destroy_process_group()


def test_tensor_parallel_over_gloo(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.start_processes(_gloo_worker, args=(f"tcp://127.0.0.1:{port}", str(tmp_path)),
                                          nprocs=2, join=True, start_method="spawn")
    q, scale = table(vocab=500)
    whole = dequantize_rows(q, scale, torch.bfloat16)[torch.arange(500).view(20, 25)]
    for r, held in ((0, 256), (1, 244)):
        res = torch.load(tmp_path / f"{r}.pt")
        assert res["rows"] == held and torch.equal(res["out"], whole)


def test_load_int8_tables_reads_the_shard(built: Any) -> None:
    root = text_ck(built)
    ck = read_checkpoint(root)
    tables = load_int8_tables(ck, "cpu", tp_rank=1, tp_size=2, all_reduce=lambda t: t)
    assert (tables.embed.vocab_start, tables.embed.vocab_end, tables.embed.q.shape[0]) == (256, 512, 256)
    ids = torch.tensor([300, 511])
    assert torch.equal(tables.embed(ids), decoded(root, EMBED)[ids])
    assert torch.equal(tables.rows(ids), decoded(root, L.LM_HEAD)[ids])


# ---------------------------------------------------------------------------------------------
# completeness on plain torch modules


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 6, bias=False, dtype=torch.bfloat16)
        self.packed = torch.nn.Parameter(torch.zeros(6, 2, dtype=torch.uint8), requires_grad=False)
        self.q8 = torch.nn.Parameter(torch.zeros(3, 4, dtype=torch.int8), requires_grad=False)
        self.k_scale = torch.nn.Parameter(torch.tensor(1.0))


def test_tracker_passes_when_everything_is_written() -> None:
    m = Tiny()
    tracker = WriteTracker(m).arm()
    assert torch.isnan(m.proj.weight).all() and (m.packed == 0xFF).all() and (m.q8 == -128).all()
    with torch.no_grad():
        m.proj.weight.copy_(torch.randn(6, 4))
        m.packed.copy_(torch.randint(0, 255, (6, 2)))
        m.q8.copy_(torch.randint(-127, 128, (3, 4)))
    tracker.check()
    assert float(m.k_scale.detach()) == 1.0  # exempt: never filled


def test_tracker_names_partial_and_missing_writes() -> None:
    m = Tiny()
    tracker = WriteTracker(m).arm()
    with torch.no_grad():
        m.proj.weight[:4].copy_(torch.randn(4, 4))  # a fused layer with one shard missing
        m.packed[:3].copy_(torch.randint(0, 255, (3, 2)))
    with pytest.raises(UnwrittenParametersError) as exc:
        tracker.check(loaded=["proj.weight", "packed"])
    assert exc.value.unwritten == {
        "proj.weight": "8 of 24 elements not written (vLLM reported it loaded)",
        "packed": "3 of 6 rows not written (vLLM reported it loaded)",
        "q8": "never written",
    }


def test_tracker_must_be_armed() -> None:
    with pytest.raises(RuntimeError):
        WriteTracker(Tiny()).check()


# ---------------------------------------------------------------------------------------------
# the one-call load hook on a vLLM-shaped torch model


class Shaped(torch.nn.Module):
    """Parameters named as vLLM's text-only Qwen3.5 receives them (unfused), plus its two tables."""

    def __init__(self, names: dict[str, tuple[int, ...]], vocab: int, hidden: int) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(vocab, hidden, dtype=torch.bfloat16)
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False, dtype=torch.bfloat16)
        for name, shape in names.items():
            parent = self
            *path, leaf = name.split(".")
            for part in path:
                if not hasattr(parent, part):
                    parent.add_module(part, torch.nn.Module())
                parent = getattr(parent, part)
            if not hasattr(parent, leaf):
                parent.register_parameter(leaf, torch.nn.Parameter(torch.empty(shape, dtype=torch.bfloat16)))

    def load_by_name(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        done = set()
        with torch.no_grad():
            for name, t in weights:
                self.get_parameter(name).copy_(t)
                done.add(name)
        return done


def shaped_for(root: Path) -> Shaped:
    names = {k: tuple(v.shape) for k, v in load_file(root / L.BACKBONE_SINGLE).items()}
    return Shaped(names, 512, 64)


def test_load_hook_layout2(built: Any) -> None:
    root = text_ck(built)
    m = shaped_for(root)
    loaded = load_weights(m, root, NEW, m.load_by_name)
    assert isinstance(m.model.embed_tokens, Int8VocabEmbedding) and isinstance(m.lm_head, Int8VocabEmbedding)
    ids = torch.tensor([1, 2, 511])
    assert torch.equal(m.model.embed_tokens(ids), decoded(root, EMBED)[ids])
    assert torch.equal(m.lm_head.rows(ids), decoded(root, L.LM_HEAD)[ids])
    assert loaded == {n for n, _ in m.named_parameters()}


def test_gate_refuses_a_file_missing_a_tensor_before_loading(fresh: Any) -> None:
    root = fresh("layout-2", "bf16", num_layers=4, multimodal=False)
    full = load_file(root / L.BACKBONE_SINGLE)
    m = shaped_for(root)
    dropped = "model.layers.0.linear_attn.in_proj_z.weight"
    save_file({k: v for k, v in full.items() if k != dropped}, str(root / L.BACKBONE_SINGLE), {"format": "pt"})
    calls: list[int] = []
    with pytest.raises(IncompatibleError) as exc:
        load_weights(m, root, NEW, lambda w: calls.append(1))
    assert exc.value.code == "tensor-missing" and calls == []


def test_load_hook_catches_a_tensor_the_loader_dropped(fresh: Any) -> None:
    """A complete file, but a loader that skips one weight (a name-mapping slip): the completeness
    check is the net behind the gate."""
    root = fresh("layout-2", "bf16", num_layers=4, multimodal=False)
    m = shaped_for(root)
    dropped = "model.layers.0.linear_attn.in_proj_z.weight"
    with pytest.raises(UnwrittenParametersError) as exc:
        load_weights(m, root, NEW, lambda w: m.load_by_name((n, t) for n, t in w if n != dropped))
    assert list(exc.value.unwritten) == [dropped]


def test_load_hook_refuses_before_loading(built: Any) -> None:
    root = text_ck(built, "layout-2-unmarked")
    m = shaped_for(text_ck(built))
    calls: list[int] = []
    with pytest.raises(IncompatibleError):
        load_weights(m, root, NEW, lambda w: calls.append(1))
    assert calls == [] and isinstance(m.model.embed_tokens, torch.nn.Embedding)


def test_install_needs_a_qwen_shape() -> None:
    q, scale = table()
    from clef_format.vllm import Int8Tables

    emb = Int8VocabEmbedding.from_table(q, scale)
    with pytest.raises(LookupError):
        install_int8_tables(torch.nn.Linear(2, 2), Int8Tables(emb, emb))


class _TextOnly(torch.nn.Module):
    """Where vLLM's text-only Qwen3.5 keeps its tables: ``model.embed_tokens`` and ``lm_head``."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Embedding(vocab, hidden)
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)


class _Multimodal(torch.nn.Module):
    """The multimodal class: both tables under ``language_model``."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.language_model = _TextOnly(vocab, hidden)


def _tables() -> Any:
    from clef_format.vllm import Int8Tables

    q, scale = table()
    return Int8Tables(Int8VocabEmbedding.from_table(q, scale), Int8VocabEmbedding.from_table(*table(seed=1)))


@pytest.mark.parametrize("cls, prefix", [(_TextOnly, ""), (_Multimodal, "language_model.")], ids=["text", "multimodal"])
def test_install_reports_what_it_put_where(cls: Any, prefix: str) -> None:
    """The returned map is what a plugin logs: each replaced path and the class now there; the
    modules installed are the tables' own (no copy), at vLLM's paths for each model class."""
    m, t = cls(200, 24), _tables()
    done = install_int8_tables(m, t)
    assert done == {f"{prefix}model.embed_tokens": "Int8VocabEmbedding", f"{prefix}lm_head": "Int8VocabEmbedding"}
    assert m.get_submodule(f"{prefix}model.embed_tokens") is t.embed
    assert m.get_submodule(f"{prefix}lm_head") is t.lexical


def test_install_leaves_lm_head_alone_when_asked() -> None:
    """``replace_lm_head=False`` (a model whose logits vLLM must still compute): only the embedding is
    replaced; the BF16 lm_head stays the same module with the same weights."""
    m, t = _TextOnly(200, 24), _tables()
    head = m.lm_head
    before = head.weight.detach().clone()
    done = install_int8_tables(m, t, replace_lm_head=False)
    assert done == {"model.embed_tokens": "Int8VocabEmbedding"}
    assert m.lm_head is head and torch.equal(m.lm_head.weight.detach(), before)
    assert m.model.embed_tokens is t.embed


def test_install_on_a_model_without_the_tables_names_its_class() -> None:
    with pytest.raises(LookupError, match=r"^Linear has none of \('language_model\.model\.embed_tokens', "
                                          r"'model\.embed_tokens'\): not a vLLM Qwen3\.5 model$"):
        install_int8_tables(torch.nn.Linear(2, 2), _tables())


def test_the_int8_module_built_from_a_whole_table_with_its_defaults() -> None:
    """A plugin building the module from one whole table gives only the rows, the scales and the
    vocabulary size: the defaults make it the whole table on one rank, which decodes every id."""
    q, scale = table()
    m = Int8VocabEmbedding(q, scale, q.shape[0])
    assert (m.vocab_start, m.vocab_end, m.tp_size) == (0, q.shape[0], 1)
    ids = torch.arange(q.shape[0])
    assert torch.equal(m(ids), dequantize_rows(q, scale, torch.bfloat16))


@pytest.mark.parametrize("q_dtype, s_dtype", [(torch.int16, torch.float32), (torch.int8, torch.float16),
                                              (torch.uint8, torch.float64)])
def test_the_int8_module_refuses_rows_or_scales_of_another_dtype(q_dtype: Any, s_dtype: Any) -> None:
    q, scale = table()
    with pytest.raises(TypeError) as exc:
        Int8VocabEmbedding(q.to(q_dtype), scale.to(s_dtype), q.shape[0])
    assert str(exc.value) == f"need I8 rows and F32 scales, got {q_dtype} and {s_dtype}"


def test_the_int8_module_refuses_scales_of_another_shape_and_a_partial_table_without_tp() -> None:
    q, scale = table()
    with pytest.raises(ValueError) as exc:
        Int8VocabEmbedding(q, scale[:, 0], q.shape[0])  # the scales' column dropped
    assert str(exc.value) == (f"shard [0, {q.shape[0]}) does not match rows {tuple(q.shape)} "
                              f"and scales {(q.shape[0],)}")
    with pytest.raises(ValueError) as exc:
        Int8VocabEmbedding(q[:100], scale[:100], q.shape[0], 0, 100)
    assert str(exc.value) == "without tensor parallelism the module holds the whole table"
