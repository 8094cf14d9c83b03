"""The Hugging Face tensor tree of a Clef (Qwen3.5) backbone, derived from config.json alone.

One source of truth for which modules and parameters a config implies. Linear modules are listed
separately from plain parameters because their stored tensors depend on the quantization scheme
(see ``schemes``). Checked against ``transformers``' own Qwen3.5 model in the tests.
"""

from __future__ import annotations

from functools import lru_cache

from clef_format.errors import FormatError
from clef_format.records import Record

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any, Mapping

from clef_format.spec.layouts import EMBED_TOKENS, LM_HEAD
from clef_format.spec.schemes import DEFAULT_MODEL_DTYPE, TORCH_DTYPES, ParamSpec

TEXT_PREFIX = "model.language_model"
VISION_PREFIX = "model.visual"


class ConfigError(FormatError):
    """config.json lacks a key or has a value of the wrong type."""


class LinearSpec(Record):
    name: str  # module path, e.g. model.language_model.layers.0.mlp.up_proj
    out_features: int
    in_features: int
    bias: bool = False


class TextConfig(Record):
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layer_types: tuple[str, ...]
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    attn_output_gate: bool = True
    attention_bias: bool = False  # q/k/v/o_proj of the full-attention layers carry a bias

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)


class VisionConfig(Record):
    depth: int
    hidden_size: int
    intermediate_size: int
    in_channels: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    out_hidden_size: int
    num_position_embeddings: int


class ModelConfig(Record):
    architecture: str
    text: TextConfig
    vision: VisionConfig | None
    quantization: Mapping[str, Any] | None
    dtype: str = DEFAULT_MODEL_DTYPE  # safetensors dtype of every unquantized tensor (config torch_dtype)

    @property
    def multimodal(self) -> bool:
        return self.vision is not None


#: ``Qwen3_5TextConfig.head_dim``'s default in transformers 5 (not hidden_size / num_attention_heads):
#: a config without ``head_dim`` is read with it by transformers and by vLLM, which reads transformers' config.
DEFAULT_HEAD_DIM = 256

#: Bounds no real model comes near; they keep a hostile config from making verify enumerate
#: billions of layers or compute with absurd sizes.
MAX_LAYERS = 4096
MAX_DIM = 2**31


def _int(d: Mapping[str, Any], key: str, where: str, default: int | None = None, limit: int = MAX_DIM) -> int:
    value = d.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{where}.{key} must be a positive integer, got {value!r}")
    if value > limit:
        raise ConfigError(f"{where}.{key} = {value} is over the limit of {limit}; not a real model")
    return value


def _text_config(d: Mapping[str, Any], where: str) -> TextConfig:
    n = _int(d, "num_hidden_layers", where, limit=MAX_LAYERS)
    layer_types = d.get("layer_types")
    if layer_types is None:  # as transformers: full_attention_interval is read only without layer_types
        interval = _int(d, "full_attention_interval", where, 4)
        layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    if (
        not isinstance(layer_types, list)
        or len(layer_types) != n
        or any(t not in ("linear_attention", "full_attention") for t in layer_types)
    ):
        raise ConfigError(f"{where}.layer_types must list 'linear_attention'/'full_attention' for each of {n} layers")
    hidden = _int(d, "hidden_size", where)
    heads = _int(d, "num_attention_heads", where)
    return TextConfig(
        vocab_size=_int(d, "vocab_size", where),
        hidden_size=hidden,
        intermediate_size=_int(d, "intermediate_size", where),
        layer_types=tuple(layer_types),
        num_attention_heads=heads,
        num_key_value_heads=_int(d, "num_key_value_heads", where),
        head_dim=_int(d, "head_dim", where, DEFAULT_HEAD_DIM),
        linear_num_key_heads=_int(d, "linear_num_key_heads", where),
        linear_num_value_heads=_int(d, "linear_num_value_heads", where),
        linear_key_head_dim=_int(d, "linear_key_head_dim", where),
        linear_value_head_dim=_int(d, "linear_value_head_dim", where),
        linear_conv_kernel_dim=_int(d, "linear_conv_kernel_dim", where),
        # not a field of transformers' config (kept untyped); vLLM sizes q_proj by 1 + attn_output_gate
        attn_output_gate=_bool(d, "attn_output_gate", where, True),
        attention_bias=_bool(d, "attention_bias", where),
    )


