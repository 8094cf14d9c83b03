"""vLLM's module tree for Clef: the layer names vLLM asks the quantization config about.

vLLM fuses Hugging Face projections (q/k/v -> ``qkv_proj`` ...) and renames prefixes
(``model.language_model.`` -> ``language_model.model.``), and it matches a checkpoint's
quantization patterns against *its* names, not the ones the quantizer saw. Everything here is
derived from ``model_spec.linear_modules`` (one source of truth for the HF tree) plus the few
vLLM facts below, read from the vLLM 0.28.0 source (``models/qwen3_5.py``, ``qwen3_vl.py``,
``qwen3_next.py``, ``layers/mamba/gdn/qwen_gdn_linear_attn.py``; unchanged in 0.33.0) and proven
by tests/tier_vllm. The rules that differ between vLLM versions live in ``VERSION_TABLE`` and nowhere else.
"""

from __future__ import annotations

import re
from functools import lru_cache

from clef_format.records import Record

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Mapping

from clef_format.spec.model_spec import LinearSpec, ModelConfig, linear_modules, table_shape

MULTIMODAL_ARCH = "Qwen3_5ForConditionalGeneration"
TEXT_ARCH = "Qwen3_5ForCausalLM"


class VersionRule(Record):
    """One rule of vLLM's compressed-tensors handling that changed between vLLM versions."""

    name: str  # the VersionRules field it sets
    since: tuple[int, int]  # the first vLLM minor version with the new behaviour
    source: str  # the vLLM file and function it comes from
    before: str  # the behaviour up to ``since``
    after: str  # the behaviour from ``since`` on


#: THE version table: every rule of the resolver that differs between vLLM versions, read from each
#: version's wheel (0.28.0 to 0.33.0); tests/tier_vllm proves both sides on the versions in PROVEN.
VERSION_TABLE: tuple[VersionRule, ...] = (
    VersionRule(
        "fused_name_ignore", (0, 30),
        "layers/quantization/compressed_tensors/utils.py should_ignore_layer -> "
        "layers/quantization/utils/config_utils.py find_matching_patterns",
        "an ignore entry is tested against each shard of a fused layer (only an exact fused name "
        "ignores it whole); a partly ignored fused layer raises ValueError",
        "an ignore entry matching the fused name itself (a regex too) ignores the whole fused layer; "
        "otherwise each shard is tested as before"),
    VersionRule(
        "actorder_group_refused", (0, 30),
        "layers/quantization/compressed_tensors/compressed_tensors.py "
        "CompressedTensorsConfig._quantization_scheme_map_from_config",
        "weights with actorder group/dynamic are accepted (WNA16 reorders by g_idx)",
        "weights with actorder group/dynamic (or true) make vLLM refuse the whole config (ValueError)"),
    VersionRule(
        "w4a8_int_needs_int", (0, 31),
        "layers/quantization/compressed_tensors/compressed_tensors.py "
        "CompressedTensorsConfig._is_dynamic_token_w4a8_int",
        "4-bit channel/group weights with 8-bit dynamic per-token input select CompressedTensorsW4A8Int "
        "whatever their types (float W4 + FP8 input too)",
        "CompressedTensorsW4A8Int needs int weights and int input; otherwise no scheme (NotImplementedError)"),
    VersionRule(
        "mxfp4_w4a8_fp8", (0, 32),
        "layers/quantization/compressed_tensors/compressed_tensors.py "
        "CompressedTensorsConfig._get_scheme_from_parts / _is_mxfp4_w4a8_fp8",
        "MXFP4 weights select CompressedTensorsW4A4Mxfp4 whatever the input activations",
        "MXFP4 weights with symmetric 8-bit float dynamic per-token/group input select "
        "CompressedTensorsW4A8Mxfp4 (checked before MXFP4 W4A4)"),
)
#: Versions tests/tier_vllm runs against (docs/VLLM.md); the others' rules are read from source, not run.
PROVEN: tuple[str, ...] = ("0.28", "0.33")
#: The version the clef-vllm serving plugin pins.
DEFAULT_VLLM = "0.28"


class VersionRules(Record):
    """The rules of one vLLM version (one field per VERSION_TABLE row)."""

    fused_name_ignore: bool
    actorder_group_refused: bool
    w4a8_int_needs_int: bool
    mxfp4_w4a8_fp8: bool
    #: Whether tests/tier_vllm runs against this version (see docs/VLLM.md).
    proven: bool


_OLDEST = (0, 28)  # the oldest version whose source was read


def version_key(version: str) -> tuple[int, int]:
    parts = version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise ValueError(f"not a vLLM version: {version!r}") from None


