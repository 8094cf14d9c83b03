"""Configs for the pattern tests: tiny Clef configs plus real compressed-tensors quantization configs.

Quantization configs are made with compressed-tensors' own ``QuantizationConfig`` and
``preset_name_to_scheme`` and serialized to dicts, exactly as an export writes them. The hypothesis
grammar draws targets and ignore entries from plausible patterns, including the known-bad ones.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st

from clef_format.fixtures.configs import tiny_config
from clef_format.fixtures.quant import build_quant_config

BUILDS = ("nvfp4", "fp8", "hybrid", "mixed")

#: The format each preset is exported with.
PRESET_FORMAT = {
    "FP8_DYNAMIC": "float-quantized", "FP8": "float-quantized", "FP8_BLOCK": "float-quantized",
    "NVFP4": "nvfp4-pack-quantized", "NVFP4A16": "nvfp4-pack-quantized",
    "W4A16": "pack-quantized", "W8A16": "pack-quantized", "W8A8": "int-quantized", "INT8": "int-quantized",
}
FORMATS = ("float-quantized", "nvfp4-pack-quantized", "pack-quantized", "int-quantized", "mixed-precision")

TARGETS = (
    "Linear", "linear", "re:.*", "re:.*Linear", "Column", "QKVParallelLinear", "RowParallelLinear", "LMHead",
    r"re:.*mlp.*", r"re:.*mlp\.(gate|up|down)_proj$", r"re:.*mlp\.gate_proj$", r"re:.*mlp\.up_proj$",
    r"re:.*mlp\.down_proj$", r"re:.*self_attn\.(q|k|v|o)_proj$", r"re:.*self_attn\.(q|k|v)_proj$",
    r"re:.*self_attn\.q_proj$", r"re:.*v_proj", r"re:.*o_proj$", r"re:.*in_proj_qkv", r"re:.*in_proj_qkv$",
    r"re:.*in_proj_z$", r"re:.*in_proj_(a|b)$", r"re:.*in_proj_b$", r"re:.*out_proj$", r"re:.*linear_attn.*",
    r"re:model\.language_model.*", r"re:model\.language_model\.layers\.(0|1)\..*", r"re:language_model\.model.*",
    r"re:.*layers\.(0|1)\.", r"re:.*layers\.(2|3)\..*", r"re:.*layers\.1\.mlp.*", "re:.*lm_head", "lm_head",
    "language_model.lm_head", "model.language_model.layers.0.mlp.down_proj", "model.language_model.layers.0.mlp.gate_proj",
    "model.language_model.layers.0.mlp.up_proj", "language_model.model.layers.1.mlp.down_proj",
    "model.layers.0.mlp.down_proj", "mlp.gate_up_proj", r"re:.*visual.*", r"re:visual\..*", r"re:.*attn\.qkv$",
    r"re:.*qkv_proj$", r"re:.*gate_up_proj", r"re:.*in_proj_qkvz$", "re:.*in_proj_ba",
)
IGNORES = (
    "lm_head", "language_model.lm_head", "re:.*lm_head", r"re:.*visual.*", r"re:visual.*", r"re:model\.visual.*",
    r"re:.*in_proj_a$", r"re:.*in_proj_b$", r"re:.*linear_attn\.in_proj_(a|b)$", r"re:.*in_proj_qkv",
    r"re:.*in_proj_qkv$", r"re:.*in_proj_z$", r"re:.*mlp\.gate_proj$", r"re:.*mlp\.up_proj$", r"re:.*k_proj$",
    r"re:.*self_attn.*", r"re:.*mlp\.down_proj$", r"re:.*layers\.0\..*", r"re:model\.language_model\.layers\.1\..*",
    "model.language_model.layers.0.mlp.gate_proj", "model.language_model.layers.0.mlp.up_proj",
    "model.layers.1.mlp.down_proj", "language_model.model.layers.0.mlp.gate_up_proj", r"re:.*gate_up_proj$",
    r"re:.*in_proj_qkvz", "Linear", "re:.*conv1d",
)
PRESETS = ("FP8_DYNAMIC", "NVFP4", "FP8", "W4A16", "NVFP4A16", "W8A8", "FP8_BLOCK")


def quant_dict(groups: list[tuple[str, list[str], str | None]], ignore: list[str], top_format: str | None) -> dict[str, Any]:
    """A compressed-tensors config dict from (preset, targets, group format) triples."""
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    config_groups = {}
    for i, (preset, targets, fmt) in enumerate(groups):
        scheme = preset_name_to_scheme(preset, targets)
        if fmt is not None:
            scheme.format = fmt
        config_groups[f"group_{i}"] = scheme
    qc = QuantizationConfig(config_groups=config_groups, ignore=ignore, format=top_format or "dense",
                            quantization_status="compressed")
    out = qc.model_dump(mode="json", exclude_none=True)
    if top_format is None:
        out.pop("format", None)  # an export that wrote no top-level format
    return out


def with_quant(config: dict[str, Any], quant: dict[str, Any] | None) -> dict[str, Any]:
    c = copy.deepcopy(config)
    if quant is not None:
        c["quantization_config"] = quant
    return c


def fixture_configs() -> dict[str, dict[str, Any]]:
    """The four published builds on the tiny multimodal and text-only configs."""
    out = {}
    for multimodal in (True, False):
        for n in (4, 8):
            base = tiny_config(n, multimodal=multimodal)
            for build in BUILDS:
                out[f"{build}-{'mm' if multimodal else 'text'}-{n}"] = with_quant(base, build_quant_config(build, n))
    return out


@st.composite
def model_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A tiny config: multimodal or text-only, 4 layers with any mix of attention types."""
    multimodal = draw(st.booleans())
    c = tiny_config(4, multimodal=multimodal)
    text = c["text_config"] if multimodal else c
    text["layer_types"] = draw(st.lists(st.sampled_from(["linear_attention", "full_attention"]), min_size=4, max_size=4))
    if multimodal:
        c["vision_config"]["depth"] = draw(st.integers(1, 2))
    return c


