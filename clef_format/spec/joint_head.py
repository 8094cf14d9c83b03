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


#: The dtype of every head tensor in the release (122 BF16 tensors).
HEAD_DTYPE = "BF16"
#: Top-level norms whose parameter names the reference does not state: they must match each other.
SIBLING_NORMS = ("field_norm", "option_norm")
#: The residual scorer's stated tensors (shapes inferred: checked for consistency, not against numbers).
SCORER = ("residual_scorer.0.weight", "residual_scorer.0.bias", "residual_scorer.3.weight", "residual_scorer.3.bias")


class HeadProblem(Record):
    kind: str  # "missing", "shape" (shape or dtype), "unexpected", or "config" (config_problems: tensor is the key)
    tensor: str
    message: str


def _describe(info: tuple[str, tuple[int, ...]]) -> str:
    return f"{info[0]}{list(info[1])}"


def head_problems(cfg: HeadConfig, tensors: Mapping[str, tuple[str, tuple[int, ...]]]) -> list[HeadProblem]:
    """Every difference between a head file (name -> (dtype, shape)) and what its config implies:
    ``inferred_problems`` + ``stack_problems`` + ``dtype_problems``."""
    out = inferred_problems(cfg, tensors) + stack_problems(cfg, tensors)
    reported = {p.tensor for p in out}
    return out + [p for p in dtype_problems(tensors) if p.tensor not in reported]


def dtype_problems(tensors: Mapping[str, tuple[str, tuple[int, ...]]]) -> list[HeadProblem]:
    """A fact: every head tensor of the release is BF16."""
    return [HeadProblem("shape", name, f"{name} is {dtype}; every head tensor of the release is {HEAD_DTYPE}")
            for name, (dtype, _) in sorted(tensors.items()) if dtype != HEAD_DTYPE]


def inferred_problems(cfg: HeadConfig, tensors: Mapping[str, tuple[str, tuple[int, ...]]]) -> list[HeadProblem]:
    """Differences from the names this project infers (not published): only ever a note.

    The top-level names and shapes of ``exact_tensors``, the residual scorer's names and chained shapes,
    ``field_norm`` and ``option_norm`` holding the same parameters of the width, no other top-level
    tensor. The layer stacks are left to ``stack_problems`` and ``torch_layer_problems`` (facts).
    """
    out: list[HeadProblem] = []
    exact = exact_tensors(cfg)
    for name, shape in exact.items():
        if name not in tensors:
            out.append(HeadProblem("missing", name, f"lacks {name}"))
        elif tuple(tensors[name][1]) != shape:
            out.append(HeadProblem("shape", name, f"{name} is {_describe(tensors[name])}, expected {HEAD_DTYPE}{list(shape)}"))
    for name in SCORER:
        if name not in tensors:
            out.append(HeadProblem("missing", name, f"lacks {name}"))
    if all(n in tensors for n in SCORER):
        w0, b0, w3, b3 = (tuple(tensors[n][1]) for n in SCORER)
        if len(w0) != 2 or w0[1] % cfg.width:
            out.append(HeadProblem("shape", SCORER[0], f"{SCORER[0]} is {list(w0)}: expected [n, k x width {cfg.width}]"))
        elif b0 != (w0[0],):
            out.append(HeadProblem("shape", SCORER[1], f"{SCORER[1]} is {list(b0)}, its weight has {w0[0]} rows"))
        if len(w0) == 2 and (len(w3) != 2 or w3[1] != w0[0]):
            out.append(HeadProblem("shape", SCORER[2], f"{SCORER[2]} is {list(w3)}: expected [m, {w0[0]}] "
                                   f"(the output of residual_scorer.0)"))
        elif len(w3) == 2 and b3 != (w3[0],):
            out.append(HeadProblem("shape", SCORER[3], f"{SCORER[3]} is {list(b3)}, its weight has {w3[0]} rows"))
    norms = {n: {k.split(".", 1)[1]: tensors[k] for k in tensors if k.startswith(n + ".")} for n in SIBLING_NORMS}
    if "weight" in norms[SIBLING_NORMS[0]] and "weight" in norms[SIBLING_NORMS[1]]:
        a, b = SIBLING_NORMS
        for p in sorted(set(norms[a]) | set(norms[b])):
            if p not in norms[a] or p not in norms[b]:
                holder, lacking = (b, a) if p not in norms[a] else (a, b)
                if p in ("weight", "bias"):  # a norm's own parameters: the sibling without it lost it
                    out.append(HeadProblem("missing", f"{lacking}.{p}", f"{lacking} lacks {p}, which its sibling "
                                           f"{holder} holds"))
                else:
                    out.append(HeadProblem("unexpected", f"{holder}.{p}", f"{holder} holds {p}, which its sibling "
                                           f"{lacking} does not (a norm holds weight and bias)"))
            elif norms[a][p] != norms[b][p]:
                out.append(HeadProblem("shape", f"{a}.{p}", f"{a}.{p} is {_describe(norms[a][p])} but {b}.{p} is "
                                       f"{_describe(norms[b][p])}"))
    for norm, params in norms.items():
        for p, info in params.items():
            if f"{norm}.{p}" not in exact and tuple(info[1]) != (cfg.width,):
                out.append(HeadProblem("shape", f"{norm}.{p}", f"{norm}.{p} is {_describe(info)}, expected [{cfg.width}]"))
    known = set(exact) | set(SCORER)
    for name in sorted(tensors):
        top = name.split(".", 1)[0]
        if name in known or top in SIBLING_NORMS or _STACK_RE.match(name):
            continue
        out.append(HeadProblem("unexpected", name, f"holds {name}, which no JointSchemaHead defines"))
    return out


