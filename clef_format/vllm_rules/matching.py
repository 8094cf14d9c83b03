"""Which scheme vLLM builds for every layer of a Clef config, from config.json alone.

A pure re-implementation of vLLM's compressed-tensors matching (vLLM 0.28.0 and 0.33.0:
``compressed_tensors/utils.py`` ``should_ignore_layer`` / ``find_matched_target`` and
``CompressedTensorsConfig.from_config`` / ``apply_vllm_mapper`` / ``get_scheme_dict`` /
``_get_scheme_from_parts``), so that verify answers in milliseconds: this module must not
import torch, compressed_tensors or vllm. tests/tier_vllm proves it equal to the real vLLM, per version;
where versions differ, the rule is a row of ``vllm_names.VERSION_TABLE`` read through ``rules_for``.
Also: the same config resolved the way compressed-tensors' quantizer saw the HF modules, and
the scheme the stored tensors imply for each module.
"""

from __future__ import annotations

import re
from functools import lru_cache

from clef_format.records import Record

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any, Callable, Iterable, Mapping

from clef_format.read.safetensors import TensorInfo
from clef_format.spec import schemes
from clef_format.spec.model_spec import ConfigError, LinearSpec, ModelConfig, linear_modules, parse_config
from clef_format.vllm_rules import config_types as T
from clef_format.vllm_rules import names as vllm_names
from clef_format.vllm_rules.names import DEFAULT_VLLM, VllmLayer, VllmModel, rules_for

# Scheme names beyond schemes.py's three (named after vLLM's CompressedTensors* classes).
NVFP4_W4A16 = "nvfp4-w4a16"
MXFP4 = "mxfp4"
MXFP4_W4A8 = "mxfp4-w4a8"
MXFP8 = "mxfp8"
FP8_W8A16 = "fp8-w8a16"
INT8_W8A8 = "int8-w8a8"
INT_W4A8 = "int-w4a8"
WNA16 = "wna16"
WNA8O8_INT = "wna8o8-int"
WNA8_INT = "wna8-int"
WNA4_INT = "wna4-int"

#: vLLM scheme class -> our scheme name (used by the oracle tests and reports).
VLLM_SCHEME_CLASSES: dict[str, str] = {
    "CompressedTensorsW8A8Fp8": schemes.FP8_W8A8,
    "CompressedTensorsW4A4Fp4": schemes.NVFP4_W4A4,
    "CompressedTensorsW8A16Fp8": FP8_W8A16,
    "CompressedTensorsW4A4Mxfp4": MXFP4,
    "CompressedTensorsW4A8Mxfp4": MXFP4_W4A8,
    "CompressedTensorsW8A8Mxfp8": MXFP8,
    "CompressedTensorsW8A8Int8": INT8_W8A8,
    "CompressedTensorsW4A8Int": INT_W4A8,
    "CompressedTensorsWNA16": WNA16,
    "CompressedTensorsWNA8O8Int": WNA8O8_INT,
    "CompressedTensorsWNA8Int": WNA8_INT,
    "CompressedTensorsWNA4Int": WNA4_INT,
}

_ACT_FORMATS = ("naive-quantized", "int-quantized", "float-quantized", "nvfp4-pack-quantized")
_STRATEGIES = ("tensor", "channel", "group", "block", "token", "tensor_group", "attn_head")
_ACTORDER = {"group": "group", "weight": "weight", "dynamic": "group", "static": "weight"}  # value -> canonical
#: torch dtype names compressed-tensors accepts for scale_dtype / zp_dtype ("torch." prefix optional).
_TORCH_DTYPES = frozenset({
    "float32", "float", "float64", "double", "float16", "half", "bfloat16", "float8_e4m3fn", "float8_e5m2",
    "float8_e8m0fnu", "float4_e2m1fn_x2", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32",
    "uint64", "bool", "long", "int", "short",
})
_ARG_FIELDS = frozenset({
    "num_bits", "type", "symmetric", "group_size", "strategy", "block_structure", "dynamic",
    "actorder", "scale_dtype", "zp_dtype", "observer", "observer_kwargs",
})


class QuantConfigError(ValueError):
    """vLLM refuses the quantization_config as a whole (it fails before building any layer)."""


