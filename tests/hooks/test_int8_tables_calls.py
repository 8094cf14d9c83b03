"""``load_int8_tables`` and ``Int8VocabEmbedding`` as a plugin calls them: the defaults, a rank that
is not the last, the dtype and backend given, vLLM's attribute names, and the errors' own words
(survivors of the hooks' unsampled mutmut run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from clef_format.read.checkpoint import read_checkpoint
from clef_format.spec import layouts as L
from clef_format.spec import tables_format as TF
from clef_format.vllm import load_int8_tables, shard_range
from tests.hooks.test_hooks import EMBED, decoded, text_ck


def test_the_defaults_read_the_whole_tables_on_the_cpu_in_bf16(built: Any) -> None:
    root = text_ck(built)
    tables = load_int8_tables(read_checkpoint(root))
    embed = tables.embed
    assert embed.q.device.type == "cpu" and (embed.vocab_start, embed.vocab_end, embed.q.shape[0]) == (0, 512, 512)
    ids = torch.tensor([0, 255, 511])
    rows = embed(ids)
    assert rows.dtype == torch.bfloat16 and torch.equal(rows, decoded(root, EMBED)[ids])
    assert torch.equal(tables.rows(ids), decoded(root, L.LM_HEAD)[ids])
    # vLLM's own attribute names, which code around an embedding reads
    assert (embed.num_embeddings, embed.org_vocab_size, embed.embedding_dim) == (512, 512, 64)


def test_rank_0_of_2_holds_the_first_half_and_zeros_the_rest(built: Any) -> None:
    root = text_ck(built)
    tables = load_int8_tables(read_checkpoint(root), "cpu", tp_rank=0, tp_size=2, out_dtype=torch.float32,
                              all_reduce=lambda t: t)
    embed = tables.embed
    assert (embed.vocab_start, embed.vocab_end, embed.q.shape[0]) == (0, 256, 256)
    out = embed(torch.tensor([5, 300]))
    assert out.dtype == torch.float32
    whole = load_file(root / L.TABLES)
    from tests.support.torch_int8 import dequantize_rows

    assert torch.equal(out[0], dequantize_rows(whole[EMBED], whole[TF.scale_name(EMBED)], torch.float32)[5])
    assert not out[1].any()  # row 300 is rank 1's: zeros here, summed in by the all-reduce


@pytest.mark.parametrize("tp_size", [1, 2])
def test_the_backend_given_is_the_one_used(built: Any, tp_size: int) -> None:
    """An unknown backend is refused by the gather it is given to, in both forward paths (whole table,
    vocab shard): the module does not fall back to its default."""
    tables = load_int8_tables(read_checkpoint(text_ck(built)), "cpu", tp_rank=0, tp_size=tp_size,
                              all_reduce=lambda t: t, backend="bogus")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="backend must be one of"):
        tables.embed(torch.tensor([1]))


def test_shard_range_errors_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match=r"^tp_rank 2 outside a group of 2$"):
        shard_range(512, 2, 2)
    with pytest.raises(ValueError, match=r"^padded vocab 512 does not split evenly over 3 ranks$"):
        shard_range(512, 0, 3)


def test_a_tables_file_lacking_a_table_or_its_scale_is_named(fresh: Any, tmp_path: Path) -> None:
    root = fresh("layout-2", "bf16", num_layers=4, multimodal=False)
    path = root / L.TABLES
    tensors = load_file(path)
    scale = TF.scale_name(EMBED)
    save_file({k: v for k, v in tensors.items() if k != scale}, str(path), {"format": "pt"})
    with pytest.raises(KeyError, match=f"{L.TABLES} lacks {scale}"):
        load_int8_tables(read_checkpoint(root))
    save_file({k: v for k, v in tensors.items() if k != EMBED}, str(path), {"format": "pt"})
    with pytest.raises(KeyError, match=f"{L.TABLES} lacks {EMBED}"):
        load_int8_tables(read_checkpoint(root))
    path.unlink()
    with pytest.raises(KeyError, match=f"{L.TABLES} lacks {EMBED}"):
        load_int8_tables(read_checkpoint(root))
