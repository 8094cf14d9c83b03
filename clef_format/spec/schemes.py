"""Quantization schemes as stored tensors: which parameters each scheme writes for a Linear module.

One source of truth for the parameter names, dtypes and shapes of the schemes Clef builds use,
as compressed-tensors writes them and vLLM's schemes expect them (vllm-integration.md).
"""

from __future__ import annotations

from clef_format.records import Record

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any, Iterable, Mapping

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

# ----------------------------------------------------------------------------- exact signatures
#
# What compressed-tensors stores for one Linear module, derived from its config group alone (the
# ``weights`` / ``input_activations`` / ``output_activations`` QuantizationArgs and the format), so
# verify can require exactly these parameters, dtypes and shapes, and nothing else.

#: torch dtype names of config.json (``torch_dtype`` / ``dtype``) -> safetensors dtype.
TORCH_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "half": "F16", "float": "F32",
                "torch.bfloat16": "BF16", "torch.float16": "F16", "torch.float32": "F32",
                "float8_e4m3fn": "F8_E4M3", "torch.float8_e4m3fn": "F8_E4M3", "uint8": "U8", "torch.uint8": "U8",
                "int8": "I8", "torch.int8": "I8", "int32": "I32", "torch.int32": "I32"}
DEFAULT_MODEL_DTYPE = "BF16"
#: Formats that store the weight in its quantized dtype unpacked (``weight``).
_UNPACKED = ("naive-quantized", "int-quantized", "float-quantized")


class ParamSpec(Record):
    """One stored parameter: the dtypes it may have and the shapes it may have."""

    dtypes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _strategy(args: Mapping[str, Any]) -> str:
    strategy = args.get("strategy")
    if strategy is not None:
        return str(strategy).lower()
    group = args.get("group_size")
    if group is None:
        return "tensor"
    return "channel" if group == -1 else "group"


def _scale_shapes(args: Mapping[str, Any], rows: int, cols: int) -> tuple[tuple[int, ...], ...]:
    """Shapes of a weight scale (or zero point) under the args' strategy (per tensor: [1], or [])."""
    strategy = _strategy(args)
    if strategy in ("group", "tensor_group"):
        return ((rows, _cdiv(cols, int(args.get("group_size") or 1))),)
    if strategy == "channel":
        return ((rows, 1),)
    if strategy == "block":
        block = args.get("block_structure") or [1, 1]
        return ((_cdiv(rows, int(block[0])), _cdiv(cols, int(block[1]))),)
    return ((1,), ())


def _dtype_of(name: Any, default: tuple[str, ...]) -> tuple[str, ...]:
    if name is None:
        return default
    mapped = TORCH_DTYPES.get(str(name))
    return (mapped,) if mapped else default


def _activation_params(prefix: str, args: Mapping[str, Any] | None, float_dtypes: tuple[str, ...]) -> dict[str, ParamSpec]:
    """``input_*`` / ``output_*`` parameters: static activations store a scale (and a zero point when
    asymmetric); ``dynamic: "local"`` (NVFP4) a global scale; ``dynamic: true`` nothing."""
    if not args:
        return {}
    dynamic = args.get("dynamic", False)
    if isinstance(dynamic, str) and dynamic.lower() == "local":
        return {f"{prefix}_global_scale": ParamSpec(("F32",), ((1,),))}
    if dynamic:
        return {}
    out = {f"{prefix}_scale": ParamSpec(_dtype_of(args.get("scale_dtype"), float_dtypes), ((1,), ()))}
    if args.get("symmetric", True) is False:
        out[f"{prefix}_zero_point"] = ParamSpec(_dtype_of(args.get("zp_dtype"), ("I8", "I32", *float_dtypes)), ((1,), ()))
    return out