#: The published figures of the release's ``joint_head.safetensors`` (clef-checkpoints.md): at this config
#: the head file holds this many tensors, all BF16, in a file of this many bytes (header included).
RELEASE_CONFIG = {"hidden_size": 4096, "width": 1024, "routing_layers": 2, "layers": 4, "heads": 16, "feedforward": 4096}
RELEASE_TENSORS = 122
RELEASE_FILE_BYTES = 243_538_016


def torch_layer_problems(cfg: HeadConfig, tensors: Mapping[str, tuple[str, tuple[int, ...]]]) -> list[HeadProblem]:
    """A fact wherever a stack layer uses torch's own parameter names (``self_attn.in_proj_weight``,
    ``linear1.weight``, ``norm2.bias``...): torch's ``nn.TransformerEncoderLayer`` / ``DecoderLayer`` of
    ``d_model=width, dim_feedforward=feedforward`` gives that name exactly this shape, and cannot load
    another (``load_state_dict`` refuses a shape mismatch)."""
    torch_shapes = layer_tensors(cfg.width, cfg.feedforward, cross=True)
    out: list[HeadProblem] = []
    for name, info in sorted(tensors.items()):
        m = _STACK_RE.match(name)
        if not m:
            continue
        want = torch_shapes.get(name[m.end():])
        if want is not None and tuple(info[1]) != want:
            out.append(HeadProblem("shape", name, f"{name} is {_describe(info)}: torch's transformer layer of width "
                                   f"{cfg.width} and feedforward {cfg.feedforward} holds {HEAD_DTYPE}{list(want)}"))
    return out


def config_problems(cfg: HeadConfig, tensors: Mapping[str, tuple[str, tuple[int, ...]]]) -> list[HeadProblem]:
    """What the config says that its own values or the tensors contradict, whatever the layers' inner names.

    * ``heads`` must divide ``width``: multi-head attention splits the width into ``heads`` equal heads
      (torch's ``nn.MultiheadAttention`` asserts ``embed_dim % num_heads == 0``).
    * every layer of both stacks holds a matrix with the ``feedforward`` width as one dimension: a
      transformer layer's feed-forward block maps ``width -> feedforward -> width`` (``linear1`` /
      ``linear2`` in torch's layers), whatever its tensors are named. Skipped when feedforward equals width.
    ``tensor`` of each problem is the config key.
    """
    out: list[HeadProblem] = []
    if cfg.width % cfg.heads:
        out.append(HeadProblem("config", "heads", f"heads {cfg.heads} does not divide width {cfg.width}: multi-head "
                               "attention splits the width into equal heads (JointSchemaHead(**config) fails)"))
    if cfg.feedforward != cfg.width:
        layers: dict[str, list[tuple[int, ...]]] = {}
        for name, (_, shape) in tensors.items():
            m = _STACK_RE.match(name)
            if m and len(shape) == 2:
                layers.setdefault(name[: m.end()], []).append(tuple(shape))
        lacking = sorted(layer.rstrip(".") for layer, shapes in layers.items()
                         if not any(cfg.feedforward in s for s in shapes))
        if lacking:
            seen = sorted({d for layer in lacking for s in layers[layer + "."] for d in s} - {cfg.width})
            out.append(HeadProblem("config", "feedforward", f"feedforward {cfg.feedforward} is no dimension of any "
                                   f"matrix of {', '.join(lacking[:4])}{' ...' if len(lacking) > 4 else ''} "
                                   f"(their widths other than {cfg.width}: {seen}): the layers' feed-forward blocks "
                                   "have another width"))
    return out