@lru_cache(maxsize=32)
def rules_for(version: str = DEFAULT_VLLM) -> VersionRules:
    """The rule set of ``version`` ("0.28", "0.28.1", "0.33.0")."""
    key = version_key(version)
    if key < _OLDEST:
        raise ValueError(f"vLLM {version} is older than any version clef-format knows")
    flags = {rule.name: key >= rule.since for rule in VERSION_TABLE}
    return VersionRules(**flags, proven=any(version_key(p) == key for p in PROVEN))


#: What a vLLM version given by a user may be: major.minor or major.minor.patch, ASCII digits only.
_RELEASE = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(\.(0|[1-9][0-9]*))?", re.ASCII)


def check_vllm_version(version: object) -> str:
    """``version`` itself when clef-format has rules for it ("0.28", "0.33.0", "0.34": ``rules_for``);
    else ``UsageError`` (a bad argument) saying what to pass."""
    from clef_format.errors import UsageError

    try:
        if not isinstance(version, str) or not _RELEASE.fullmatch(version):  # no rc, dev, local, spaces, "0.28.x"
            raise ValueError(f"not a vLLM version: {version!r}")
        rules_for(version)
    except ValueError as exc:
        raise UsageError(str(exc), fix=f"give a vLLM version as major.minor[.patch], {_OLDEST[0]}.{_OLDEST[1]} or "
                                       f"later (proven: {', '.join(PROVEN)})") from None
    return version


def differing_rules(a: str, b: str) -> list[VersionRule]:
    """The VERSION_TABLE rows on which vLLM ``a`` and ``b`` differ."""
    ka, kb = version_key(a), version_key(b)
    return [r for r in VERSION_TABLE if (ka >= r.since) != (kb >= r.since)]


#: ``packed_modules_mapping`` of each class, in vLLM's dict order (the order matters:
#: vLLM's fused-target rule takes the first key the layer name ends with).
_TEXT_PACKED: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
    "in_proj_qkvz": ("in_proj_qkv", "in_proj_z"),
    "in_proj_ba": ("in_proj_b", "in_proj_a"),
}
_MM_PACKED: dict[str, tuple[str, ...]] = {
    "qkv_proj": _TEXT_PACKED["qkv_proj"],
    "gate_up_proj": _TEXT_PACKED["gate_up_proj"],
    "qkv": ("qkv",),  # the vision tower's already-packed qkv
    "in_proj_qkvz": _TEXT_PACKED["in_proj_qkvz"],
    "in_proj_ba": _TEXT_PACKED["in_proj_ba"],
}

#: ``hf_to_vllm_mapper.orig_to_new_prefix`` of each class (applied in order, each at most once).
_MM_PREFIXES: tuple[tuple[str, str | None], ...] = (
    ("model.visual.", "visual."),
    ("lm_head.", "language_model.lm_head."),
    ("model.language_model.", "language_model.model."),
)
_TEXT_PREFIXES: tuple[tuple[str, str | None], ...] = (("model.language_model.", "model."),)

#: vLLM layer class per module suffix (for the class-name fallback of target matching).
_CLASS_BY_SUFFIX: dict[str, str] = {
    "self_attn.qkv_proj": "QKVParallelLinear",
    "self_attn.o_proj": "RowParallelLinear",
    "mlp.gate_up_proj": "MergedColumnParallelLinear",
    "mlp.down_proj": "RowParallelLinear",
    "linear_attn.in_proj_qkvz": "MergedColumnParallelLinear",
    "linear_attn.in_proj_ba": "MergedColumnParallelLinear",
    "linear_attn.out_proj": "RowParallelLinear",
    "attn.qkv": "QKVParallelLinear",
    "attn.proj": "RowParallelLinear",
    "mlp.linear_fc1": "ColumnParallelLinear",
    "mlp.linear_fc2": "RowParallelLinear",
    "merger.linear_fc1": "ColumnParallelLinear",
    "merger.linear_fc2": "RowParallelLinear",
    "lm_head": "ParallelLMHead",
}

#: Class of the Hugging Face modules the quantizer saw (every Clef linear is ``nn.Linear``).
HF_LINEAR_CLASSES: tuple[str, ...] = ("Linear", "Module")


class VllmLayer(Record):
    """One layer vLLM offers to the quantization config, with the HF modules it is built from."""

    name: str  # vLLM prefix, e.g. language_model.model.layers.3.self_attn.qkv_proj
    cls: str  # vLLM class name, e.g. QKVParallelLinear
    shards: tuple[LinearSpec, ...]  # HF modules in shard order (one for unfused layers)
    layer: int | None  # decoder layer index; None for vision and lm_head
    group: str  # self_attn | linear_attn | mlp | vision | lm_head

    @property
    def fused(self) -> str | None:
        """The packed-mapping key when vLLM fuses several HF modules into this layer."""
        return self.name.rsplit(".", 1)[-1] if len(self.shards) > 1 else None

    @property
    def out_features(self) -> int:
        return sum(s.out_features for s in self.shards)

    @property
    def in_features(self) -> int:
        return self.shards[0].in_features


