"""The joint schema head: its config keys and the tensors a config implies.

The release's ``joint_head_config.json`` is
``{"hidden_size", "width", "routing_layers", "layers", "heads", "feedforward"}`` and the reference
code builds ``JointSchemaHead(**config)``. Tensor names are inferred from the module definitions
(clef-checkpoints.md): the top-level tensors are checked exactly, the layer stacks by index, so a
layer-internal naming detail can never be reported as a broken head.
"""

from __future__ import annotations

import re

from clef_format.errors import FormatError
from clef_format.records import Record

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any, Mapping

from clef_format.spec.layouts import MARKER_KEY

CONFIG_KEYS = ("hidden_size", "width", "routing_layers", "layers", "heads", "feedforward")
PROJECTIONS = ("memory", "question", "option_question", "global", "option_context", "option_lexical")
SCALARS = ("prior_logit_scale", "joint_logit_scale", "residual_gate")
STACKS = {"evidence_layers": "routing_layers", "layers": "layers"}
#: Bound on the head's layer counts: checks enumerate them (the release has 2 and 4).
MAX_LAYERS = 1024
_STACK_RE = re.compile(r"^(evidence_layers|layers)\.(\d+)\.")


class HeadConfigError(FormatError):
    pass


class HeadConfig(Record):
    hidden_size: int
    width: int
    routing_layers: int
    layers: int
    heads: int
    feedforward: int


def parse_head_config(raw: Any) -> tuple[HeadConfig, list[str]]:
    """Parse the head config; returns it and the unknown keys (the marker is not unknown)."""
    if not isinstance(raw, dict):
        raise HeadConfigError("joint head config is not a JSON object")
    missing = [k for k in CONFIG_KEYS if k not in raw]
    if missing:
        raise HeadConfigError(f"joint head config lacks {', '.join(missing)}")
    for k in CONFIG_KEYS:
        v = raw[k]
        limit = MAX_LAYERS if k in STACKS.values() else 2**31
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0 or v > limit:
            raise HeadConfigError(f"joint head config: {k} must be a positive integer up to {limit}, got {v!r}")
    unknown = sorted(k for k in raw if k not in CONFIG_KEYS and k != MARKER_KEY)
    return HeadConfig(**{k: raw[k] for k in CONFIG_KEYS}), unknown


def exact_tensors(cfg: HeadConfig) -> dict[str, tuple[int, ...]]:
    """Top-level head tensors and their shapes."""
    out: dict[str, tuple[int, ...]] = {
        "hidden_norm.weight": (cfg.hidden_size,),
        "hidden_norm.bias": (cfg.hidden_size,),
        "type_embedding.weight": (3, cfg.width),
        "field_norm.weight": (cfg.width,),
        "option_norm.weight": (cfg.width,),
    }
    for p in PROJECTIONS:
        out[f"{p}_projection.weight"] = (cfg.width, cfg.hidden_size)
    for s in SCALARS:
        out[s] = ()
    return out


def layer_tensors(width: int, feedforward: int, cross: bool) -> dict[str, tuple[int, ...]]:
    """Tensors of one torch ``nn.TransformerDecoderLayer`` (cross) or ``EncoderLayer`` of this width."""
    attn = {
        "in_proj_weight": (3 * width, width),
        "in_proj_bias": (3 * width,),
        "out_proj.weight": (width, width),
        "out_proj.bias": (width,),
    }
    out = {f"self_attn.{k}": v for k, v in attn.items()}
    if cross:
        out.update({f"multihead_attn.{k}": v for k, v in attn.items()})
    out.update({
        "linear1.weight": (feedforward, width), "linear1.bias": (feedforward,),
        "linear2.weight": (width, feedforward), "linear2.bias": (width,),
    })
    for n in range(1, 4 if cross else 3):
        out[f"norm{n}.weight"] = (width,)
        out[f"norm{n}.bias"] = (width,)
    return out


def all_tensors(cfg: HeadConfig) -> dict[str, tuple[int, ...]]:
    """The full inferred tensor set (what the fixtures write)."""
    out = exact_tensors(cfg)
    out.update({
        "field_norm.bias": (cfg.width,),
        "option_norm.bias": (cfg.width,),
        "residual_scorer.0.weight": (cfg.width, 2 * cfg.width),
        "residual_scorer.0.bias": (cfg.width,),
        "residual_scorer.3.weight": (1, cfg.width),
        "residual_scorer.3.bias": (1,),
    })
    for i in range(cfg.routing_layers):
        for k, v in layer_tensors(cfg.width, cfg.feedforward, cross=False).items():
            out[f"evidence_layers.{i}.{k}"] = v
    for i in range(cfg.layers):
        for k, v in layer_tensors(cfg.width, cfg.feedforward, cross=True).items():
            out[f"layers.{i}.{k}"] = v
    return out


def head_problems(cfg: HeadConfig, shapes: Mapping[str, tuple[int, ...]]) -> tuple[list[str], list[str]]:
    """(missing or misshapen, unexpected) against a head file's tensor shapes."""
    missing: list[str] = []
    unexpected: list[str] = []
    for name, shape in exact_tensors(cfg).items():
        if name not in shapes:
            missing.append(name)
        elif tuple(shapes[name]) != shape:
            missing.append(f"{name} (shape {list(shapes[name])}, expected {list(shape)})")
    seen: dict[str, set[int]] = {stack: set() for stack in STACKS}
    for name in shapes:
        m = _STACK_RE.match(name)
        if m:
            seen[m.group(1)].add(int(m.group(2)))
    for stack, key in STACKS.items():
        want = getattr(cfg, key)
        missing += [f"{stack}.{i}.*" for i in range(want) if i not in seen[stack]]
        unexpected += [f"{stack}.{i}.*" for i in sorted(seen[stack]) if i >= want]
    return missing, unexpected
