"""spec.schemes: the parameters a config group implies (group_signature), the fixed Clef schemes
(scheme_problems) and the compressed-tensors config facts (quant_config_problems)."""

from __future__ import annotations

import pytest

from clef_format.read.safetensors import TensorInfo
from clef_format.spec.schemes import (
    FP8_W8A8, ParamSpec, group_signature, quant_config_problems, scheme_problems, signature_problems,
)

INT4_GROUP = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32, "symmetric": True}
NVFP4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True}
INT8_CHANNEL = {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True}
STATIC_TENSOR = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}


def _info(dtype: str, shape: tuple[int, ...]) -> TensorInfo:
    return TensorInfo(dtype, tuple(shape), 0, 0)


def test_pack_quantized_weight_shape_may_be_int64_or_int32() -> None:
    sig = group_signature(INT4_GROUP, None, None, "pack-quantized", 32, 64)
    assert sig["weight_shape"] == ParamSpec(("I64", "I32"), ((2,),))
    params = {"weight_packed": _info("I32", (32, 8)), "weight_shape": _info("I32", (2,)),
              "weight_scale": _info("BF16", (32, 2))}
    assert signature_problems(sig, params, None) == []


@pytest.mark.parametrize("fmt, weights", [("pack-quantized", INT4_GROUP), ("nvfp4-pack-quantized", NVFP4),
                                          ("int-quantized", INT8_CHANNEL), ("dense", INT8_CHANNEL)])
def test_a_weight_scale_dtype_in_the_config_is_the_only_one_accepted(fmt: str, weights: dict) -> None:
    sig = group_signature({**weights, "scale_dtype": "float16"}, None, None, fmt, 32, 64)
    assert sig["weight_scale"].dtypes == ("F16",)


def test_a_weight_scale_without_a_dtype_is_f32_or_the_model_dtype() -> None:
    assert group_signature(INT4_GROUP, None, None, "pack-quantized", 32, 64)["weight_scale"].dtypes == ("F32", "BF16")
    assert group_signature(NVFP4, None, None, "nvfp4-pack-quantized", 32, 64)["weight_scale"].dtypes == ("F8_E4M3",)


def test_a_dense_format_stores_the_float_weight_and_its_scale() -> None:
    sig = group_signature(INT8_CHANNEL, None, None, "dense", 32, 64, "F16")
    assert sig == {"weight": ParamSpec(("F16",), ((32, 64),)), "weight_scale": ParamSpec(("F32", "F16"), ((32, 1),))}


def test_without_a_format_only_4_bit_float_weights_are_nvfp4() -> None:
    sig = group_signature(INT8_CHANNEL, None, None, None, 32, 64)
    assert set(sig) == {"weight", "weight_scale"} and sig["weight"].dtypes == ("I8",)
    assert "weight_packed" in group_signature(NVFP4, None, None, None, 32, 64)


def test_static_activations_store_their_scales_in_the_configured_dtype() -> None:
    sig = group_signature(INT8_CHANNEL, {**STATIC_TENSOR, "scale_dtype": "float16"}, STATIC_TENSOR, "int-quantized",
                          32, 64)
    assert sig["input_scale"] == ParamSpec(("F16",), ((1,), ()))
    assert sig["output_scale"] == ParamSpec(("F32", "BF16"), ((1,), ()))


FP8_PARAMS = {"weight": _info("F8_E4M3", (32, 64)), "weight_scale": _info("F32", (32, 1)),
              "input_scale": _info("F32", (1,))}


def test_a_module_that_fits_its_scheme_has_no_problem() -> None:
    assert scheme_problems(FP8_W8A8, FP8_PARAMS, 32, 64) == []
    assert scheme_problems(FP8_W8A8, {**FP8_PARAMS, "bias": _info("BF16", (32,))}, 32, 64) == []


def test_a_parameter_of_another_scheme_is_unexpected() -> None:
    problems = scheme_problems(FP8_W8A8, {**FP8_PARAMS, "weight_global_scale": _info("F32", (1,))}, 32, 64)
    assert problems == ["unexpected weight_global_scale for fp8-w8a8"]


def _group(weights: dict) -> dict:
    return {"config_groups": {"group_0": {"weights": weights, "targets": ["Linear"]}},
            "quantization_status": "compressed"}


def test_weights_without_a_dynamic_key_are_static() -> None:
    assert quant_config_problems(_group(INT8_CHANNEL)) == []
    assert [k for k, _, _ in quant_config_problems(_group({**INT8_CHANNEL, "dynamic": True}))] == [
        "quantization_config.config_groups.group_0.weights.dynamic"]


@pytest.mark.parametrize("status, shown", [(None, "absent (compressed-tensors' default: initialized)"),
                                           ("frozen", "'frozen'")])
def test_a_status_other_than_compressed_is_reported_as_found(status, shown: str) -> None:
    qc = _group(INT8_CHANNEL)
    if status is None:
        del qc["quantization_status"]
    else:
        qc["quantization_status"] = status
    [(key, text, fix)] = quant_config_problems(qc)
    assert key == "quantization_config.quantization_status" and fix == "compressed"
    assert text.startswith(f"quantization_config.quantization_status is {shown}: the weights are stored compressed")