@st.composite
def quant_configs(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(1, 3))
    groups = []
    for _ in range(n):
        preset = draw(st.sampled_from(PRESETS))
        targets = draw(st.lists(st.sampled_from(TARGETS), min_size=1, max_size=3, unique=True))
        fmt = draw(st.sampled_from([PRESET_FORMAT[preset], PRESET_FORMAT[preset], None, *FORMATS[:-1]]))
        groups.append((preset, targets, fmt))
    ignore = draw(st.lists(st.sampled_from(IGNORES), max_size=4, unique=True))
    formats = {g[2] for g in groups}
    natural = formats.pop() if len(formats) == 1 else "mixed-precision"
    top = draw(st.sampled_from([natural, natural, None, *FORMATS]))
    return quant_dict(groups, ignore, top)


@st.composite
def quantized_configs(draw: st.DrawFn) -> dict[str, Any]:
    return with_quant(draw(model_configs()), draw(quant_configs()))


# ----------------------------------------------------------------------------- the scheme grammar
# Every weight / input-activation combination compressed-tensors can express that vLLM's scheme
# selection (``CompressedTensorsConfig._get_scheme_from_parts`` and the ``_is_*`` predicates it calls,
# 0.28 and 0.33) tells apart: the predicates read type, num_bits (4 / 8), strategy, group_size
# (16: NVFP4, 32: MX, any other), symmetric, dynamic (false / true / "local"), weights' scale_dtype
# (uint8: MXFP8) and actorder (0.30+ refuses group/dynamic), the effective format and whether output
# activations are static int8 per tensor. Values the predicates treat alike are represented once.

KINDS = (("int", 4), ("int", 8), ("float", 4), ("float", 8))
#: (strategy, group_size, block_structure) of weights.
W_SHAPES = (("tensor", None, None), ("channel", None, None), ("group", 32, None), ("group", 128, None),
            ("tensor_group", 16, None), ("block", None, [128, 128]))
#: (strategy, group_size, dynamic) of input activations (compressed-tensors allows these for inputs).
I_SHAPES = (("tensor", None, False), ("tensor", None, True), ("token", None, True), ("group", 128, False),
            ("group", 128, True), ("tensor_group", 16, False), ("tensor_group", 16, True),
            ("tensor_group", 16, "local"), ("group", 32, True))