def _bool(d: Mapping[str, Any], key: str, where: str, default: bool = False) -> bool:
    value = d.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key} must be true or false, got {value!r}")
    return value


def _vision_config(d: Mapping[str, Any]) -> VisionConfig:
    w = "vision_config"
    return VisionConfig(
        depth=_int(d, "depth", w, limit=MAX_LAYERS),
        hidden_size=_int(d, "hidden_size", w),
        intermediate_size=_int(d, "intermediate_size", w),
        in_channels=_int(d, "in_channels", w, 3),
        patch_size=_int(d, "patch_size", w),
        temporal_patch_size=_int(d, "temporal_patch_size", w, 2),
        spatial_merge_size=_int(d, "spatial_merge_size", w, 2),
        out_hidden_size=_int(d, "out_hidden_size", w),
        num_position_embeddings=_int(d, "num_position_embeddings", w),
    )


def quantization_config(config: dict) -> Any:
    """The quantization config where vLLM finds it (``get_quant_config`` and ``ModelConfig``'s
    normalization, 0.28 and 0.33): ``quantization_config``, else the text config's (vision models keep it
    there), else ``compression_config`` (compressed-tensors' own key); its ``quant_method`` as vLLM
    normalizes it (lower case, ``compressed_tensors`` -> ``compressed-tensors``)."""
    quant = config.get("quantization_config")
    text = config.get("text_config")
    if quant is None and isinstance(text, dict):
        quant = text.get("quantization_config")
    if quant is None:
        quant = config.get("compression_config")
    if isinstance(quant, dict) and isinstance(quant.get("quant_method"), str):
        method = quant["quant_method"].lower().replace("compressed_tensors", "compressed-tensors")
        quant = {**quant, "quant_method": method}
    return quant


def parse_config(config: Any) -> ModelConfig:
    """Read the parts of config.json that shape the tensor tree; raise ``ConfigError`` if unusable."""
    if not isinstance(config, dict):
        raise ConfigError("config.json is not a JSON object")
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise ConfigError("config.json: architectures must be a non-empty list of names")
    arch = archs[0]
    quant = quantization_config(config)
    if quant is not None and not isinstance(quant, dict):
        raise ConfigError("config.json: quantization_config must be an object")
    if "text_config" in config:
        if not isinstance(config["text_config"], dict):
            raise ConfigError("config.json: text_config must be an object")
        text = _text_config(config["text_config"], "text_config")
        vision_raw = config.get("vision_config")
        if "vision_config" in config and not isinstance(vision_raw, dict):
            # null too: transformers then builds its default vision tower, which no Clef checkpoint stores
            raise ConfigError("config.json: vision_config must be an object (leave it out for a text-only model)")
        vision = _vision_config(vision_raw) if vision_raw is not None else None
    else:
        text = _text_config(config, "config")
        vision = None
    return ModelConfig(arch, text, vision, quant, _model_dtype(config))


#: Model dtypes a Clef backbone may be stored in.
MODEL_DTYPES = ("BF16", "F16", "F32")


#: The keys that name the model dtype, in the order transformers 5 reads them: ``dtype`` wins over the
#: legacy ``torch_dtype`` when both are given ("If both are provided, keep `dtype`").
DTYPE_KEYS = ("dtype", "torch_dtype")


def dtype_key(config: Mapping[str, Any]) -> str:
    """The dotted config.json key whose value is the model dtype (``_model_dtype``'s), ``torch_dtype`` when
    none is given: the key a fix must edit for the edit to change the dtype."""
    for where in ("config", "text_config"):
        d = config if where == "config" else config.get(where)
        if isinstance(d, dict):
            for key in DTYPE_KEYS:
                if d.get(key) is not None:
                    return key if where == "config" else f"{where}.{key}"
    return "torch_dtype"


def _model_dtype(config: Mapping[str, Any]) -> str:
    """The dtype of the unquantized tensors: ``dtype`` or ``torch_dtype`` (``DTYPE_KEYS``) at the top
    level or in ``text_config``; BF16 when none is given. Every such key present (``vision_config``'s
    too) must name a float dtype or be null: transformers resolves a string as a torch attribute."""
    found = None
    for where in ("config", "text_config", "vision_config"):
        d = config if where == "config" else config.get(where)
        if not isinstance(d, dict):
            continue
        for key in DTYPE_KEYS:
            if key in d and d[key] is not None:
                value = d[key]
                # getattr(torch, value): "bfloat16" is torch's attribute, "torch.bfloat16" is none (AttributeError)
                plain = isinstance(value, str) and not value.startswith("torch.")
                mapped = TORCH_DTYPES.get(value) if plain else None
                if mapped not in MODEL_DTYPES:
                    raise ConfigError(f"{where}.{key} = {value!r} is not a float dtype (bfloat16, float16, float32)")
                if found is None and where != "vision_config":
                    found = mapped
    return found or DEFAULT_MODEL_DTYPE