def group_signature(weights: Mapping[str, Any] | None, inputs: Mapping[str, Any] | None,
                    outputs: Mapping[str, Any] | None, fmt: str | None, out_features: int, in_features: int,
                    model_dtype: str = DEFAULT_MODEL_DTYPE) -> dict[str, ParamSpec]:
    """Every parameter (except ``bias``) compressed-tensors stores for a Linear module of a config group
    (``weights is None``: not quantized, a float ``weight`` in the model's dtype)."""
    dense = {"weight": ParamSpec((model_dtype,), ((out_features, in_features),))}
    if not weights:
        return dense
    float_dtypes = tuple(dict.fromkeys(("F32", model_dtype)))  # scales: F32 or the model's dtype
    bits = int(weights.get("num_bits", 8))
    wtype = str(weights.get("type", "int")).lower()
    symmetric = weights.get("symmetric", True) is not False
    scale_shapes = _scale_shapes(weights, out_features, in_features)
    out: dict[str, ParamSpec] = {}
    if fmt == "nvfp4-pack-quantized" or (fmt is None and wtype == "float" and bits == 4):
        out["weight_packed"] = ParamSpec(("U8",), ((out_features, _cdiv(in_features, 2)),))
        out["weight_scale"] = ParamSpec(_dtype_of(weights.get("scale_dtype"), ("F8_E4M3",)), scale_shapes)
        out["weight_global_scale"] = ParamSpec(("F32",), ((1,),))
    elif fmt == "pack-quantized":
        out["weight_packed"] = ParamSpec(("I32",), ((out_features, _cdiv(in_features * bits, 32)),))
        out["weight_shape"] = ParamSpec(("I64", "I32"), ((2,),))
        out["weight_scale"] = ParamSpec(_dtype_of(weights.get("scale_dtype"), float_dtypes), scale_shapes)
        if not symmetric:
            rows, cols = scale_shapes[0] if scale_shapes[0] else (1, 1)
            out["weight_zero_point"] = ParamSpec(("I32",), ((_cdiv(rows * bits, 32), cols),))
    elif fmt == "dense":
        out["weight"] = ParamSpec((model_dtype,), ((out_features, in_features),))
        out["weight_scale"] = ParamSpec(_dtype_of(weights.get("scale_dtype"), float_dtypes), scale_shapes)
    else:  # naive / int / float-quantized (and an unknown format: the unpacked layout)
        wdtype = ("F8_E4M3",) if wtype == "float" and bits == 8 else ("I8",) if bits == 8 else ("I8", "U8")
        out["weight"] = ParamSpec(wdtype, ((out_features, in_features),))
        out["weight_scale"] = ParamSpec(_dtype_of(weights.get("scale_dtype"), float_dtypes), scale_shapes)
    if "weight_zero_point" not in out and not symmetric and fmt != "pack-quantized":
        out["weight_zero_point"] = ParamSpec(_dtype_of(weights.get("zp_dtype"), ("I8", *float_dtypes)), scale_shapes)
    actorder = weights.get("actorder")
    if actorder not in (None, False, "static"):
        out["weight_g_idx"] = ParamSpec(("I32", "I64"), ((in_features,),))
    out.update(_activation_params("input", inputs, float_dtypes))
    out.update(_activation_params("output", outputs, float_dtypes))
    return out


def signature_problems(expected: Mapping[str, ParamSpec], params: Mapping[str, TensorInfo], bias: int | None,
                       model_dtype: str = DEFAULT_MODEL_DTYPE) -> list[tuple[str, str, str]]:
    """(kind, suffix, text) for each difference between a module's stored parameters and its signature;
    kind is ``missing``, ``unexpected`` or ``shape``. ``bias``: the bias length the model has, or None."""
    want = dict(expected)
    if bias is not None:
        want["bias"] = ParamSpec((model_dtype,), ((bias,),))
    problems: list[tuple[str, str, str]] = []
    for suffix, spec in want.items():
        info = params.get(suffix)
        if info is None:
            problems.append(("missing", suffix, f"missing {suffix}"))
            continue
        if info.dtype not in spec.dtypes or tuple(info.shape) not in spec.shapes:
            shapes = " or ".join(str(list(sh)) for sh in spec.shapes)
            problems.append(("shape", suffix, f"{suffix} is {info.dtype}{list(info.shape)}, expected "
                                              f"{'/'.join(spec.dtypes)} {shapes}"))
    for suffix in params:
        if suffix not in want:
            problems.append(("unexpected", suffix, f"unexpected {suffix}"
                             + (" (this module has no bias)" if suffix == "bias" else "")))
    return problems


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
    """One of this module's three schemes the stored parameters fit (suffix -> header entry), or ``None``.

    The fallback of the backbone check when the config cannot be resolved: an NVFP4 ``weight_packed``
    (U8) means NVFP4, an F8_E4M3 ``weight`` FP8, a float ``weight`` unquantized. What vLLM may build from
    a layout is ``stored_layout`` with ``vllm_rules.matching.LAYOUT_SCHEMES``.
    """
    layout = stored_layout(params)
    return {LAYOUT_NVFP4: NVFP4_W4A4, LAYOUT_NVFP4_A16: NVFP4_W4A4, LAYOUT_FP8: FP8_W8A8,
            LAYOUT_FP8_STATIC: FP8_W8A8, UNQUANTIZED: UNQUANTIZED}.get(layout or "")