#: Effective-format classes (what the predicates distinguish) and the ways a config writes each:
#: (group format, top-level format).
FORMAT_CLASSES: dict[str, tuple[tuple[str | None, str | None], ...]] = {
    "pack": ((None, "pack-quantized"), ("pack-quantized", "mixed-precision"), ("pack-quantized", None)),
    "int": ((None, "int-quantized"), ("int-quantized", "mixed-precision")),
    "act": ((None, "float-quantized"), ("float-quantized", "mixed-precision"), ("naive-quantized", None),
            (None, "nvfp4-pack-quantized"), ("nvfp4-pack-quantized", "mixed-precision")),
    "other": ((None, None), (None, "dense"), (None, "mixed-precision"), ("marlin-24", None),
              ("mxfp4-pack-quantized", "mixed-precision"), (None, "sparse-24-bitmask"), ("mxfp8-quantized", None)),
}
ACTORDERS = (None, "group", "weight", "dynamic", "static", True, False)
GRID_TARGETS = (["Linear"], ["re:.*"], ["Linear", "lm_head"], [r"re:.*_proj$", "re:.*lm_head"])


def qargs(kind: tuple[str, int], strategy: str | None, group_size: int | None = None, block: list[int] | None = None,
          symmetric: bool = True, dynamic: bool | str = False, **extra: Any) -> dict[str, Any]:
    """QuantizationArgs fields as a dict (validated when the group is built)."""
    d: dict[str, Any] = {"num_bits": kind[1], "type": kind[0], "symmetric": symmetric, "dynamic": dynamic}
    if strategy is not None:
        d["strategy"] = strategy
    if group_size is not None:
        d["group_size"] = group_size
    if block is not None:
        d["block_structure"] = block
    d.update(extra)
    return d


def weight_args() -> list[dict[str, Any]]:
    """Static and dynamic weights of every kind and shape, symmetric and not (88)."""
    out = []
    for kind in KINDS:
        for strategy, gs, block in W_SHAPES:
            for sym in (True, False):
                out.append(qargs(kind, strategy, gs, block, sym))
                if strategy in ("tensor", "group", "tensor_group"):
                    out.append(qargs(kind, strategy, gs, block, sym, True))
                if strategy == "tensor_group":
                    out.append(qargs(kind, strategy, gs, block, sym, "local"))
    return out


def input_args() -> list[dict[str, Any] | None]:
    """None (weight-only) and every kind x shape x symmetry of input activations (73)."""
    out: list[dict[str, Any] | None] = [None]
    for kind in KINDS:
        for strategy, gs, dyn in I_SHAPES:
            for sym in (True, False):
                out.append(qargs(kind, strategy, gs, None, sym, dyn))
    return out


OUTPUTS = (None, qargs(("int", 8), "tensor"), qargs(("int", 8), "tensor", dynamic=True),
           qargs(("float", 8), "tensor"), qargs(("int", 8), "tensor", symmetric=False))


def scheme_group(targets: list[str], weights: dict[str, Any], inputs: dict[str, Any] | None = None,
                 outputs: dict[str, Any] | None = None, fmt: str | None = None) -> dict[str, Any]:
    """One config group as an export writes it: compressed-tensors' ``QuantizationScheme`` serialized.

    Where compressed-tensors refuses the combination, the group is kept as written (a hand-edited
    config): vLLM then validates it itself, and the resolver must refuse it exactly when vLLM does.
    """
    import warnings

    from compressed_tensors.quantization import QuantizationScheme

    raw: dict[str, Any] = {"targets": targets, "weights": weights}
    if inputs is not None:
        raw["input_activations"] = inputs
    if outputs is not None:
        raw["output_activations"] = outputs
    if fmt is not None:
        raw["format"] = fmt
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return QuantizationScheme.model_validate(raw).model_dump(mode="json", exclude_none=True)
    except (ValueError, NotImplementedError):  # pydantic's ValidationError is a ValueError
        return copy.deepcopy(raw)


def scheme_config(groups: list[dict[str, Any]], ignore: list[str], top_format: str | None,
                  sparsity: dict[str, Any] | None = None) -> dict[str, Any]:
    """A whole ``quantization_config`` around serialized groups (the keys QuantizationConfig writes)."""
    out: dict[str, Any] = {"config_groups": {f"group_{i}": g for i, g in enumerate(groups)},
                           "quant_method": "compressed-tensors", "quantization_status": "compressed",
                           "ignore": list(ignore), "version": "0.17.0"}
    if top_format is not None:
        out["format"] = top_format
    if sparsity is not None:
        out["sparsity_config"] = sparsity
    return out


