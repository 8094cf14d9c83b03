"""``load_weights``' options and defaults, each as a plugin uses it (survivors of the hooks' unsampled
mutmut run: the dtype and device the tables take from the model, ``exempt``, ``replace_lm_head``,
``tensor_parallel``, ``on_refusal``, and what it returns)."""

from __future__ import annotations

import json
from typing import Any, Iterable

import pytest
import torch

from clef_format.compat import IncompatibleError
from clef_format.spec import layouts as L
from clef_format.vllm import Int8VocabEmbedding, UnwrittenParametersError, load_weights
from tests.hooks.test_hooks import EMBED, NEW, decoded, shaped_for, text_ck
from tests.support.torch_int8 import dequantize_rows
from safetensors.torch import load_file
from clef_format.spec import tables_format as TF


def test_the_tables_decode_to_the_models_own_float_dtype(built: Any) -> None:
    """A model in F32 gets F32 rows (out_dtype is the first parameter's dtype), bit for bit the decode."""
    root = text_ck(built)
    m = shaped_for(root).to(torch.float32)
    load_weights(m, root, NEW, m.load_by_name)
    ids = torch.tensor([0, 7, 511])
    rows = m.model.embed_tokens(ids)
    t = load_file(root / L.TABLES)
    assert rows.dtype == torch.float32
    assert torch.equal(rows, dequantize_rows(t[EMBED], t[TF.scale_name(EMBED)], torch.float32)[ids])


def test_a_model_whose_first_parameter_is_not_float_gets_bf16_rows(built: Any) -> None:
    root = text_ck(built)
    m = shaped_for(root)
    m.packed = torch.nn.Parameter(torch.zeros(2, dtype=torch.uint8), requires_grad=False)
    params = dict(m.named_parameters())
    m._parameters = {"packed": m._parameters.pop("packed"), **m._parameters}  # first in parameters()
    assert next(iter(m.parameters())).dtype == torch.uint8 and len(params) == len(dict(m.named_parameters()))
    load_weights(m, root, NEW, m.load_by_name, exempt=lambda n: n == "packed")
    assert m.model.embed_tokens(torch.tensor([3])).dtype == torch.bfloat16


def test_a_model_with_no_parameters_gets_its_tables_on_the_cpu_in_bf16(built: Any) -> None:
    root = text_ck(built)
    m = torch.nn.Module()
    m.model = torch.nn.Module()
    m.model.embed_tokens = torch.nn.Identity()
    m.lm_head = torch.nn.Identity()
    assert load_weights(m, root, NEW, lambda weights: set(weights and [])) == set()
    rows = m.model.embed_tokens(torch.tensor([1, 2]))
    assert rows.device.type == "cpu" and rows.dtype == torch.bfloat16
    assert torch.equal(rows, decoded(root, EMBED)[torch.tensor([1, 2])])


def test_exempt_parameters_may_stay_unwritten_and_others_may_not(built: Any) -> None:
    root = text_ck(built)
    m = shaped_for(root)
    m.extra_scale = torch.nn.Parameter(torch.ones(1))
    with pytest.raises(UnwrittenParametersError) as exc:
        load_weights(m, root, NEW, m.load_by_name)
    assert list(exc.value.unwritten) == ["extra_scale"]
    m = shaped_for(root)
    m.extra_scale = torch.nn.Parameter(torch.ones(1))
    load_weights(m, root, NEW, m.load_by_name, exempt=lambda n: n == "extra_scale")


def test_replace_lm_head_false_keeps_the_models_lm_head(built: Any) -> None:
    root = text_ck(built)
    m = shaped_for(root)
    load_weights(m, root, NEW, m.load_by_name, replace_lm_head=False, exempt=lambda n: n == "lm_head.weight")
    assert isinstance(m.model.embed_tokens, Int8VocabEmbedding)
    assert isinstance(m.lm_head, torch.nn.Linear) and not isinstance(m.lm_head, Int8VocabEmbedding)


def test_tensor_parallel_is_used_for_the_shard_and_the_all_reduce(built: Any) -> None:
    root = text_ck(built)
    m = shaped_for(root)
    calls: list[torch.Size] = []

    def reduce(t: torch.Tensor) -> torch.Tensor:
        calls.append(t.shape)
        return t

    load_weights(m, root, NEW, m.load_by_name, tensor_parallel=(1, 2, reduce))
    embed = m.model.embed_tokens
    assert isinstance(embed, Int8VocabEmbedding) and embed.q.shape[0] == 256  # vocab 512 split in two
    ids = torch.tensor([0, 300])
    out = embed(ids)
    assert calls == [out.shape]
    assert torch.equal(out[1], decoded(root, EMBED)[300]) and not out[0].any()  # rank 1 holds rows 256..511


def test_the_names_returned_are_the_loaders_own_when_it_reports_them(built: Any) -> None:
    """vLLM's loader returns the names it loaded (its caller checks them); ``None`` from a loader that
    returns nothing means every parameter the tracker armed."""
    root = text_ck(built)
    m = shaped_for(root)
    extra = "model.rotary_emb.inv_freq"  # a name vLLM's loader reports that is no parameter
    got = load_weights(m, root, NEW, lambda w: m.load_by_name(w) | {extra})
    assert extra in got
    m = shaped_for(root)
    got = load_weights(m, root, NEW, lambda w: (m.load_by_name(w), None)[1])
    assert got == {n for n, _ in m.named_parameters()}


def test_a_partial_write_the_loader_reports_as_loaded_is_named_so(built: Any) -> None:
    root = text_ck(built)
    m = shaped_for(root)
    victim = "model.layers.0.linear_attn.in_proj_z.weight"

    def load(weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        done = set()
        with torch.no_grad():
            for name, t in weights:
                p = m.get_parameter(name)
                (p[: p.shape[0] // 2] if name == victim else p).copy_(t[: p.shape[0] // 2] if name == victim else t)
                done.add(name)
        return done

    with pytest.raises(UnwrittenParametersError) as exc:
        load_weights(m, root, NEW, load)
    assert list(exc.value.unwritten) == [victim] and "(vLLM reported it loaded)" in exc.value.unwritten[victim]


def test_a_refusal_handed_over_lets_the_load_go_on(fresh: Any) -> None:
    root = fresh("layout-2", "bf16", num_layers=4, multimodal=False)
    cfg = json.loads((root / L.HEAD_CONFIG).read_text())
    cfg[L.MARKER_KEY] = ">=0.3.0"
    (root / L.HEAD_CONFIG).write_text(json.dumps(cfg))
    m = shaped_for(root)
    with pytest.raises(IncompatibleError):
        load_weights(m, root, NEW, m.load_by_name)
    m = shaped_for(root)
    seen: list[IncompatibleError] = []
    got = load_weights(m, root, NEW, m.load_by_name, on_refusal=seen.append)
    assert [e.code for e in seen] == ["plugin-incompatible"] and got == {n for n, _ in m.named_parameters()}
    assert isinstance(m.model.embed_tokens, Int8VocabEmbedding)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: the tables follow the model's")
def test_the_tables_land_on_the_models_device(built: Any) -> None:
    root = text_ck(built)
    m = shaped_for(root).to("cuda")
    load_weights(m, root, NEW, m.load_by_name)
    assert m.model.embed_tokens.q.device.type == "cuda"