def feedforward_of(tensors: Mapping[str, tuple[str, tuple[int, ...]]]) -> int | None:
    """The feed-forward width the layers store, where they use torch's names (``linear1.weight`` rows,
    the same in every layer of both stacks): the value a ``feedforward`` fix sets. None otherwise."""
    rows = {tuple(shape)[0] for name, (_, shape) in tensors.items()
            if _STACK_RE.match(name) and name.endswith(".linear1.weight") and len(shape) == 2}
    return rows.pop() if len(rows) == 1 else None


def stack_problems(cfg: HeadConfig, tensors: Mapping[str, tuple[str, tuple[int, ...]]]) -> list[HeadProblem]:
    """Facts of the stacks: ``routing_layers`` / ``layers`` layers, each holding what its siblings hold
    (names, dtypes, shapes; the odd one out is reported, a tie broken by torch's layer)."""
    out: list[HeadProblem] = []
    layers: dict[str, dict[int, dict[str, tuple[str, tuple[int, ...]]]]] = {stack: {} for stack in STACKS}
    for name, info in tensors.items():
        m = _STACK_RE.match(name)
        if m:
            layers[m.group(1)].setdefault(int(m.group(2)), {})[name[m.end():]] = (info[0], tuple(info[1]))
    for stack, key in STACKS.items():
        want = getattr(cfg, key)
        seen = layers[stack]
        out += [HeadProblem("missing", f"{stack}.{i}", f"lacks layer {stack}.{i} (config {key} = {want})")
                for i in range(want) if i not in seen]
        out += [HeadProblem("unexpected", f"{stack}.{i}", f"holds layer {stack}.{i}, beyond config {key} = {want}")
                for i in sorted(seen) if i >= want]
        present = [i for i in range(want) if i in seen]
        if len(present) < 2:
            continue
        inferred = layer_tensors(cfg.width, cfg.feedforward, cross=stack == "layers")
        for rel in sorted({r for i in present for r in seen[i]}):
            holders = [i for i in present if rel in seen[i]]
            if len(holders) * 2 > len(present) or (len(holders) * 2 == len(present) and rel in inferred):
                out += [HeadProblem("missing", f"{stack}.{i}.{rel}", f"{stack}.{i} lacks {rel}, which its sibling "
                                    f"layers hold") for i in present if i not in holders]
            else:
                out += [HeadProblem("unexpected", f"{stack}.{i}.{rel}", f"{stack}.{i} holds {rel}, which its sibling "
                                    f"layers do not") for i in holders]
                continue
            votes: dict[tuple[str, tuple[int, ...]], list[int]] = {}
            for i in holders:
                votes.setdefault(seen[i][rel], []).append(i)
            if len(votes) < 2:
                continue
            ranked = sorted(votes.items(), key=lambda kv: (-len(kv[1]), kv[0] != (HEAD_DTYPE, inferred.get(rel))))
            majority = ranked[0][0]
            for sig, idx in ranked[1:]:
                for i in idx:
                    out.append(HeadProblem("shape", f"{stack}.{i}.{rel}", f"{stack}.{i}.{rel} is {_describe(sig)}, its "
                                           f"sibling layers hold {_describe(majority)}"))
    return out
