"""model_spec derives exactly the tensor tree transformers' own Qwen3.5 builds for a config."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration, Qwen3_5TextConfig

from clef_format.fixtures.configs import full_config, tiny_config
from clef_format.spec.model_spec import (
    ConfigError,
    linear_modules,
    parse_config,
    plain_params,
    table_names,
    table_shape,
)
from clef_format.spec.schemes import group_signature


def _spec_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    return {k: shape for k, (shape, _) in _spec_tree(config).items()}


def _spec_tree(config: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) of the unquantized model, from the spec alone (the signature of an
    unquantized Linear, the model's biases, its plain parameters and tables, all in the model dtype)."""
    cfg = parse_config(config)
    out = {k: (v, cfg.dtype) for k, v in plain_params(cfg).items()}
    for m in linear_modules(cfg):
        for suffix, p in group_signature(None, None, None, None, m.out_features, m.in_features, cfg.dtype).items():
            (shape,) = p.shapes
            (dtype,) = p.dtypes
            out[f"{m.name}.{suffix}"] = (shape, dtype)
        if m.bias:
            out[f"{m.name}.bias"] = ((m.out_features,), cfg.dtype)
    for name in table_names(cfg):
        out[name] = (table_shape(cfg), cfg.dtype)
    return out


_ST = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


def _transformers_tree(model: torch.nn.Module) -> dict[str, tuple[tuple[int, ...], str]]:
    return {k: (tuple(v.shape), _ST[v.dtype]) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("layers, dtype", [(4, "bfloat16"), (8, "bfloat16"), (4, "float16"), (4, "float32")])
def test_multimodal_tree_matches_transformers(layers, dtype):
    """Names, shapes and dtypes: the spec equals transformers' own state_dict, vision tower included."""
    config = tiny_config(layers)
    config["torch_dtype"] = dtype
    hf = Qwen3_5Config(text_config=config["text_config"], vision_config=config["vision_config"])
    with torch.device("meta"):
        model = Qwen3_5ForConditionalGeneration._from_config(hf, dtype=getattr(torch, dtype))
    assert _spec_tree(config) == _transformers_tree(model)


def test_attention_bias_matches_transformers():
    config = tiny_config(4)
    config["text_config"]["attention_bias"] = True
    hf = Qwen3_5Config(text_config=config["text_config"], vision_config=config["vision_config"])
    with torch.device("meta"):
        model = Qwen3_5ForConditionalGeneration._from_config(hf, dtype=torch.bfloat16)
    tree = _spec_tree(config)
    assert "model.language_model.layers.3.self_attn.q_proj.bias" in tree
    assert tree == _transformers_tree(model)


def test_text_only_tree_matches_transformers():
    config = tiny_config(4, multimodal=False)
    with torch.device("meta"):
        model = Qwen3_5ForCausalLM._from_config(
            Qwen3_5TextConfig(**{k: v for k, v in config.items() if k != "architectures"}), dtype=torch.bfloat16)
    assert _spec_tree(config) == _transformers_tree(model)


def test_the_model_dtype_comes_from_the_config():
    config = tiny_config(4)
    assert parse_config(config).dtype == "BF16"
    config.pop("torch_dtype")
    config["text_config"]["dtype"] = "float32"
    assert parse_config(config).dtype == "F32"
    config["text_config"]["dtype"] = "int8"
    with pytest.raises(ConfigError):
        parse_config(config)


def test_full_size_counts_match_the_published_parameter_counts():
    cfg = parse_config(full_config())
    shapes = _spec_shapes(full_config())

    def count(pred):
        total = 0
        for name, shape in shapes.items():
            if pred(name):
                n = 1
                for d in shape:
                    n *= d
                total += n
        return total

    assert count(lambda n: n == "model.language_model.embed_tokens.weight") == 1_017_118_720
    assert count(lambda n: n == "lm_head.weight") == 1_017_118_720
    assert count(lambda n: n.startswith("model.language_model.") and "embed_tokens" not in n) == 6_919_565_824
    assert cfg.text.layer_types[3] == "full_attention" and cfg.text.num_layers == 32


@pytest.mark.parametrize("mutate", [
    lambda c: c.pop("architectures"),
    lambda c: c["text_config"].update(hidden_size="4096"),
    lambda c: c["text_config"].update(layer_types=["full_attention"]),
    lambda c: c["text_config"].update(num_hidden_layers=-1),
    lambda c: c.update(text_config=[]),
    lambda c: c.update(quantization_config="fp8"),
])
def test_bad_configs_raise_config_error(mutate):
    config = tiny_config(4)
    mutate(config)
    with pytest.raises(ConfigError):
        parse_config(config)


@pytest.mark.parametrize("value", ["bfloat16", "float16", "float32", "half", "float", "torch.bfloat16",
                                   "torch.float16", "bf16"])
def test_a_dtype_name_is_read_as_transformers_resolves_it(tmp_path, value: str) -> None:
    """transformers resolves the string as ``getattr(torch, value)``: ``torch.bfloat16`` is no attribute of
    torch (AttributeError), so the config cannot load; each name it resolves is read as that dtype."""
    import json

    from transformers import AutoConfig

    config = tiny_config(4)
    config["torch_dtype"] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    try:
        resolved = str(AutoConfig.from_pretrained(str(tmp_path)).dtype).removeprefix("torch.")
    except AttributeError:
        resolved = None
    if resolved is None:
        with pytest.raises(ConfigError):
            parse_config(config)
    else:
        assert parse_config(config).dtype == {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}[resolved]