class VllmLayerError(Exception):
    """vLLM raises while building one layer; ``kind`` is the Python exception vLLM raises."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Args(Record):
    """The parts of compressed-tensors' ``QuantizationArgs`` that pick vLLM's scheme (validated)."""

    num_bits: int
    type: str
    symmetric: bool
    group_size: int | None
    strategy: str
    dynamic: bool | str
    scale_dtype: str | None
    raw: Mapping[str, Any]  # the group's arguments, the lax fields coerced as compressed-tensors does
    actorder: str | None = None  # as compressed-tensors stores it: group | weight | dynamic | static


class Entry(Record):
    """One target of the config: its group and the scheme parts vLLM reads for it."""

    target: str  # as written in config.json
    group: str
    weights: Args
    input: Args | None
    output: Args | None
    format: str | None  # the group's own format (None: fall back to the top-level one)


class QuantConfig(Record):
    """A parsed compressed-tensors ``quantization_config``, in vLLM's order and rules."""

    targets: dict[str, Entry]  # vLLM's target_scheme_map: later groups overwrite, order kept
    ignore: tuple[str, ...]
    format: str | None
    hf_targets: dict[str, Entry]  # compressed-tensors' target_to_scheme (every group)
    version: str = DEFAULT_VLLM  # the vLLM version whose rules parsed it
    entries: tuple[Entry, ...] = ()  # every (group, target) pair, those a later group overwrote too


class Decision(Record):
    """What vLLM builds for one layer (or the error it raises building it)."""

    layer: str
    scheme: str | None  # None only when ``error`` is set
    target: str | None = None  # the (vLLM-mapped) target that decided it
    group: str | None = None
    ignored: bool = False
    error: str | None = None
    error_kind: str | None = None


# ----------------------------------------------------------------------------- parsing


def parse_args(raw: Any, where: str) -> Args:
    """Validate like ``QuantizationArgs.model_validate`` (the rules that decide a scheme)."""
    if not isinstance(raw, dict):
        raise QuantConfigError(f"{where} must be an object, got {raw!r}")
    extra = set(raw) - _ARG_FIELDS
    if extra:
        raise QuantConfigError(f"{where}: unknown field(s) {sorted(extra)} (compressed-tensors forbids extra fields)")
    raw = _coerced(raw, where)
    num_bits = raw.get("num_bits", 8)
    qtype = str(raw.get("type", "int")).lower()
    if qtype not in ("int", "float"):
        raise QuantConfigError(f"{where}.type must be 'int' or 'float', got {raw.get('type')!r}")
    symmetric = raw.get("symmetric", True)
    group_size = raw.get("group_size")
    strategy = raw.get("strategy")
    if strategy is not None:
        strategy = str(strategy).lower()
        if strategy not in _STRATEGIES:
            raise QuantConfigError(f"{where}.strategy {raw.get('strategy')!r} is not a compressed-tensors strategy")
    elif group_size is None:
        strategy = "tensor"
    elif group_size > 0:
        strategy = "group"
    elif group_size == -1:
        strategy = "channel"
    else:
        raise QuantConfigError(f"{where}: invalid group_size {group_size}")
    dynamic = raw.get("dynamic", False)
    if strategy == "token" and not dynamic:
        raise QuantConfigError(f"{where}: static token quantization is not allowed")
    if strategy in ("group", "tensor_group") and (group_size is None or group_size <= 0):
        raise QuantConfigError(f"{where}: strategy {strategy} needs a positive group_size")
    if group_size is not None and group_size > 0 and strategy not in ("group", "tensor_group"):
        raise QuantConfigError(f"{where}: group_size needs strategy 'group'")
    block = raw.get("block_structure")
    if block is not None and not _valid_block(block):
        raise QuantConfigError(f"{where}.block_structure must be [rows, cols]")
    if (strategy == "block") != (block is not None):
        raise QuantConfigError(f"{where}: block strategy and block_structure go together")
    actorder = _actorder(raw.get("actorder"), where)
    if actorder is not None and _ACTORDER[actorder] == "group" and strategy not in ("group", "tensor_group"):
        raise QuantConfigError(f"{where}: group activation ordering needs strategy group or tensor_group")
    if dynamic and strategy not in ("token", "tensor", "tensor_group", "group"):
        raise QuantConfigError(f"{where}: dynamic quantization needs strategy token/tensor/tensor_group/group")
    if dynamic == "local" and strategy != "tensor_group":
        raise QuantConfigError(f"{where}: dynamic 'local' needs strategy tensor_group")
    for field in ("scale_dtype", "zp_dtype"):
        value = raw.get(field)
        if value is not None and (not isinstance(value, str) or value.removeprefix("torch.") not in _TORCH_DTYPES):
            raise QuantConfigError(f"{where}.{field}: no such torch dtype {value!r}")
    if raw.get("zp_dtype") is None and qtype == "float" and num_bits not in (4, 8):
        # QuantizationArgs infers zp_dtype: float types exist only at 4 and 8 bits (NotImplementedError)
        raise QuantConfigError(f"{where}: float quantization needs num_bits 4 or 8")
    scale = raw.get("scale_dtype")
    return Args(num_bits, qtype, symmetric, group_size, strategy, dynamic, None if scale is None else str(scale), raw,
                actorder)