class VllmModel(Record):
    """vLLM's view of one config: class, layers, packed mapping and name mapper."""

    arch: str
    version: str
    layers: tuple[VllmLayer, ...]
    packed: Mapping[str, tuple[str, ...]]
    prefixes: tuple[tuple[str, str | None], ...]

    def map_name(self, name: str) -> str | None:
        """``WeightsMapper._map_name`` for prefix rules: each matching prefix rewrites once, in order."""
        for old, new in self.prefixes:
            if name.startswith(old):
                if new is None:
                    return None
                name = name.replace(old, new, 1)
        return name


def vllm_arch(cfg: ModelConfig) -> str:
    """The vLLM class that serves ``cfg``: a vision config means the multimodal class."""
    return MULTIMODAL_ARCH if cfg.multimodal else TEXT_ARCH


def packed_modules_mapping(cfg: ModelConfig) -> dict[str, tuple[str, ...]]:
    return packed_for_arch(vllm_arch(cfg))


def packed_for_arch(arch: str) -> dict[str, tuple[str, ...]]:
    """``packed_modules_mapping`` of a vLLM class (it depends on the class alone)."""
    return dict(_MM_PACKED if arch == MULTIMODAL_ARCH else _TEXT_PACKED)


def mapper_prefixes(cfg: ModelConfig, version: str = DEFAULT_VLLM) -> tuple[tuple[str, str | None], ...]:
    """The prefix rules vLLM applies to config targets. From 0.29 ``hf_to_vllm_mapper`` also maps
    ``mtp.`` to None, but the quantization config is mapped with ``get_rename_mapper()``, which drops
    None mappings (model_loader/utils.py configure_quant_config): ``mtp.`` targets pass unchanged."""
    rules_for(version)  # validates the version
    return _MM_PREFIXES if cfg.multimodal else _TEXT_PREFIXES


def lm_head_spec(cfg: ModelConfig) -> LinearSpec:
    """The HF ``lm_head`` as a Linear module (it is one in transformers; vLLM builds ParallelLMHead)."""
    vocab, hidden = table_shape(cfg)
    return LinearSpec("lm_head", vocab, hidden)


def _class_for(name: str) -> str:
    """The class of a vLLM layer, by its last two name components (or its last one: ``lm_head``)."""
    parts = name.rsplit(".", 2)
    cls = _CLASS_BY_SUFFIX.get(".".join(parts[-2:])) or _CLASS_BY_SUFFIX.get(parts[-1])
    if cls is None:
        raise KeyError(f"no vLLM class known for {name}")
    return cls


def _group_of(vllm_name: str) -> tuple[str, int | None]:
    parts = vllm_name.split(".")
    if "layers" in parts:
        i = parts.index("layers")
        return parts[i + 2], int(parts[i + 1])
    if parts[-1] == "lm_head":
        return "lm_head", None
    return "vision", None


#: The last ``build`` (config, version, model): verify's pattern and global-scale checks ask for the same
#: layer list of the same config object (a 9B one takes 5 ms to build).
_LAST_BUILD: list[tuple[ModelConfig, str, VllmModel]] = []


def build(cfg: ModelConfig, version: str = DEFAULT_VLLM) -> VllmModel:
    """vLLM's layer list for ``cfg``, in model order, derived from the HF linear modules (read-only)."""
    if _LAST_BUILD and _LAST_BUILD[0][0] is cfg and _LAST_BUILD[0][1] == version:
        return _LAST_BUILD[0][2]
    model = _build(cfg, version)
    _LAST_BUILD[:] = [(cfg, version, model)]
    return model


def _build(cfg: ModelConfig, version: str) -> VllmModel:
    packed = packed_modules_mapping(cfg)
    shard_to_fused = {s: fused for fused, shards in packed.items() for s in shards}
    model = VllmModel(vllm_arch(cfg), version, (), packed, mapper_prefixes(cfg, version))
    grouped: dict[str, list[LinearSpec]] = {}
    for spec in [*linear_modules(cfg), lm_head_spec(cfg)]:
        # vLLM maps weight names ("lm_head.weight"), so map the module through its weight.
        mapped = model.map_name(spec.name + ".weight")
        if mapped is None:
            continue
        mapped = mapped.removesuffix(".weight")
        head, _, last = mapped.rpartition(".")
        fused = shard_to_fused.get(last, last)
        grouped.setdefault(f"{head}.{fused}" if head else fused, []).append(spec)
    layers: list[VllmLayer] = []
    for name, specs in grouped.items():
        fused = name.rsplit(".", 1)[-1]
        order = packed.get(fused)
        if order is not None:
            specs.sort(key=lambda s: order.index(s.name.rsplit(".", 1)[-1]))
        group, index = _group_of(name)
        layers.append(VllmLayer(name, _class_for(name), tuple(specs), index, group))
    return VllmModel(model.arch, version, tuple(layers), packed, model.prefixes)
