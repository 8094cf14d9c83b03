"""The transformers reference: the same checkpoint run by transformers' own Qwen3.5 classes.

The backbone comes from the checkpoint's safetensors (FP8 W8A8 weights decoded as
``weight * weight_scale``); the two tables are passed in: the int8 tables decoded (what the
plugin serves) or the BF16 originals they were made from. Loading is strict: every parameter of
the transformers model must come from the file or the tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from clef_format.spec import layouts as L


@dataclass
class Run:
    hidden: list[torch.Tensor]  # per prompt [T, hidden]: the final (normed) hidden states, bfloat16
    logprobs: list[torch.Tensor]  # per prompt [T, vocab]: log_softmax of the logits in float32


def _state_dict(root: Path, tables: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    sd = load_file(root / L.BACKBONE_SINGLE)
    for name in [n for n in sd if n.endswith(".weight_scale")]:
        base = name[: -len("_scale")]
        sd[base] = (sd[base].float() * sd.pop(name).float()).to(torch.bfloat16)
    sd.update(tables)
    return sd


def model(root: Path, tables: dict[str, torch.Tensor], dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    """transformers' class for the checkpoint, every parameter from the file (strict), in ``dtype``."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(root))
    cls = getattr(transformers, config.architectures[0])
    m = cls._from_config(config, dtype=torch.bfloat16)
    missing, unexpected = m.load_state_dict(_state_dict(root, tables), strict=False)
    if missing or unexpected:
        raise AssertionError(f"reference load: missing {missing}, unexpected {unexpected}")
    return m.to(dtype).eval()


def run(root: Path, tables: dict[str, torch.Tensor], prompts: list[list[int]],
        dtype: torch.dtype = torch.bfloat16) -> Run:
    """Final hidden states and log-probs of every prompt position, computed in ``dtype``."""
    m = model(root, tables, dtype)
    text = m.model.language_model if hasattr(m.model, "language_model") else m.model
    hidden, logprobs = [], []
    with torch.no_grad():
        for ids in prompts:
            h = text(input_ids=torch.tensor([ids])).last_hidden_state[0]
            hidden.append(h.float())
            logprobs.append(torch.log_softmax(m.lm_head(h).float(), dim=-1))
    return Run(hidden, logprobs)


@dataclass
class Reference:
    """The same weights run twice: in float32 (the yardstick) and in bfloat16 (what bf16 noise is)."""

    fp32: Run
    bf16: Run


def reference(root: Path, tables: dict[str, torch.Tensor], prompts: list[list[int]]) -> Reference:
    return Reference(run(root, tables, prompts, torch.float32), run(root, tables, prompts, torch.bfloat16))


def rel_err(x: torch.Tensor, y: torch.Tensor) -> float:
    """``|x - y| / |y|`` (Frobenius norms) of two [T, hidden] tensors."""
    return float((x.float() - y.float()).norm() / y.float().norm())


def served_logprobs(result: dict) -> list[tuple[int, int, float]]:
    """(position, token, log-prob) of every prompt log-prob vLLM returned (top-k plus the prompt's
    own next token), position p being the prediction made after tokens [0, p)."""
    out = []
    for pos, entries in enumerate(result["prompt_logprobs"]):
        if entries is None:
            continue
        out.extend((pos, int(tok), lp) for tok, lp in entries.items())
    return out


def logprob_gap(entries: list[tuple[int, int, float]], run: Run, prompt: int) -> float:
    """Largest |served - reference| over the served entries of one prompt."""
    lp = run.logprobs[prompt]
    return max(abs(v - float(lp[pos - 1, tok])) for pos, tok, v in entries)


def reference_gap(a: Run, b: Run, entries: list[tuple[int, int, float]], prompt: int) -> float:
    """Largest |a - b| of two reference runs at the served entries of one prompt."""
    return max(abs(float(a.logprobs[prompt][pos - 1, tok]) - float(b.logprobs[prompt][pos - 1, tok]))
               for pos, tok, _ in entries)