# ----------------------------------------------------------------------------- stored layouts
#
# What a module's stored tensors say by themselves (dtypes of the weight and its scales, which parameters
# exist), before the config group says which scheme of that layout was meant: an FP8 ``weight`` without an
# ``input_scale`` is FP8 W8A8 with dynamic activations or FP8 W8A16 (weight-only) alike, an I32
# ``weight_packed`` is int4 or int8 packed for WNA16 and the int W4A8/W8A8 kernels alike.

#: layout -> what it looks like (messages name a layout by the schemes it fits and this).
LAYOUT_NVFP4 = NVFP4_W4A4
LAYOUT_NVFP4_A16 = "nvfp4-w4a16"
LAYOUT_MXFP4 = "mxfp4"
LAYOUT_INT_PACKED = "int-packed"
LAYOUT_INT8 = "int8"
LAYOUT_FP8 = "fp8"
LAYOUT_FP8_STATIC = "fp8-static"
LAYOUT_MXFP8 = "mxfp8"
LAYOUTS = {
    UNQUANTIZED: "float weight",
    LAYOUT_NVFP4: "weight_packed U8, F8_E4M3 group scales, input_global_scale",
    LAYOUT_NVFP4_A16: "weight_packed U8, F8_E4M3 group scales, no input_global_scale",
    LAYOUT_MXFP4: "weight_packed U8, U8 exponent scales",
    LAYOUT_INT_PACKED: "int weights packed in I32 weight_packed",
    LAYOUT_INT8: "I8 weight",
    LAYOUT_FP8: "F8_E4M3 weight, no input_scale",
    LAYOUT_FP8_STATIC: "F8_E4M3 weight with a static input_scale",
    LAYOUT_MXFP8: "F8_E4M3 weight, U8 exponent scales",
}


def stored_layout(params: Mapping[str, TensorInfo]) -> str | None:
    """The layout of a module's stored parameters (suffix -> header entry): ``UNQUANTIZED`` for a float
    ``weight``, one of the ``LAYOUT_*`` names, or ``None`` when no layout fits (no weight at all)."""
    packed = params.get("weight_packed")
    scale = params.get("weight_scale")
    if packed is not None:
        if packed.dtype == "I32":
            return LAYOUT_INT_PACKED
        if packed.dtype == "U8":
            if scale is not None and scale.dtype == "U8":
                return LAYOUT_MXFP4
            return LAYOUT_NVFP4 if "input_global_scale" in params else LAYOUT_NVFP4_A16
        return None
    weight = params.get("weight")
    if weight is None:
        return None
    if weight.dtype == "F8_E4M3":
        if scale is not None and scale.dtype == "U8":
            return LAYOUT_MXFP8
        return LAYOUT_FP8_STATIC if "input_scale" in params else LAYOUT_FP8
    if weight.dtype == "I8":
        return LAYOUT_INT8
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


