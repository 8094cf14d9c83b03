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
