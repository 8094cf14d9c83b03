"""Quantization schemes as stored tensors: which parameters each scheme writes for a Linear module.

One source of truth for the parameter names, dtypes and shapes of the schemes Clef builds use,
as compressed-tensors writes them and vLLM's schemes expect them (vllm-integration.md).
"""

from __future__ import annotations

from clef_format.records import Record

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Iterable, Mapping

    from clef_format.read.safetensors import TensorInfo  # a (dtype, shape) record: only its fields are used

UNQUANTIZED = "unquantized"
FP8_W8A8 = "fp8-w8a8"
NVFP4_W4A4 = "nvfp4-w4a4"

FLOAT_DTYPES = ("BF16", "F16", "F32")
NVFP4_GROUP = 16


class ParamRule(Record):
    dtypes: tuple[str, ...]
    required: bool = True


#: Parameter suffixes each scheme stores for a Linear module (``bias`` is always optional).
SCHEME_PARAMS: dict[str, dict[str, ParamRule]] = {
    UNQUANTIZED: {"weight": ParamRule(FLOAT_DTYPES)},
    FP8_W8A8: {
        "weight": ParamRule(("F8_E4M3",)),
        "weight_scale": ParamRule(("F32", "BF16")),
        "input_scale": ParamRule(("F32", "BF16"), required=False),
    },
    NVFP4_W4A4: {
        "weight_packed": ParamRule(("U8",)),
        "weight_scale": ParamRule(("F8_E4M3",)),
        "weight_global_scale": ParamRule(("F32",)),
        "input_global_scale": ParamRule(("F32",)),
    },
}

ALL_SUFFIXES = frozenset(s for params in SCHEME_PARAMS.values() for s in params) | {"bias"}


def expected_shapes(scheme: str, out_features: int, in_features: int) -> dict[str, set[tuple[int, ...]]]:
    """Shapes each stored parameter may have (per-channel or per-tensor scales are both accepted)."""
    if scheme == UNQUANTIZED:
        return {"weight": {(out_features, in_features)}}
    if scheme == FP8_W8A8:
        return {
            "weight": {(out_features, in_features)},
            "weight_scale": {(out_features, 1), (1,), ()},
            "input_scale": {(1,), ()},
        }
    if scheme == NVFP4_W4A4:
        return {
            "weight_packed": {(out_features, in_features // 2)},
            "weight_scale": {(out_features, in_features // NVFP4_GROUP)},
            "weight_global_scale": {(1,)},
            "input_global_scale": {(1,)},
        }
    raise KeyError(scheme)


def params_by_module(tensors: Mapping[str, TensorInfo], modules: Iterable[str]) -> dict[str, dict[str, TensorInfo]]:
    """Stored parameters of each Linear module: module -> {suffix: header entry} (one pass over the tensors)."""
    out: dict[str, dict[str, TensorInfo]] = {m: {} for m in modules}
    for name, info in tensors.items():
        module, _, suffix = name.rpartition(".")
        params = out.get(module)
        if params is not None and suffix in ALL_SUFFIXES:
            params[suffix] = info
    return out


def stored_scheme(params: Mapping[str, TensorInfo]) -> str | None:
    """The scheme a module's stored parameters imply (suffix -> header entry), or ``None`` if none fits.

    ``weight_packed`` means NVFP4, an F8_E4M3 ``weight`` means FP8, a float ``weight`` unquantized.
    """
    if "weight_packed" in params:
        return NVFP4_W4A4
    weight = params.get("weight")
    if weight is None:
        return None
    if weight.dtype == "F8_E4M3":
        return FP8_W8A8
    if weight.dtype in FLOAT_DTYPES:
        return UNQUANTIZED
    return None


def scheme_problems(scheme: str, params: Mapping[str, TensorInfo], out_features: int, in_features: int) -> list[str]:
    """What is wrong with a module's stored parameters under ``scheme``; empty when they fit exactly."""
    problems: list[str] = []
    rules = SCHEME_PARAMS[scheme]
    shapes = expected_shapes(scheme, out_features, in_features)
    for suffix, rule in rules.items():
        info = params.get(suffix)
        if info is None:
            if rule.required:
                problems.append(f"missing {suffix}")
            continue
        if info.dtype not in rule.dtypes:
            problems.append(f"{suffix} is {info.dtype}, expected {'/'.join(rule.dtypes)}")
        if info.shape not in shapes[suffix]:
            want = " or ".join(str(list(s)) for s in sorted(shapes[suffix], key=len, reverse=True))
            problems.append(f"{suffix} has shape {list(info.shape)}, expected {want}")
    bias = params.get("bias")
    if bias is not None and bias.shape != (out_features,):
        problems.append(f"bias has shape {list(bias.shape)}, expected [{out_features}]")
    for suffix in params:
        if suffix not in rules and suffix != "bias":
            problems.append(f"unexpected {suffix} for {scheme}")
    return problems


def scheme_bytes_per_weight(scheme: str) -> float:
    """Approximate bytes per weight element in GPU memory (weights plus their scales)."""
    return {UNQUANTIZED: 2.0, FP8_W8A8: 1.0, NVFP4_W4A4: 0.5 + 1 / NVFP4_GROUP}[scheme]
