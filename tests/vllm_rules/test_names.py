"""vllm_rules.names: the vLLM versions clef-format has rules for, and what a bad one is told."""

from __future__ import annotations

import pytest

from clef_format.errors import UsageError
from clef_format.vllm_rules.names import check_vllm_version, version_key


@pytest.mark.parametrize("version", ["latest", "0", "0.x", "v0.28"])
def test_a_string_that_is_no_vllm_version_is_named_in_the_error(version: str) -> None:
    with pytest.raises(ValueError) as exc:
        version_key(version)
    assert str(exc.value) == f"not a vLLM version: {version!r}"
    with pytest.raises(UsageError) as usage:
        check_vllm_version(version)
    assert str(exc.value) in str(usage.value)


def test_a_version_is_keyed_by_major_and_minor() -> None:
    assert version_key("0.28") == version_key("0.28.1") == (0, 28)
    assert version_key("1.2.3rc1") == (1, 2)


@pytest.mark.parametrize("version", ["0.28.x", "0.33.0-dev", "0.28.0rc1", "0.28.0.post1", "0.28.0+cpu", "0.28.0.0",
                                     "0.028", "00.28", " 0.28", "0.28 ", "0.٢8", "", "0.27", "v0.28"])
def test_a_vllm_version_that_is_not_major_minor_patch_is_a_usage_error(version: str) -> None:
    with pytest.raises(UsageError):
        check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.28", "0.28.0", "0.28.3", "0.33.0", "0.34", "1.0.0"])
def test_a_release_version_is_accepted(version: str) -> None:
    assert check_vllm_version(version) == version


def test_layers_are_grouped_by_decoder_block_or_as_vision_and_lm_head() -> None:
    from clef_format.fixtures.configs import tiny_config
    from clef_format.spec.model_spec import parse_config
    from clef_format.vllm_rules.names import build

    for multimodal, head in ((True, "language_model.lm_head"), (False, "lm_head")):
        layers = {l.name: l for l in build(parse_config(tiny_config(4, multimodal=multimodal))).layers}
        assert (layers[head].group, layers[head].layer) == ("lm_head", None)
        prefix = "language_model." if multimodal else ""
        down = layers[f"{prefix}model.layers.3.mlp.down_proj"]
        assert (down.group, down.layer) == ("mlp", 3)
        assert (layers[f"{prefix}model.layers.3.self_attn.qkv_proj"].group) == "self_attn"
        if multimodal:
            assert layers["visual.blocks.0.attn.qkv"].group == "vision"
        assert [l.name for l in layers.values() if l.group == "lm_head"] == [head]


def test_lm_head_is_a_linear_module_of_the_table_shape() -> None:
    """vLLM sizes ParallelLMHead from the table: vocab rows of hidden_size (the layer view and memory
    estimate read both sides)."""
    from clef_format.fixtures.configs import full_config, tiny_config
    from clef_format.spec.model_spec import parse_config
    from clef_format.vllm_rules.names import lm_head_spec

    for raw in (tiny_config(), full_config()):
        cfg = parse_config(raw)
        spec = lm_head_spec(cfg)
        assert (spec.name, spec.out_features, spec.in_features) == ("lm_head", cfg.text.vocab_size, cfg.text.hidden_size)