def text_prefix(cfg: ModelConfig) -> str:
    """The HF prefix of the language model: multimodal checkpoints nest it, text-only ones do not."""
    return TEXT_PREFIX if cfg.multimodal else "model"


def table_names(cfg: ModelConfig) -> tuple[str, str]:
    """HF names of (embed_tokens, lm_head) for this config."""
    if cfg.multimodal:
        return EMBED_TOKENS, LM_HEAD
    return "model.embed_tokens.weight", LM_HEAD


def layer_prefix(cfg: ModelConfig, i: int) -> str:
    return f"{text_prefix(cfg)}.layers.{i}"


def kv_cache_params(cfg: ModelConfig) -> dict[str, ParamSpec]:
    """The KV-cache scales compressed-tensors stores when ``quantization_config.kv_cache_scheme`` is set:
    ``self_attn.k_scale`` / ``v_scale`` (``k_zero_point`` / ``v_zero_point`` when asymmetric) on every
    full-attention layer (the linear-attention layers hold no KV cache), one scale per tensor. vLLM's
    ``QuantizationConfig.get_cache_scale_mapper`` (0.28 and 0.33) renames ``.self_attn.k_scale`` to
    ``.self_attn.attn.k_scale``, the scale of the layer's ``Attention``, and loads it."""
    kv = (cfg.quantization or {}).get("kv_cache_scheme")
    if not isinstance(kv, dict) or not kv:
        return {}
    scale = ParamSpec(tuple(dict.fromkeys(("F32", cfg.dtype))), ((1,), ()))
    names = ["k_scale", "v_scale"]
    if kv.get("symmetric", True) is False:
        names += ["k_zero_point", "v_zero_point"]
    out: dict[str, ParamSpec] = {}
    for i, kind in enumerate(cfg.text.layer_types):
        if kind == "full_attention":
            out.update({f"{layer_prefix(cfg, i)}.self_attn.{n}": scale for n in names})
    return out


def unscheduled_kv_scales(cfg: ModelConfig) -> list[str]:
    """The ``self_attn.k_scale`` / ``v_scale`` names vLLM loads from a compressed-tensors checkpoint whose
    config has no ``kv_cache_scheme``: ``CompressedTensorsConfig.get_quant_method`` gives every
    ``Attention`` a ``CompressedTensorsKVCacheMethod`` whatever ``kv_cache_scheme`` says (its validator
    returns on None; vLLM 0.28 and 0.33), whose ``create_weights`` makes the ``k_scale`` / ``v_scale``
    parameters the cache-scale mapper loads into. Empty when there is a scheme (``kv_cache_params``)."""
    quant = cfg.quantization or {}
    if quant.get("quant_method") != "compressed-tensors" or kv_cache_params(cfg):
        return []
    return [f"{layer_prefix(cfg, i)}.self_attn.{n}" for i, kind in enumerate(cfg.text.layer_types)
            if kind == "full_attention" for n in ("k_scale", "v_scale")]


def linear_modules(cfg: ModelConfig) -> list[LinearSpec]:
    """Every Linear module of the backbone (HF names, unfused), in model order."""
    return list(_linear_modules(cfg.text, cfg.vision))