def sparsity_configs() -> list[dict[str, Any] | None]:
    """No sparsity, and compressed-tensors' 2:4 bitmask config with and without targets."""
    from compressed_tensors.config import Sparse24BitMaskConfig

    with_targets = Sparse24BitMaskConfig(targets=["Linear"], ignore=["lm_head"], sparsity_structure="2:4")
    without = Sparse24BitMaskConfig(targets=[], sparsity_structure="2:4")
    return [None, with_targets.model_dump(mode="json"), without.model_dump(mode="json")]


def _entries() -> list[tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any] | None, str]]:
    """(weights, inputs, outputs, format class) of the grid: the full product of weights x inputs x
    format classes, plus the sub-grids for the fields that matter only in a few schemes."""
    weights, inputs = weight_args(), input_args()
    out = [(w, i, None, fc) for w in weights for i in inputs for fc in FORMAT_CLASSES]
    int_w = [qargs((t, b), s, gs, None, sym) for t, b in (("int", 4), ("int", 8)) for s, gs in (("channel", None), ("group", 128))
             for sym in (True, False)]
    static_in = [qargs(("int", 8), "tensor"), qargs(("int", 8), "tensor", symmetric=False),
                 qargs(("int", 8), "token", dynamic=True), None]
    out += [(w, i, o, fc) for w in int_w for i in static_in for o in OUTPUTS[1:] for fc in ("pack", "int", "act")]
    for order in ACTORDERS:  # activation ordering: every value, on the weights where it can matter
        for w in (qargs(("int", 4), "group", 128), qargs(("int", 4), "channel"), qargs(("int", 8), "channel"),
                  qargs(("float", 4), "tensor_group", 16), qargs(("int", 4), "group", 128, symmetric=False),
                  qargs(("float", 8), "channel")):
            w = {**w, "actorder": order}
            for i in (None, qargs(("int", 8), "token", dynamic=True), qargs(("float", 8), "token", dynamic=True)):
                out += [(w, i, None, fc) for fc in ("pack", "act")]
    for scale in (None, "torch.uint8", "torch.float8_e4m3fn", "torch.bfloat16"):  # MXFP8 is told by scale_dtype
        for kind in (("float", 8), ("float", 4), ("int", 8)):
            w = qargs(kind, "group", 32, scale_dtype=scale)
            for i in (None, qargs(("float", 8), "token", dynamic=True), qargs(("float", 8), "group", 32, dynamic=True)):
                out += [(w, i, None, fc) for fc in ("pack", "act", "other")]
    return out


#: Groups compressed-tensors would not write but a hand-edited config may hold: vLLM refuses them.
INVALID_ARGS = (
    qargs(("float", 6), "tensor"), qargs(("float", 16), "channel"), qargs(("int", 8), "token"),
    qargs(("int", 4), "group"), qargs(("float", 8), "block"), qargs(("float", 4), "tensor", dynamic="local"),
    qargs(("int", 8), "channel", dynamic=True), {**qargs(("int", 8), "channel"), "bogus": 1},
    {**qargs(("int", 8), "channel"), "type": "fp"}, qargs(("int", 4), "group", 0),
    {**qargs(("int", 4), "group", 128), "actorder": "sideways"}, qargs(("int", 4), "channel", -2),
    {**qargs(("int", 8), "channel"), "scale_dtype": "torch.notatype"}, qargs(("int", 8), "tensor", 64),
)


def scheme_grid() -> list[dict[str, Any]]:
    """The exhaustive scheme grid as quantization configs (one group each), deterministic.

    Each entry's format class is written in one of its ways, its targets and ignore list cycle
    through a few shapes, and one in seven carries a 2:4 sparsity config, so that every way of
    writing meets every scheme. Invalid groups (INVALID_ARGS) close the list.
    """
    spars = sparsity_configs()
    out = []
    for n, (w, i, o, fc) in enumerate(_entries()):
        group_fmt, top = FORMAT_CLASSES[fc][n % len(FORMAT_CLASSES[fc])]
        targets = GRID_TARGETS[n % len(GRID_TARGETS)]
        ignore = [] if n % 3 else ["lm_head", "re:.*in_proj_b$", "re:.*in_proj_a$"]
        sparsity = spars[n % len(spars)] if n % 7 == 0 else None
        out.append(scheme_config([scheme_group(list(targets), w, i, o, group_fmt)], ignore, top, sparsity))
    for n, w in enumerate(INVALID_ARGS):
        for i in (None, qargs(("float", 8), "token", dynamic=True)):
            out.append(scheme_config([scheme_group(["Linear"], w, i, None, "float-quantized")], [], None))
            out.append(scheme_config([scheme_group(["Linear"], qargs(("float", 8), "channel"), w, None, None)], [],
                                     "float-quantized"))
    out.append(scheme_config([scheme_group(["Qwen3_5Attention"], qargs(("float", 8), "tensor"), None, None, None)],
                             [], "float-quantized"))  # KV-cache style group: dropped by vLLM
    return out


