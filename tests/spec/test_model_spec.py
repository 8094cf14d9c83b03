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


def _spec_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    cfg = parse_config(config)
    out = dict(plain_params(cfg))
    for m in linear_modules(cfg):
        out[f"{m.name}.weight"] = (m.out_features, m.in_features)
        if m.bias:
            out[f"{m.name}.bias"] = (m.out_features,)
    for name in table_names(cfg):
        out[name] = table_shape(cfg)
    return out


def _transformers_shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("layers", [4, 8])
def test_multimodal_tree_matches_transformers(layers):
    config = tiny_config(layers)
    hf = Qwen3_5Config(text_config=config["text_config"], vision_config=config["vision_config"])
    with torch.device("meta"):
        model = Qwen3_5ForConditionalGeneration(hf)
    assert _spec_shapes(config) == _transformers_shapes(model)


def test_text_only_tree_matches_transformers():
    config = tiny_config(4, multimodal=False)
    with torch.device("meta"):
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**{k: v for k, v in config.items() if k != "architectures"}))
    assert _spec_shapes(config) == _transformers_shapes(model)


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