@lru_cache(maxsize=16)
def _linear_modules(t: TextConfig, vision: VisionConfig | None) -> tuple[LinearSpec, ...]:
    """Cached by shape alone: verify's checks all walk the same tree."""
    cfg = ModelConfig("", t, vision, None)
    h = t.hidden_size
    out: list[LinearSpec] = []
    if cfg.vision is not None:
        v = cfg.vision
        for b in range(v.depth):
            p = f"{VISION_PREFIX}.blocks.{b}"
            out += [
                LinearSpec(f"{p}.attn.qkv", 3 * v.hidden_size, v.hidden_size, True),
                LinearSpec(f"{p}.attn.proj", v.hidden_size, v.hidden_size, True),
                LinearSpec(f"{p}.mlp.linear_fc1", v.intermediate_size, v.hidden_size, True),
                LinearSpec(f"{p}.mlp.linear_fc2", v.hidden_size, v.intermediate_size, True),
            ]
        merged = v.hidden_size * v.spatial_merge_size**2
        out += [
            LinearSpec(f"{VISION_PREFIX}.merger.linear_fc1", merged, merged, True),
            LinearSpec(f"{VISION_PREFIX}.merger.linear_fc2", v.out_hidden_size, merged, True),
        ]
    key_dim = t.linear_num_key_heads * t.linear_key_head_dim
    value_dim = t.linear_num_value_heads * t.linear_value_head_dim
    q_out = t.num_attention_heads * t.head_dim * (2 if t.attn_output_gate else 1)
    kv_out = t.num_key_value_heads * t.head_dim
    for i, kind in enumerate(t.layer_types):
        p = layer_prefix(cfg, i)
        if kind == "linear_attention":
            a = f"{p}.linear_attn"
            out += [
                LinearSpec(f"{a}.in_proj_qkv", 2 * key_dim + value_dim, h),
                LinearSpec(f"{a}.in_proj_z", value_dim, h),
                LinearSpec(f"{a}.in_proj_b", t.linear_num_value_heads, h),
                LinearSpec(f"{a}.in_proj_a", t.linear_num_value_heads, h),
                LinearSpec(f"{a}.out_proj", h, value_dim),
            ]
        else:
            a = f"{p}.self_attn"
            bias = t.attention_bias
            out += [
                LinearSpec(f"{a}.q_proj", q_out, h, bias),
                LinearSpec(f"{a}.k_proj", kv_out, h, bias),
                LinearSpec(f"{a}.v_proj", kv_out, h, bias),
                LinearSpec(f"{a}.o_proj", h, t.num_attention_heads * t.head_dim, bias),
            ]
        out += [
            LinearSpec(f"{p}.mlp.gate_proj", t.intermediate_size, h),
            LinearSpec(f"{p}.mlp.up_proj", t.intermediate_size, h),
            LinearSpec(f"{p}.mlp.down_proj", h, t.intermediate_size),
        ]
    return tuple(out)


def plain_params(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every non-Linear, non-table parameter of the backbone (HF names) with its shape."""
    t = cfg.text
    h = t.hidden_size
    out: dict[str, tuple[int, ...]] = {}
    if cfg.vision is not None:
        v = cfg.vision
        vp = VISION_PREFIX
        out[f"{vp}.patch_embed.proj.weight"] = (
            v.hidden_size, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size,
        )
        out[f"{vp}.patch_embed.proj.bias"] = (v.hidden_size,)
        out[f"{vp}.pos_embed.weight"] = (v.num_position_embeddings, v.hidden_size)
        for b in range(v.depth):
            for norm in ("norm1", "norm2"):
                out[f"{vp}.blocks.{b}.{norm}.weight"] = (v.hidden_size,)
                out[f"{vp}.blocks.{b}.{norm}.bias"] = (v.hidden_size,)
        out[f"{vp}.merger.norm.weight"] = (v.hidden_size,)
        out[f"{vp}.merger.norm.bias"] = (v.hidden_size,)
    conv_dim = 2 * t.linear_num_key_heads * t.linear_key_head_dim + t.linear_num_value_heads * t.linear_value_head_dim
    for i, kind in enumerate(t.layer_types):
        p = layer_prefix(cfg, i)
        if kind == "linear_attention":
            a = f"{p}.linear_attn"
            out[f"{a}.dt_bias"] = (t.linear_num_value_heads,)
            out[f"{a}.A_log"] = (t.linear_num_value_heads,)
            out[f"{a}.conv1d.weight"] = (conv_dim, 1, t.linear_conv_kernel_dim)
            out[f"{a}.norm.weight"] = (t.linear_value_head_dim,)
        else:
            out[f"{p}.self_attn.q_norm.weight"] = (t.head_dim,)
            out[f"{p}.self_attn.k_norm.weight"] = (t.head_dim,)
        out[f"{p}.input_layernorm.weight"] = (h,)
        out[f"{p}.post_attention_layernorm.weight"] = (h,)
    out[f"{text_prefix(cfg)}.norm.weight"] = (h,)
    return out


def table_shape(cfg: ModelConfig) -> tuple[int, int]:
    return (cfg.text.vocab_size, cfg.text.hidden_size)