def _valid_block(value: Any) -> bool:
    if isinstance(value, str):
        try:
            [int(x) for x in value.split("x")]
        except ValueError:
            return False
        return True
    return isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in value)


def _coerced(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The args with every field ``QuantizationArgs`` coerces in lax mode turned into its value (``"8"`` ->
    8, ``"true"`` -> True: ``config_types.QUANT_FIELDS``, proven against compressed-tensors' model), or
    the refusal of the first field it refuses."""
    out = dict(raw)
    for field, rule in T.QUANT_FIELDS.items():
        if field in raw:
            ok, value = rule(raw[field])
            if not ok:
                raise QuantConfigError(f"{where}.{field} is {T.got(raw[field])}: {value} (compressed-tensors' "
                                       "QuantizationArgs refuses it)")
            out[field] = value
    return out


def _actorder(value: Any, where: str) -> str | None:
    """``QuantizationArgs.validate_actorder``: true -> group, false/None -> none, names case-insensitive."""
    if value is None or value is False:
        return None
    if value is True:
        return "group"
    if isinstance(value, str) and value.lower() in _ACTORDER:
        return value.lower()
    raise QuantConfigError(f"{where}.actorder must be group, weight, dynamic, static or a boolean, got {value!r}")


def _is_act_format(fmt: str | None) -> bool:
    return fmt in _ACT_FORMATS


def parse_quant_config(qc: Any, version: str = DEFAULT_VLLM) -> QuantConfig:
    """Parse like ``CompressedTensorsConfig.from_config`` of vLLM ``version``; raise ``QuantConfigError`` where it fails."""
    rules = rules_for(version)
    if not isinstance(qc, dict):
        raise QuantConfigError("quantization_config must be an object")
    method = qc.get("quant_method")
    if method != "compressed-tensors":
        raise QuantConfigError(f"quant_method is {method!r}; clef-format checks compressed-tensors configs only")
    fmt = qc.get("format")
    groups = qc.get("config_groups", {})
    if not isinstance(groups, dict):
        raise QuantConfigError("config_groups must be an object")
    ignore = qc.get("ignore", [])
    if ignore is None:  # vLLM maps the list through the model's name mapper: iterating null is a TypeError
        raise QuantConfigError("ignore is null: vLLM iterates it (TypeError); leave it out, or give a list "
                               "([] for none)")
    if not isinstance(ignore, list) or not all(isinstance(i, str) for i in ignore):
        raise QuantConfigError("ignore must be a list of strings")
    sparsity = qc.get("sparsity_config")
    if isinstance(sparsity, dict) and sparsity.get("targets"):
        raise QuantConfigError("sparsity_config with targets: vLLM removed sparsity support")
    targets: dict[str, Entry] = {}
    hf_targets: dict[str, Entry] = {}
    entries: list[Entry] = []
    for gname, group in groups.items():
        where = f"config_groups.{gname}"
        if not isinstance(group, dict):
            raise QuantConfigError(f"{where} must be an object")
        tlist = group.get("targets")
        if not isinstance(tlist, list) or not all(isinstance(t, str) for t in tlist):
            raise QuantConfigError(f"{where}.targets must be a list of strings")
        gfmt = group.get("format")
        weights = parse_args(group.get("weights"), f"{where}.weights")
        if rules.actorder_group_refused and weights.actorder is not None and _ACTORDER[weights.actorder] == "group":
            raise QuantConfigError(f"{where}.weights: vLLM {version} no longer supports group/dynamic activation "
                                   f"ordering (actorder={weights.actorder!r})")
        raw_in = group.get("input_activations")
        act = _is_act_format(gfmt) if gfmt is not None else _is_act_format(fmt)
        inp: Args | None = None
        if act or raw_in:
            if not raw_in:
                if weights.type != "float":
                    raise QuantConfigError(f"{where}: {gfmt or fmt} needs input_activations for int weights")
            else:
                inp = parse_args(raw_in, f"{where}.input_activations")
        raw_out = group.get("output_activations")
        out = parse_args(raw_out, f"{where}.output_activations") if raw_out else None
        for t in tlist:
            _check_regex(t, where)
            entry = Entry(t, str(gname), weights, inp, out, gfmt)
            entries.append(entry)
            hf_targets[t] = entry
            # vLLM drops a group whose only target is an attention class (KV-cache quant).
            if not (len(tlist) == 1 and tlist[0].endswith("Attention")):
                targets[t] = entry
    for i in ignore:
        _check_regex(i, "ignore")
    return QuantConfig(targets, tuple(ignore), fmt, hf_targets, version, tuple(entries))


def _check_regex(pattern: str, where: str) -> None:
    if pattern.startswith("re:"):
        try:
            _compile(pattern[3:])
        except re.error as e:
            raise QuantConfigError(f"{where}: {pattern!r} is not a valid regex ({e})") from None


@lru_cache(maxsize=4096)
def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


# ----------------------------------------------------------------------------- matching


#: ``re:`` target -> its compiled pattern's ``match``: asked thousands of times per verify, by target.
_MATCHERS: dict[str, Callable[[str], object]] = {}


def name_matcher(target: str) -> Callable[[str], object]:
    """``equal_or_regex(name, target)`` as one callable of a name, truthy exactly on a match: the compiled
    pattern's ``match`` for ``re:``, else ``target.__eq__`` (names are str). Both are C functions, so
    ``any(map(name_matcher(t), names))`` asks a whole list without a Python frame per name."""
    if target.startswith("re:"):
        match = _MATCHERS.get(target)
        if match is None:
            match = _MATCHERS[target] = _compile(target[3:]).match
        return match
    return target.__eq__


def equal_or_regex(value: str, target: str, contains: bool = False) -> bool:
    """vLLM's ``_is_equal_or_regex_match``: ``re:`` -> ``re.match`` (start-anchored only).

    Each ``re:`` target is compiled once (``name_matcher``); the pairs themselves are not cached: a
    9B config asks thousands of them, two thirds of them only once, and the match costs less than
    a cache entry (measured with callgrind: benchmarks/RESULTS.md).
    """
    if target.startswith("re:"):
        return name_matcher(target)(value) is not None
    if contains:
        return target.lower() in value.lower()
    return target == value


def _first(value: str, targets: Iterable[str], contains: bool = False) -> str | None:
    if contains:
        return next((t for t in targets if equal_or_regex(value, t, contains)), None)
    targets = tuple(targets)
    for target, match in zip(targets, matchers(targets)):
        if match(value):
            return target
    return None


#: patterns (a config's targets or ignore list) -> their matchers, in order: every layer asks the same list
_LIST_MATCHERS: dict[tuple[str, ...], tuple[Callable[[str], object], ...]] = {}


def matchers(patterns: tuple[str, ...]) -> tuple[Callable[[str], object], ...]:
    """``name_matcher`` of each pattern, made once per list."""
    made = _LIST_MATCHERS.get(patterns)
    if made is None:
        made = _LIST_MATCHERS[patterns] = tuple(name_matcher(p) for p in patterns)
    return made


def fused_shards(name: str, packed: Mapping[str, tuple[str, ...]]) -> tuple[str, tuple[str, ...]] | None:
    """(fused key, shard names) the way ``_match_fused_layer`` expands a name, or None."""
    key = next((k for k in packed if name.endswith(k)), None)
    if key is None:
        return None
    return key, tuple(name.replace(key, s) for s in packed[key])


def find_matched_target(name: str, cls: str, targets: Iterable[str], packed: Mapping[str, tuple[str, ...]]) -> str | None:
    """vLLM's order: name/regex in config order, then all-shards fused rule, then class substring."""
    targets = tuple(targets)
    hit = _first(name, targets)
    if hit is None:
        expanded = fused_shards(name, packed)
        if expanded is not None:
            shard_hits = [_first(s, targets) for s in expanded[1]]
            if all(shard_hits):
                hit = shard_hits[0]
    if hit is None:
        hit = _first(cls, targets, contains=True)
    return hit


def should_ignore(name: str, ignore: tuple[str, ...], packed: Mapping[str, tuple[str, ...]], version: str = DEFAULT_VLLM) -> bool:
    """vLLM's ``should_ignore_layer``; raises ``VllmLayerError`` for a partly ignored fused layer."""
    if not ignore:
        return False
    proj = name.rpartition(".")[2]
    tests = matchers(ignore)
    if rules_for(version).fused_name_ignore and any(m(name) for m in tests):
        return True
    if proj in packed and name not in ignore:
        shard_names = packed[proj]
        verdicts = {any(m(name.replace(proj, s)) for m in tests) for s in shard_names}
        if len(verdicts) > 1:
            raise VllmLayerError(
                "ValueError",
                f"Found a different quantization schemes for {list(shard_names)} in {name}. "
                "vLLM requires all to use the same scheme.",
            )
        return verdicts.pop()
    return any(m(name) for m in tests)


# ----------------------------------------------------------------------------- schemes


def _is_nvfp4(a: Args | None) -> bool:
    return (a is not None and a.strategy == "tensor_group" and a.type == "float" and a.num_bits == 4
            and a.group_size == 16 and a.symmetric)


def _is_fp8_w8a8(w: Args, i: Args | None) -> bool:
    if i is None or w.type != "float" or i.type != "float":
        return False
    if not (w.symmetric and not w.dynamic and w.strategy in ("tensor", "channel", "block")):
        return False
    return bool(i.dynamic) or (i.symmetric and i.strategy == "tensor")


def _is_mxfp4(w: Args) -> bool:
    return w.strategy == "group" and w.type == "float" and w.num_bits == 4 and w.group_size == 32 and w.symmetric


def classify(e: Entry, top_format: str | None, layer: str = "", version: str = DEFAULT_VLLM) -> str:
    """vLLM's ``_get_scheme_from_parts`` on a GPU that supports the scheme (not SM90-only W4A8).

    Raises ``VllmLayerError`` where vLLM raises (ValueError / NotImplementedError).
    """
    rules = rules_for(version)
    w, i, o = e.weights, e.input, e.output
    fmt = e.format if e.format is not None else top_format
    if _is_nvfp4(w):
        if i is None:
            return NVFP4_W4A16
        if not _is_nvfp4(i):
            raise VllmLayerError("ValueError",
                                 "For NVFP4 weights, input quantization must also be NVFP4 format, None for NVFP4A16")
        return schemes.NVFP4_W4A4
    if (rules.mxfp4_w4a8_fp8 and _is_mxfp4(w) and i is not None and i.type == "float" and i.num_bits == 8
            and not w.dynamic and bool(i.dynamic) and i.strategy in ("token", "group") and i.symmetric):
        return MXFP4_W4A8
    if _is_mxfp4(w):
        return MXFP4
    if (w.strategy == "group" and w.type == "float" and w.num_bits == 8 and w.group_size == 32 and w.symmetric
            and (w.scale_dtype or "").endswith("uint8")):
        return MXFP8
    static_int = w.type == "int" and not w.dynamic and w.strategy in ("channel", "group")
    if (static_int and fmt in ("pack-quantized", "int-quantized")
            and i is not None and i.type == "int" and i.strategy == "tensor" and i.num_bits == 8 and not i.dynamic
            and o is not None and o.type == "int" and o.strategy == "tensor" and o.num_bits == 8 and not o.dynamic):
        return WNA8O8_INT
    wnam = (i is not None and fmt == "pack-quantized" and static_int and i.type == "int" and i.symmetric
            and bool(i.dynamic) and i.strategy in ("token", "group"))
    if wnam and i is not None and i.num_bits == 8:
        return WNA8_INT
    if wnam and i is not None and i.num_bits == 4:
        return WNA4_INT
    if i is None and w.strategy in ("channel", "group") and not w.dynamic and fmt == "pack-quantized":
        return WNA16
    if _is_act_format(fmt):
        if _is_fp8_w8a8(w, i):
            return schemes.FP8_W8A8
        if w.type == "float" and w.symmetric and not w.dynamic and w.strategy in ("tensor", "channel", "block"):
            return FP8_W8A16
        if i is None:
            # vLLM's _is_static_tensor_w8a8 reads input_quant.num_bits: weight-only float weights that
            # neither FP8 W8A8 nor W8A16 claimed crash scheme selection (0.28 and 0.33 alike).
            raise VllmLayerError("AttributeError", f"vLLM crashes selecting a scheme for layer_name={layer!r}: "
                                 "'NoneType' object has no attribute 'num_bits' (weight-only float weights "
                                 f"that are not static symmetric tensor/channel/block, format={fmt!r})")
        if i is not None:
            w8 = w.num_bits == i.num_bits == 8 and w.strategy in ("tensor", "channel") and w.symmetric
            if w8 and i.strategy == "tensor" and not w.dynamic and not i.dynamic:
                return INT8_W8A8
            if w8 and i.strategy == "token" and not w.dynamic and i.dynamic:
                return INT8_W8A8
            typed = not rules.w4a8_int_needs_int or (w.type == "int" and i.type == "int")
            if (typed and w.num_bits == 4 and i.num_bits == 8 and w.strategy in ("group", "channel")
                    and i.strategy == "token" and w.symmetric and not w.dynamic and i.dynamic):
                return INT_W4A8
    raise VllmLayerError("NotImplementedError",
                         f"No compressed-tensors compatible scheme was found for layer_name={layer!r} (format={fmt!r})")


# ----------------------------------------------------------------------------- block shapes


def output_partitions(layer: VllmLayer) -> list[int]:
    """``output_partition_sizes`` of the layer at tensor parallel 1: one per logical weight. Qwen3.5's
    ``in_proj_qkvz`` has four (``[key_dim, key_dim, value_dim, value_dim]``, ``create_qkvz_proj`` with
    ``gqa_interleaved_layout`` False), the other fused layers one per HF shard."""
    sizes = [s.out_features for s in layer.shards]
    if layer.fused == "in_proj_qkvz" and len(sizes) == 2 and (sizes[0] - sizes[1]) % 2 == 0:
        key_dim = (sizes[0] - sizes[1]) // 2
        return [key_dim, key_dim, sizes[1], sizes[1]]
    return sizes


def _block(args: Args) -> tuple[int, int] | None:
    block = args.raw.get("block_structure")
    if isinstance(block, str):
        rows, cols = (int(x) for x in block.split("x"))
        return rows, cols
    if isinstance(block, list) and len(block) == 2:
        return int(block[0]), int(block[1])
    return None


def block_problem(layer: VllmLayer, entry: Entry, scheme: str | None) -> str | None:
    """vLLM's ``validate_fp8_block_shape`` (``utils/fp8_utils.py``, called by the FP8 W8A8 and W8A16 schemes'
    ``create_weights``) at tensor parallel 1: a merged layer's partitions but the last must be multiples of
    block_n (its ValueError message), or None. (The input size is checked only when tensor parallelism
    splits it; compressed-tensors' config has no ``weight_block_size``, so the linear layer's mismatch
    allowance never applies.)"""
    if scheme not in (schemes.FP8_W8A8, FP8_W8A16) or entry.weights.strategy != "block":
        return None
    block = _block(entry.weights)
    sizes = output_partitions(layer)
    if block is None or len(sizes) < 2:
        return None
    for size in sizes[:-1]:
        if block[0] and size % block[0] != 0:
            return (f"Weight output_partition_size = {size} is not divisible by weight quantization "
                    f"block_n = {block[0]}.")
    return None


# ----------------------------------------------------------------------------- vLLM view


class VllmQuant(Record):
    """The config after ``apply_vllm_mapper``: targets and ignore in vLLM's names."""

    targets: dict[str, Entry]  # mapped target -> entry (dict-comprehension semantics)
    ignore: tuple[str, ...]
    format: str | None
    mapped_from: dict[str, str]  # original target/ignore entry -> mapped (absent when dropped)


def map_target(model: VllmModel, target: str) -> str | None:
    """``apply_vllm_mapper``: only plain dotted paths are rewritten; ``re:`` and dotless pass through."""
    if "." in target and not target.startswith("re:"):
        return model.map_name(target)
    return target


def vllm_view(qc: QuantConfig, model: VllmModel) -> VllmQuant:
    mapped_from: dict[str, str] = {}
    targets: dict[str, Entry] = {}
    for t, e in qc.targets.items():
        m = map_target(model, t)
        if m is not None:
            targets[m] = e
            mapped_from[t] = m
    ignore: list[str] = []
    for i in qc.ignore:
        m = map_target(model, i)
        if m is not None:
            ignore.append(m)
            mapped_from[i] = m
    return VllmQuant(targets, tuple(ignore), qc.format, mapped_from)


def rules_in_play(qc: QuantConfig, vq: VllmQuant, model: VllmModel) -> frozenset[str]:
    """The VERSION_TABLE rows whose condition some group or ignore entry of ``qc`` meets.

    Each row changes a decision only under the condition tested where the row is read (in
    ``parse_quant_config``, ``should_ignore`` and ``classify``); a version that differs from another
    only in rows outside this set resolves every layer identically, so verify checks it once.
    """
    rows: set[str] = set()
    entries = qc.entries  # every group: parsing refuses an overwritten group's actorder as well
    if any(e.weights.actorder is not None and _ACTORDER[e.weights.actorder] == "group" for e in entries):
        rows.add("actorder_group_refused")
    if any(_is_mxfp4(e.weights) for e in entries):
        rows.add("mxfp4_w4a8_fp8")
    if any(e.input is not None and e.weights.num_bits == 4 and e.input.num_bits == 8 for e in entries):
        rows.add("w4a8_int_needs_int")
    # should_ignore differs only for a fused layer a pattern matches by name but that is not listed verbatim
    if any(layer.fused and layer.name not in vq.ignore and any(equal_or_regex(layer.name, i) for i in vq.ignore)
           for layer in model.layers):
        rows.add("fused_name_ignore")
    return frozenset(rows)


def resolve_layer(layer: VllmLayer, vq: VllmQuant, model: VllmModel) -> Decision:
    """The scheme vLLM builds for ``layer`` (``get_quant_method`` for a Linear / ParallelLMHead)."""
    try:
        if should_ignore(layer.name, vq.ignore, model.packed, model.version):
            return Decision(layer.name, schemes.UNQUANTIZED, ignored=True)
    except VllmLayerError as e:
        return Decision(layer.name, None, error=str(e), error_kind=e.kind)
    target = find_matched_target(layer.name, layer.cls, vq.targets.keys(), model.packed) if vq.targets else None
    if target is None:
        return Decision(layer.name, schemes.UNQUANTIZED)
    entry = vq.targets[target]
    try:
        return Decision(layer.name, classify(entry, vq.format, layer.name, model.version), target, entry.group)
    except VllmLayerError as e:
        # ParallelLMHead: vLLM catches ValueError from get_scheme and serves it unquantized.
        if layer.group == "lm_head" and e.kind == "ValueError":
            return Decision(layer.name, schemes.UNQUANTIZED, target, entry.group)
        return Decision(layer.name, None, target, entry.group, error=str(e), error_kind=e.kind)


def resolve_vllm(config: Mapping[str, Any], version: str = DEFAULT_VLLM) -> list[Decision]:
    """Per vLLM layer, in model order. Raises ``ConfigError`` / ``QuantConfigError``."""
    cfg = parse_config(dict(config))
    model = vllm_names.build(cfg, version)
    if cfg.quantization is None:
        return [Decision(l.name, schemes.UNQUANTIZED) for l in model.layers]
    vq = vllm_view(parse_quant_config(cfg.quantization, version), model)
    return [resolve_layer(l, vq, model) for l in model.layers]


# ----------------------------------------------------------------------------- HF view


class HfDecision(Record):
    """What compressed-tensors' quantizer applied to one HF module (scheme None: left alone)."""

    module: str
    scheme: str | None
    target: str | None = None
    group: str | None = None
    ignored: bool = False


def ct_match(name: str, target: str, classes: tuple[str, ...]) -> bool:
    """compressed-tensors ``is_match`` for one target: ``match_name`` (the same ``re.match`` /
    equality vLLM uses) or an exact class name."""
    test = ct_matcher(target, classes)
    return test is None or bool(test(name))


def ct_matcher(target: str, classes: tuple[str, ...]) -> Callable[[str], object] | None:
    """``ct_match(·, target, classes)`` made once: ``None`` where the target is one of the module classes
    (it matches every module), else the target's ``name_matcher``."""
    return None if target in classes else name_matcher(target)


def resolve_hf_module(name: str, qc: QuantConfig, classes: tuple[str, ...] = vllm_names.HF_LINEAR_CLASSES) -> HfDecision:
    """``apply_quantization_config``: matched and not ignored; most specific target wins
    (exact names, then regexes, each sorted, then class names; ``match_targets``)."""
    return _HfResolver(qc, classes)(name)


class _HfResolver:
    """``resolve_hf_module`` with the per-config work (target order, scheme of each group) done once."""

    def __init__(self, qc: QuantConfig, classes: tuple[str, ...] = vllm_names.HF_LINEAR_CLASSES) -> None:
        self.qc = qc
        self.classes = classes
        self.ordered = sorted(qc.hf_targets, key=lambda t: ("re:" in t, t))
        self.schemes: dict[str, str] = {}
        self.target_tests = tuple(ct_matcher(t, classes) for t in qc.hf_targets)  # None: matches every module
        self.ignore_tests = tuple(ct_matcher(i, classes) for i in qc.ignore)
        self.ordered_tests = tuple(zip(self.ordered, matchers(tuple(self.ordered))))

    def _scheme(self, target: str, name: str) -> str:
        if target not in self.schemes:
            entry = self.qc.hf_targets[target]
            try:
                self.schemes[target] = classify(entry, self.qc.format, name, self.qc.version)
            except VllmLayerError:
                self.schemes[target] = f"unsupported:{entry.group}"
        return self.schemes[target]

    def __call__(self, name: str) -> HfDecision:
        qc, classes = self.qc, self.classes
        for test in self.target_tests:
            if test is None or test(name):
                break
        else:
            return HfDecision(name, None)
        for test in self.ignore_tests:
            if test is None or test(name):
                return HfDecision(name, None, ignored=True)
        by_name = [t for t, match in self.ordered_tests if match(name)]
        by_class = [t for t in self.ordered if t in classes and t not in by_name]
        target = (by_name + by_class)[0]
        return HfDecision(name, self._scheme(target, name), target, qc.hf_targets[target].group)


#: The last resolve_hf call (config, quant config, result): verify's backbone and pattern checks ask
#: for the same decisions, and on a 9B config they are a tenth of verify's time.
_LAST_HF: list[tuple[ModelConfig, QuantConfig, Mapping[str, HfDecision]]] = []


def resolve_hf(cfg: ModelConfig, qc: QuantConfig) -> Mapping[str, HfDecision]:
    """Per HF linear module (and ``lm_head``), what the quantizer saw and applied (read-only)."""
    if _LAST_HF and _LAST_HF[0][0] is cfg and _LAST_HF[0][1] == qc:
        return _LAST_HF[0][2]
    specs = [*linear_modules(cfg), vllm_names.lm_head_spec(cfg)]
    resolver = _HfResolver(qc)
    out = {s.name: resolver(s.name) for s in specs}
    _LAST_HF[:] = [(cfg, qc, out)]
    return out


# ----------------------------------------------------------------------------- stored tensors


#: The schemes vLLM builds whose parameters a stored layout fills (``schemes.stored_layout``): the tensors
#: pick the layout, the config group (its ``input_activations``, their ``dynamic`` flag) the scheme within it.
#: Read from each scheme class's ``create_weights`` (vLLM 0.28/0.33): WNA16, WNA8/WNA4 Int and W4A8 Int pack
#: int weights into I32 ``weight_packed``; W8A8 Int8 and WNA8O8 Int keep an I8 ``weight``; FP8 W8A8 (dynamic
#: activations) and W8A16 store no ``input_scale``, static FP8 W8A8 does.
LAYOUT_SCHEMES: dict[str, frozenset[str]] = {
    schemes.UNQUANTIZED: frozenset({schemes.UNQUANTIZED}),
    schemes.LAYOUT_NVFP4: frozenset({schemes.NVFP4_W4A4}),
    schemes.LAYOUT_NVFP4_A16: frozenset({NVFP4_W4A16}),
    schemes.LAYOUT_MXFP4: frozenset({MXFP4, MXFP4_W4A8}),
    schemes.LAYOUT_INT_PACKED: frozenset({WNA16, WNA8_INT, WNA4_INT, INT_W4A8, WNA8O8_INT}),
    schemes.LAYOUT_INT8: frozenset({INT8_W8A8, WNA8O8_INT, INT_W4A8}),
    schemes.LAYOUT_FP8: frozenset({schemes.FP8_W8A8, FP8_W8A16}),
    schemes.LAYOUT_FP8_STATIC: frozenset({schemes.FP8_W8A8}),
    schemes.LAYOUT_MXFP8: frozenset({MXFP8}),
}


def layout_fits(layout: str | None, scheme: str | None) -> bool:
    """Whether vLLM's ``scheme`` finds its parameters in a module stored in ``layout``."""
    return layout is not None and scheme in LAYOUT_SCHEMES.get(layout, frozenset())


def layout_label(layout: str | None) -> str:
    """A layout as messages name it: the scheme it stores (several: which, and what the tensors look like)."""
    if layout is None:
        return "no known layout"
    fits = sorted(LAYOUT_SCHEMES.get(layout, ()))
    if len(fits) == 1:
        return fits[0]
    return f"{' or '.join(fits)} ({schemes.LAYOUTS.get(layout, layout)})"


def stored_schemes(backbone: Mapping[str, TensorInfo], specs: Iterable[LinearSpec]) -> dict[str, str | None]:
    """Per HF module present in the backbone, the layout its tensors have (``schemes.stored_layout``;
    None: no layout fits)."""
    params = schemes.params_by_module(backbone, (spec.name for spec in specs))
    return {module: schemes.stored_layout(p) for module, p in params.items() if p}


__all__ = [
    "Args", "block_problem", "ConfigError", "output_partitions", "Decision", "Entry", "HfDecision", "QuantConfig",
    "QuantConfigError", "VllmLayerError",
    "VllmQuant", "classify", "equal_or_regex", "name_matcher", "find_matched_target", "map_target", "parse_quant_config",
    "layout_fits", "resolve_hf", "resolve_hf_module", "resolve_layer", "resolve_vllm", "should_ignore", "stored_schemes",
    "vllm_view",
]


# ----------------------------------------------------------------------------- class-name targets


def class_only_targets(cfg: ModelConfig, qc: QuantConfig) -> list[str]:
    """Targets that match no HF module, neither by name nor as compressed-tensors matches a class (the
    exact name ``Linear``). vLLM still matches such a target against its layers' class names (a ``re:``
    pattern with re.match, a plain one as a case-insensitive substring: ``re:.*Linear``, ``linear``), so
    vLLM may build quantized layers the quantizer never quantized by that target."""
    names = [s.name for s in linear_modules(cfg)] + [vllm_names.lm_head_spec(cfg).name]
    return [t for t in qc.targets
            if t not in vllm_names.HF_LINEAR_CLASSES and not any(map(name_matcher(t), names))]


def class_matched_modules(cfg: ModelConfig, qc: QuantConfig, version: str = DEFAULT_VLLM) -> dict[str, Entry]:
    """HF modules the quantizer left alone (no target, not ignored) that vLLM quantizes through a
    class-only target: module -> the entry of the group vLLM builds them with."""
    class_only = class_only_targets(cfg, qc)
    if not class_only:
        return {}
    model = vllm_names.build(cfg, version)
    vq = vllm_view(qc, model)
    mapped = {vq.mapped_from[t] for t in class_only if t in vq.mapped_from}
    hf = resolve_hf(cfg, qc)
    out: dict[str, Entry] = {}
    for layer in model.layers:
        d = resolve_layer(layer, vq, model)
        if d.scheme is None or d.target not in mapped:
            continue
        entry = vq.targets[d.target]
        for shard in layer.shards:
            h = hf.get(shard.name)
            if h is None or (h.scheme is None and not h.ignored):
                out[shard.name] = entry
    return out