GRID_ARGS = weight_args()
GRID_INPUTS = input_args()


@st.composite
def scheme_groups(draw: st.DrawFn, targets: list[str]) -> dict[str, Any]:
    """One group: a compressed-tensors preset, or any grid combination (with actorder / output now and then)."""
    if draw(st.integers(0, 3)) == 0:
        preset = draw(st.sampled_from(PRESETS))
        return _preset_group(preset, targets, draw(st.sampled_from([PRESET_FORMAT[preset], None, *FORMATS[:-1]])))
    w = dict(draw(st.sampled_from(GRID_ARGS)))
    if draw(st.integers(0, 5)) == 0:
        w["actorder"] = draw(st.sampled_from(ACTORDERS))
    i = draw(st.sampled_from(GRID_INPUTS))
    o = draw(st.sampled_from(OUTPUTS)) if draw(st.integers(0, 5)) == 0 else None
    fmt = draw(st.sampled_from(FORMAT_CLASSES[draw(st.sampled_from(sorted(FORMAT_CLASSES)))]))[0]
    return scheme_group(targets, w, i, o, fmt)


def _preset_group(preset: str, targets: list[str], fmt: str | None) -> dict[str, Any]:
    from compressed_tensors.quantization import preset_name_to_scheme

    scheme = preset_name_to_scheme(preset, targets)
    if fmt is not None:
        scheme.format = fmt
    return scheme.model_dump(mode="json", exclude_none=True)


#: Fused-name targets / ignores and version-sensitive entries beyond TARGETS / IGNORES: a prefix regex
#: on one shard (``in_proj_qkv`` without ``$`` matches ``in_proj_qkvz``; ``in_proj_b`` matches
#: ``in_proj_ba``), fused names exact and as regexes, ``mtp.`` paths (mapped differently from 0.29).
FUSED_TARGETS = (r"re:.*self_attn\.qkv_proj$", "re:.*in_proj_ba$", "model.layers.0.linear_attn.in_proj_qkvz",
                 "language_model.model.layers.3.self_attn.qkv_proj", "mtp.layers.0.mlp.down_proj", "re:mtp.*")
FUSED_IGNORES = ("re:.*in_proj_b", "re:.*qkv_proj", r"re:.*self_attn\.qkv_proj$", "re:.*in_proj_ba$",
                 "model.layers.3.self_attn.qkv_proj", "language_model.model.layers.0.linear_attn.in_proj_qkvz",
                 "re:.*gate_up", "re:.*visual.*qkv", "mtp.layers.0.mlp.down_proj", "re:.*layers\\.0\\.mlp\\.gate")


@st.composite
def scheme_quant_configs(draw: st.DrawFn) -> dict[str, Any]:
    """1-3 groups from the scheme grammar, targets and ignores from the pattern grammar (fused names too)."""
    groups = []
    for _ in range(draw(st.integers(1, 3))):
        targets = draw(st.lists(st.sampled_from(TARGETS + FUSED_TARGETS), min_size=1, max_size=3, unique=True))
        groups.append(draw(scheme_groups(targets)))
    ignore = draw(st.lists(st.sampled_from(IGNORES + FUSED_IGNORES), max_size=4, unique=True))
    formats = {g.get("format") for g in groups}
    natural = formats.pop() if len(formats) == 1 else "mixed-precision"
    top = draw(st.sampled_from([natural, natural, None, *FORMATS]))
    sparsity = draw(st.sampled_from(sparsity_configs())) if draw(st.integers(0, 9)) == 0 else None
    return scheme_config(groups, ignore, top, sparsity)


@st.composite
def scheme_model_configs(draw: st.DrawFn) -> dict[str, Any]:
    return with_quant(draw(model_configs()), draw(scheme_quant_configs()))
