"""The int8 tables on a device: ``embed_tokens`` replacement and the joint head's lexical rows.

The tables stay int8 (plus one float32 scale per row) in device memory; a lookup gathers the
rows it needs and decodes only those (``clef_format.int8_gather``: fused Triton kernel on CUDA,
torch ops elsewhere), bit for bit as ``quantize.dequantize_rows`` decodes them.

Tensor parallel: like vLLM's ``VocabParallelEmbedding`` each rank holds the rows of its vocab
shard (vocab padded to a multiple of 64, split evenly), ids of other shards decode to zeros, and
an all-reduce sums the ranks' partial outputs. Exactly one rank contributes each row and the
others add +0.0, so the sum equals the unsharded decode bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

import torch

from clef_format.spec import layouts as L
from clef_format.spec import tables_format as TF
from clef_format.vllm.int8_gather import Backend, gather_rows, gather_rows_shard

if TYPE_CHECKING:
    from clef_format.read.checkpoint import Checkpoint

AllReduce = Callable[[torch.Tensor], torch.Tensor]
#: vLLM's ``DEFAULT_VOCAB_PADDING_SIZE``: shards are cut from the vocab padded to this multiple.
VOCAB_PADDING = 64


def shard_range(vocab: int, tp_rank: int, tp_size: int, padding: int = VOCAB_PADDING) -> tuple[int, int]:
    """Global rows ``[start, end)`` rank ``tp_rank`` holds, cut as ``VocabParallelEmbedding`` cuts them."""
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank {tp_rank} outside a group of {tp_size}")
    padded = -(-vocab // padding) * padding
    if padded % tp_size:
        raise ValueError(f"padded vocab {padded} does not split evenly over {tp_size} ranks")
    per = padded // tp_size
    start = min(tp_rank * per, vocab)
    return start, min(start + per, vocab)


def torch_all_reduce(t: torch.Tensor) -> torch.Tensor:
    """Sum over the default ``torch.distributed`` group (outside vLLM)."""
    torch.distributed.all_reduce(t)
    return t


class Int8VocabEmbedding(torch.nn.Module):
    """One int8 table (this rank's vocab shard) that decodes rows on gather.

    Takes the place of vLLM's ``embed_tokens`` (``forward(ids)``) and serves the joint head's
    lexical rows (``rows(ids)``). ``q`` and ``scale`` are buffers, not parameters: vLLM's loader
    has nothing to write into them and the optimizer-style ``parameters()`` walk skips them.
    """

    q: torch.Tensor  # the buffers registered in __init__
    scale: torch.Tensor

    def __init__(self, q_shard: torch.Tensor, scale_shard: torch.Tensor, num_embeddings: int,
                 vocab_start: int = 0, vocab_end: Optional[int] = None, tp_size: int = 1,
                 out_dtype: torch.dtype = torch.bfloat16, all_reduce: Optional[AllReduce] = None,
                 backend: Backend = "auto") -> None:
        super().__init__()
        vocab_end = num_embeddings if vocab_end is None else vocab_end
        if q_shard.dtype != torch.int8 or scale_shard.dtype != torch.float32:
            raise TypeError(f"need I8 rows and F32 scales, got {q_shard.dtype} and {scale_shard.dtype}")
        if q_shard.shape[0] != vocab_end - vocab_start or tuple(scale_shard.shape) != (q_shard.shape[0], 1):
            raise ValueError(f"shard [{vocab_start}, {vocab_end}) does not match rows {tuple(q_shard.shape)} "
                             f"and scales {tuple(scale_shard.shape)}")
        if tp_size == 1 and (vocab_start, vocab_end) != (0, num_embeddings):
            raise ValueError("without tensor parallelism the module holds the whole table")
        self.register_buffer("q", q_shard.contiguous(), persistent=False)
        self.register_buffer("scale", scale_shard.contiguous(), persistent=False)
        self.num_embeddings = num_embeddings  # vLLM's attribute names, for code that reads them
        self.org_vocab_size = num_embeddings
        self.embedding_dim = int(q_shard.shape[1])
        self.vocab_start, self.vocab_end = int(vocab_start), int(vocab_end)
        self.tp_size = tp_size
        self.out_dtype = out_dtype
        self.backend: Backend = backend
        self._all_reduce = all_reduce

    @classmethod
    def from_table(cls, q: torch.Tensor, scale: torch.Tensor, tp_rank: int = 0, tp_size: int = 1,
                   **kwargs: object) -> "Int8VocabEmbedding":
        """This rank's shard of a whole table (copied, so the whole table can be freed)."""
        vocab = int(q.shape[0])
        start, end = shard_range(vocab, tp_rank, tp_size)
        return cls(q[start:end].clone(), scale[start:end].clone(), vocab, start, end, tp_size, **kwargs)  # type: ignore[arg-type]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Decoded rows ``ids.shape + (hidden,)`` in ``out_dtype``; all-reduced over the TP group."""
        if self.tp_size == 1:
            return gather_rows(self.q, self.scale, ids, self.out_dtype, backend=self.backend)
        part = gather_rows_shard(self.q, self.scale, ids, self.vocab_start, self.vocab_end, self.out_dtype,
                                 backend=self.backend)
        reduce = self._all_reduce or torch_all_reduce
        return reduce(part)

    def rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Lexical rows for the joint head: the same decode as ``forward``."""
        return self.forward(token_ids)

    def extra_repr(self) -> str:
        return (f"num_embeddings={self.num_embeddings}, embedding_dim={self.embedding_dim}, "
                f"shard=[{self.vocab_start}, {self.vocab_end}), tp_size={self.tp_size}, int8")


@dataclass
class Int8Tables:
    """Both tables of a layout-2 checkpoint on a device: ``embed`` for vLLM, ``lexical`` for the head."""

    embed: Int8VocabEmbedding
    lexical: Int8VocabEmbedding

    def rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        """BF16 (the serving dtype) rows of ``lm_head`` for ``token_ids``."""
        return self.lexical.rows(token_ids)


def _read_shard(path: str, name: str, start: int, end: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``[start, end)`` of one table and its scales: only the shard is read from disk."""
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as f:
        keys = set(f.keys())
        for key in (name, TF.scale_name(name)):
            if key not in keys:
                raise KeyError(f"{L.TABLES} lacks {key}")
        q = f.get_slice(name)[start:end]
        scale = f.get_slice(TF.scale_name(name))[start:end]
    return q.to(device), scale.to(device)


def load_int8_tables(ck: "Checkpoint", device: torch.device | str = "cpu", tp_rank: int = 0, tp_size: int = 1,
                     out_dtype: torch.dtype = torch.bfloat16, all_reduce: Optional[AllReduce] = None,
                     backend: Backend = "auto") -> Int8Tables:
    """Read this rank's shard of both tables of a checked layout-2 checkpoint onto ``device``.

    Call it with a ``Checkpoint`` that ``check_checkpoint`` accepted: that is where the file's
    names, dtypes and shapes were checked against the config; here they are only read.
    """
    device = torch.device(device)
    embed_name, lm_head_name = ck.tables
    modules = []
    for name in (embed_name, lm_head_name):
        header = ck.headers.get(L.TABLES)
        if header is None or name not in header.tensors:
            raise KeyError(f"{L.TABLES} lacks {name}")
        vocab = header.tensors[name].shape[0]
        start, end = shard_range(vocab, tp_rank, tp_size)
        q, scale = _read_shard(ck.path(L.TABLES), name, start, end, device)
        modules.append(Int8VocabEmbedding(q, scale, vocab, start, end, tp_size, out_dtype=out_dtype,
                                          all_reduce=all_reduce, backend=backend))
    return Int8Tables(embed=modules[0], lexical=modules[1])