def weight_bytes(weights: Mapping[str, Any] | None, out_features: int, in_features: int, model_bytes: int = 2) -> int:
    """Bytes one Linear module's weights take in GPU memory under a config group's ``weights`` args (None:
    unquantized, ``model_bytes`` per weight): ``num_bits`` per weight, plus its scales (FP8 E4M3 for
    NVFP4's groups, F32 for FP8's, the model's dtype for int's), plus the packed zero points when
    asymmetric. Per-tensor scales are a few bytes and left out."""
    if not weights:
        return out_features * in_features * model_bytes
    bits = int(weights.get("num_bits", 8))
    wtype = str(weights.get("type", "int")).lower()
    total = _cdiv(out_features * in_features * bits, 8)
    scale_bytes = 1 if wtype == "float" and bits == 4 else 4 if wtype == "float" else model_bytes
    if str(weights.get("scale_dtype") or "").endswith(("uint8", "float8_e4m3fn", "float8_e8m0fnu")):
        scale_bytes = 1
    strategy = _strategy(weights)
    shapes = _scale_shapes(weights, out_features, in_features)[0] if strategy != "tensor" else (1,)
    scales = 1
    for dim in shapes:
        scales *= dim
    total += scales * scale_bytes
    if weights.get("symmetric", True) is False:
        total += _cdiv(scales * bits, 8)
    return total


# ----------------------------------------------------------------------------- config facts of compressed-tensors

#: The quantization status of a checkpoint whose weights are stored compressed. transformers'
#: ``CompressedTensorsConfig.is_quantization_compressed`` reads it: with any other status (absent:
#: compressed-tensors' default ``initialized``) transformers expects the weights uncompressed and
#: cannot load packed/FP8 ones; an unknown name fails ``QuantizationConfig`` validation. vLLM does not read it.
COMPRESSED_STATUS = "compressed"
#: compressed-tensors' ``QuantizationStatus`` values; its ``QuantizationConfig`` refuses any other
#: (tests compare with compressed-tensors' own enum).
QUANTIZATION_STATUSES = ("initialized", "calibration", "frozen", "compressed", "decompressed")


def quant_config_problems(qc: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """(dotted key under config.json, what is wrong, the value a fix sets) for each compressed-tensors
    fact that the stored tensors of a Clef build contradict, where vLLM may still accept the config:

    * ``weights.dynamic`` true or ``"local"``: compressed-tensors creates no weight scale for fully dynamic
      weights (``initialize._initialize_scale_zero_point`` returns early) and only a global scale for
      ``local``: the stored weight scales then belong to no parameter, and transformers cannot load them.
      (vLLM 0.28/0.33 ignore ``weights.dynamic`` for NVFP4 and refuse it for FP8: ``vllm_rules.matching``.)
    * ``quantization_status`` other than ``compressed`` (see ``COMPRESSED_STATUS``).
    """
    out: list[tuple[str, str, Any]] = []
    groups = qc.get("config_groups")
    if isinstance(groups, dict) and groups:
        for name, group in groups.items():
            weights = group.get("weights") if isinstance(group, dict) else None
            # 0 reads as false (compressed-tensors' lax bool); other non-booleans are refused before this
            if isinstance(weights, dict) and weights.get("dynamic", False) not in (0, None):
                key = f"quantization_config.config_groups.{name}.weights.dynamic"
                out.append((key, f"{key} is {weights['dynamic']!r}: weights are stored quantized with their scales, "
                            "but compressed-tensors stores no weight scale for dynamic weights (it would quantize "
                            "them on the fly), so the stored scales fit no parameter it builds", False))
        status = qc.get("quantization_status")
        if status != COMPRESSED_STATUS:
            key = "quantization_config.quantization_status"
            what = "absent (compressed-tensors' default: initialized)" if status is None else repr(status)
            why = (f"the weights are stored compressed, and transformers decompresses them only when the status is "
                   f"{COMPRESSED_STATUS!r}" if status is None or status in QUANTIZATION_STATUSES else
                   f"not a status compressed-tensors knows ({', '.join(QUANTIZATION_STATUSES)}): its "
                   "QuantizationConfig refuses it, so transformers cannot load the config")
            out.append((key, f"{key} is {what}: {why} (vLLM does not read it)", COMPRESSED_STATUS))
    return out
