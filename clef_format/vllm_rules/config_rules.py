"""config.json values that make vLLM (or transformers, through which vLLM reads config.json) refuse a
Clef checkpoint or build a model its weights do not fit, although every tensor shape still agrees.

Each rule is read from the vLLM 0.28.0 and 0.33.0 wheels and transformers 5.20 / 5.24 (the versions
the real-vLLM tiers install); the source of each is named beside it. Pure: no torch, no vllm.
"""

from __future__ import annotations

import json
import math
import struct

from clef_format.records import Record

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any, Mapping

from clef_format.spec.model_spec import DEFAULT_HEAD_DIM, ModelConfig
from clef_format.vllm_rules import config_types as T
from clef_format.vllm_rules.names import MULTIMODAL_ARCH, vllm_arch

#: ``model_type`` per served class: transformers' AutoConfig picks the config class by it (an unknown
#: or missing one is refused: "does not recognize this architecture" / "Should have a model_type key").
MODEL_TYPE = {MULTIMODAL_ARCH: "qwen3_5", "Qwen3_5ForCausalLM": "qwen3_5_text"}
#: The text config's model_type: vLLM's Qwen3_5DecoderLayer builds its MLP only for this value and
#: raises ``ValueError("Invalid model_type ...")`` otherwise (models/qwen3_5.py); transformers keeps
#: whatever the dict says (configuration_utils.create_subconfig), and a dict without one gets this.
TEXT_MODEL_TYPE = "qwen3_5_text"
#: vLLM's Qwen3.5 MLP (qwen2_moe.Qwen2MoeMLP): "Only silu is supported for now".
TEXT_ACT = "silu"
#: ``_ACTIVATION_REGISTRY`` of layers/activation.py (0.28 and 0.33 alike): the vision MLP looks its
#: activation up there (qwen3_vl.py ``_ACTIVATION_REGISTRY[vision_config.hidden_act]``, a KeyError otherwise).
VISION_ACTS = frozenset({"gelu", "gelu_fast", "gelu_new", "gelu_pytorch_tanh", "relu", "relu2", "silu", "swish",
                         "quick_gelu", "tanh", "sigmoid", "xielu"})
#: ``rope_type`` values ``get_rope`` (layers/rotary_embedding/__init__.py) builds; any other raises
#: ``ValueError("Unknown RoPE scaling type")``. Read from each proven version's wheel.
ROPE_TYPES = {
    "0.28": frozenset({"default", "proportional", "llama3", "mllama4", "linear", "ntk", "dynamic", "xdrope", "yarn",
                       "longrope", "openpangu", "telechat3-yarn"}),
    "0.33": frozenset({"bailing_mrope", "default", "proportional", "llama3", "mllama4", "linear", "ntk", "dynamic",
                       "yarn", "longrope", "openpangu"}),
}
#: ``Qwen3_5Config``'s special token ids and their transformers defaults (used when a key is absent).
TOKEN_IDS = {"image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
             "vision_end_token_id": 248054}


class ConfigProblem(Record):
    """One config.json value vLLM or transformers cannot serve these weights with."""

    key: str  # dotted path in config.json
    message: str
    fix: str


def set_fix(key: str, value: Any, rel: str = "config.json") -> str:
    """The one phrasing of an edit fix (tests/scenarios/test_fixes.py applies it)."""
    return f"set {json.dumps(key)}: {json.dumps(value)} in {rel}"


def config_problems(raw: Mapping[str, Any], cfg: ModelConfig, tables_stored: bool = True) -> list[ConfigProblem]:
    """Every problem of ``raw`` (config.json, already parsed into ``cfg``) under the rules above.

    ``tables_stored``: the checkpoint stores embed_tokens and lm_head as two tables (every Clef layout
    does: the backbone, the int8 tables file or the release).
    """
    typed = type_problems(raw, tables_stored)
    out: list[ConfigProblem] = []
    arch = vllm_arch(cfg)
    text_raw = raw.get("text_config") if cfg.multimodal or isinstance(raw.get("text_config"), dict) else raw
    text_prefix = "text_config." if text_raw is not raw else ""
    if not isinstance(text_raw, dict):
        text_raw = {}
    if cfg.architecture != arch:
        out.append(ConfigProblem(
            "architectures", f"architectures[0] is {cfg.architecture!r}, but this config (with"
            f"{'' if cfg.multimodal else 'out'} vision_config) is served by {arch}: vLLM builds the class "
            "architectures names (an unknown name is refused, another class does not fit these weights)",
            set_fix("architectures", [arch])))
    want_type = MODEL_TYPE[arch]
    model_type = raw.get("model_type")
    if model_type != want_type:
        what = "has no model_type" if model_type is None else f"has model_type {model_type!r}"
        out.append(ConfigProblem(
            "model_type", f"config.json {what}: transformers' AutoConfig, which vLLM reads config.json with, picks "
            f"the config class by it and needs {want_type!r} for {arch}", set_fix("model_type", want_type)))
    if text_prefix and "model_type" in text_raw and text_raw["model_type"] != TEXT_MODEL_TYPE:
        out.append(ConfigProblem(
            "text_config.model_type", f"text_config.model_type is {text_raw['model_type']!r}: vLLM's Qwen3.5 decoder "
            f"layer raises ValueError (Invalid model_type) for anything but {TEXT_MODEL_TYPE!r}",
            set_fix("text_config.model_type", TEXT_MODEL_TYPE)))
    act = text_raw.get("hidden_act", TEXT_ACT)
    if act != TEXT_ACT:
        out.append(ConfigProblem(
            f"{text_prefix}hidden_act", f"{text_prefix}hidden_act is {act!r}: vLLM's Qwen3.5 MLP supports only "
            f"{TEXT_ACT!r} (ValueError)", set_fix(f"{text_prefix}hidden_act", TEXT_ACT)))
    out += _rope_problems(text_raw, text_prefix)
    out += _number_problems(text_raw, text_prefix)
    out += _mrope_problems(text_raw, text_prefix)
    if cfg.vision is not None:  # multimodal
        vision = raw.get("vision_config") or {}
        vact = vision.get("hidden_act", "gelu_pytorch_tanh")
        if not isinstance(vact, str) or vact not in VISION_ACTS:
            out.append(ConfigProblem(
                "vision_config.hidden_act", f"vision_config.hidden_act is {vact!r}, not an activation vLLM knows "
                "(KeyError building the vision MLP)", set_fix("vision_config.hidden_act", "gelu_pytorch_tanh")))
        heads = vision.get("num_heads", 16)
        if isinstance(heads, int) and not isinstance(heads, bool) and (heads <= 0 or cfg.vision.hidden_size % heads):
            out.append(ConfigProblem(
                "vision_config.num_heads", f"vision_config.num_heads {heads} does not divide vision_config.hidden_size "
                f"{cfg.vision.hidden_size}: vLLM's vision attention splits the width into equal heads (divide() "
                "asserts)", f"set vision_config.num_heads to the value of the export (a divisor of "
                f"{cfg.vision.hidden_size}; Qwen3.5: 16)"))
        out += _token_problems(raw, cfg.text.vocab_size)
    if tables_stored:
        keys = ["tie_word_embeddings"] if not text_prefix else ["tie_word_embeddings", "text_config.tie_word_embeddings"]
        for key in keys:
            holder = text_raw if key.startswith("text_config.") else raw
            if holder.get(key.rsplit(".", 1)[-1]) is True:
                if not text_prefix:
                    reader = "vLLM and transformers tie lm_head to embed_tokens, and one stored table is lost"
                elif key.startswith("text_config."):
                    reader = "vLLM reads the text config and ties lm_head to embed_tokens: one stored table is lost"
                else:
                    reader = "transformers ties lm_head to embed_tokens and drops the stored lm_head"
                out.append(ConfigProblem(
                    key, f"{key} is true, but this checkpoint stores embed_tokens and lm_head as two tables "
                    f"(Clef's lm_head is untied): {reader}", set_fix(key, False)))
    seen = {p.key for p in typed}  # a value of the wrong type: that one finding, not a second about the value
    return typed + [p for p in out if p.key not in seen]


def type_problems(raw: Mapping[str, Any], tables_stored: bool = True) -> list[ConfigProblem]:
    """A value of a JSON type transformers' strict config classes refuse (``config_types``), per key."""
    out: list[ConfigProblem] = []
    for key, cls, types, value in T.type_problems(raw):
        ok, value_fix = T.repaired(types, value)
        if tables_stored and key.rsplit(".", 1)[-1] == "tie_word_embeddings":
            ok, value_fix = True, False  # whatever "true" or 1 meant: two stored tables are untied (the rule below)
        out.append(ConfigProblem(
            key, f"{key} is {T.got(value)}, but transformers' {cls} accepts only {T.describe(types)} there and "
            "refuses the config otherwise (strict field validation): neither transformers nor vLLM, which reads "
            "config.json through it, loads this checkpoint",
            set_fix(key, value_fix) if ok else f"set {key} to {T.describe(types)}: the value of the original "
            "export"))
    return out


def _rope_problems(text: Mapping[str, Any], prefix: str) -> list[ConfigProblem]:
    rope = text.get("rope_parameters")
    if not isinstance(rope, dict):
        return []
    out: list[ConfigProblem] = []
    key = f"{prefix}rope_parameters"
    factor = rope.get("partial_rotary_factor")
    number = isinstance(factor, (int, float)) and not isinstance(factor, bool)
    if rope.get("rope_dim") is None and factor is not None and not (number and 0.0 < factor <= 1.0):
        out.append(ConfigProblem(
            f"{key}.partial_rotary_factor", f"{key}.partial_rotary_factor is {factor!r}: vLLM's get_rope refuses "
            "anything but a number in (0, 1] (ValueError)", set_fix(f"{key}.partial_rotary_factor", 0.25)))
    rope_type = rope.get("rope_type", "default")
    known = [v for v, types in ROPE_TYPES.items() if isinstance(rope_type, str) and rope_type in types]
    if len(known) < len(ROPE_TYPES):
        where = "neither vLLM 0.28 nor 0.33" if not known else \
            "vLLM " + " and ".join(v for v in ROPE_TYPES if v not in known) + f" (only {', '.join(known)})"
        out.append(ConfigProblem(
            f"{key}.rope_type", f"{key}.rope_type {rope_type!r} is a RoPE type {where} builds (ValueError: Unknown "
            "RoPE scaling type)", set_fix(f"{key}.rope_type", "default")))
    return out


#: How vLLM computes with a number of ``NUMBERS``: as written (an integer count), or cast to float32
#: (torch casts a Python float into a float32 tensor by rounding to nearest: past float32's largest value
#: it is infinite, below its smallest subnormal 0), or cast to float32 with its reciprocal bounding every
#: result as well (RoPE: each inv_freq lies between 1 and 1/theta).
AS_WRITTEN, FLOAT32, FLOAT32_AND_INVERSE = "as written", "float32", "float32 and 1/x"
#: Numbers the text model computes with, and the range each must lie in: (key, lowest, lowest allowed,
#: arithmetic, why). vLLM's RMSNorm computes ``x * rsqrt(mean(x^2) + eps)`` in float32 (layers/layernorm.py):
#: a NaN eps makes every norm output NaN, a negative one NaN wherever the mean square is below -eps, an
#: infinite one (in float32: from 3.4028236e38) zero. RoPE's ``inv_freq = 1.0 / (base ** (torch.arange(0,
#: rotary_dim, 2, dtype=torch.float) / rotary_dim))`` (rotary_embedding/base.py) casts theta to float32 and
#: raises it to exponents in [0, 1): each inv_freq lies between 1 and 1/theta, so all are finite and nonzero,
#: for every rotary_dim, while theta and 1/theta are finite and nonzero in float32 (theta in (2.9387366e-39,
#: 3.4028236e38)); outside, NaN for a NaN or negative theta, infinite (cos/sin NaN) for one that is 0 in float32,
#: 0 for one past float32's range (no position encoded), and for one whose reciprocal overflows float32 the
#: cos/sin cache's angles position x inv_freq overflow from position 2. The RoPE cache holds
#: ``max_position_embeddings`` positions (torch.arange refuses a negative length).
_NORM = ("vLLM's RMSNorm scales by 1/sqrt(mean(x^2) + eps) in float32: a NaN eps makes every norm output NaN, a "
         "negative one NaN wherever mean(x^2) < -eps, an infinite one 0")
_ROPE = ("vLLM's RoPE frequencies 1/theta^(2i/d), computed in float32 and lying between 1 and 1/theta, are then NaN "
         "or infinite (every attention score NaN), or 0 for an infinite theta (no position encoded)")
NUMBERS = (("rms_norm_eps", 0.0, True, FLOAT32, _NORM),
           ("rope_parameters.rope_theta", 0.0, False, FLOAT32_AND_INVERSE, _ROPE),
           ("rope_theta", 0.0, False, FLOAT32_AND_INVERSE, _ROPE),
           ("max_position_embeddings", 1, True, AS_WRITTEN, "vLLM's RoPE cache holds that many positions "
            "(torch.arange refuses a negative length; none: no position at all)"))
#: The longest ``torch.arange(n, dtype=torch.float)`` torch makes (2**60 - 1; longer: RuntimeError "Storage size
#: calculation overflowed", measured on torch 2.13 with the meta device, whatever the memory): vLLM's RoPE cache
#: starts from it, so a longer ``max_position_embeddings`` cannot start the engine. tests compare with torch.
MAX_ARANGE = 2**60 - 1
#: The values a fix sets: Qwen3.5's own (config_full.json, the real exports).
NUMBER_FIXES = {"rms_norm_eps": 1e-06}
#: float32's largest finite value: a Python float at or past the midpoint above it casts to infinity.
FLOAT32_MAX = 3.4028234663852886e38


def float32(x: float) -> float:
    """``x`` as a float32 tensor holds it: rounded to nearest (ties to even), infinite past float32's range,
    0 below half its smallest subnormal; stdlib only (struct's float32 packing rounds as torch casts)."""
    try:
        return struct.unpack("<f", struct.pack("<f", float(x)))[0]
    except OverflowError:  # finite (or an int) beyond float32: the cast gives infinity of its sign
        return math.inf if x > 0 else -math.inf


def _out_of_range(value: float, low: float, inclusive: bool, arithmetic: str) -> str | None:
    """Why ``value`` lies outside its range as vLLM computes with it (``NUMBERS``); None: inside."""
    if isinstance(value, float) and not math.isfinite(value):
        return "not a finite number"
    if arithmetic == AS_WRITTEN and value > MAX_ARANGE:
        return f"over {MAX_ARANGE}, the longest torch.arange makes (RuntimeError)"
    used = value if arithmetic == AS_WRITTEN else float32(value)  # an int as written: finite, however large
    if isinstance(used, float) and not math.isfinite(used):
        return f"beyond float32's largest value {FLOAT32_MAX:.8g}: infinite in the float32 vLLM computes with"
    bound = f"{'below' if inclusive else 'not above'} {low}"
    if not (value >= low if inclusive else value > low):
        return bound
    if not (used >= low if inclusive else used > low):  # rounded there: a tiny theta is 0 in float32
        return f"{used:g} in the float32 vLLM computes with, {bound}"
    if arithmetic == FLOAT32_AND_INVERSE and not math.isfinite(float32(1.0 / used)):
        return (f"{used:.8g} in the float32 vLLM computes with: its reciprocal is beyond float32's largest value "
                f"{FLOAT32_MAX:.8g}, infinite there")
    return None


def _lookup(d: Mapping[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = d
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _number_problems(text: Mapping[str, Any], prefix: str) -> list[ConfigProblem]:
    """A number the model computes with that is NaN, infinite or out of its range (``NUMBERS``)."""
    out: list[ConfigProblem] = []
    for sub, low, inclusive, arithmetic, why in NUMBERS:
        present, value = _lookup(text, sub)
        if sub == "rope_theta" and _lookup(text, "rope_parameters.rope_theta")[0]:
            continue  # transformers drops the legacy key when rope_parameters has its own (vLLM never sees it)
        if present and "." in sub and not isinstance(value, (int, float)):
            # nested (rope_parameters.*): no config class types it and transformers keeps it as written,
            # so vLLM's arithmetic meets it (base ** arange: TypeError for a string or null)
            key = f"{prefix}{sub}"
            out.append(ConfigProblem(key, f"{key} is {json.dumps(value)} (not a number): {why}",
                                     f"set {key} to the value of the original export (a number)"))
            continue
        if not present or not isinstance(value, (int, float)) or isinstance(value, bool):
            continue  # absent: transformers' default; another JSON type at the top level: the type rule reports it
        what = _out_of_range(value, low, inclusive, arithmetic)
        if what is None:
            continue
        key = f"{prefix}{sub}"
        fix = NUMBER_FIXES.get(sub)
        out.append(ConfigProblem(
            key, f"{key} is {json.dumps(value)} ({what}): {why}",
            set_fix(key, fix) if fix is not None else f"set {key} to the value of the original export"))
    return out


def rotary_dim(head_dim: int, rope: Mapping[str, Any]) -> int | None:
    """vLLM's ``get_rope``: ``rope_dim`` when set (truthy), else ``int(head_dim * partial_rotary_factor)``
    (default 1.0); None where get_rope itself fails first (the partial_rotary_factor rule reports it)."""
    dim = rope.get("rope_dim")
    if dim:
        return dim if isinstance(dim, int) and not isinstance(dim, bool) else None
    factor = rope.get("partial_rotary_factor", 1.0)
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not math.isfinite(factor) \
            or not 0.0 < factor <= 1.0:
        return None
    return int(head_dim * factor)


def _sum(section: Any) -> float | None:
    """Python's ``sum(section)`` over a parsed JSON value, None where it raises TypeError (a string, a
    number, null, a list holding anything but numbers; booleans count as 0/1 as in Python)."""
    if not isinstance(section, list) or not all(isinstance(v, (int, float)) for v in section):
        return None if section else 0
    return sum(section)


def _builds_mrope(rope: Mapping[str, Any]) -> bool:
    """Whether get_rope builds ``MRotaryEmbedding`` (0.28 and 0.33): an ``mrope_section`` under rope_type
    ``default`` or ``yarn``, the types a Qwen3.5 config uses."""
    return "mrope_section" in rope and rope.get("rope_type", "default") in ("default", "yarn")


def mrope_forward_rule(rope: Mapping[str, Any]) -> str | None:
    """Why vLLM's M-RoPE cannot take this ``mrope_section``'s entries as counts (None: it can). Called where
    ``mrope_rule`` (get_rope, which checks only the sum) found nothing.

    vLLM declares the section ``list[int]`` (0.28 and 0.33, mrope.py). Where ``mrope_interleaved`` is
    off, ``MRotaryEmbedding.forward_native`` (the CPU's path, and the GPU's under torch.compile's default
    ``custom_ops`` "none") splits the cos/sin cache with ``cos.split(self.mrope_section, dim=-1)``: torch's
    split_with_sizes takes only integers (a float or a boolean: TypeError) and none negative
    (RuntimeError); a 0 is an empty split, which works. 0.33's ROCm op ``vllm.mrope`` takes ints as
    well. The interleaved paths only compare channel indices with 3 x count, which a float passes and a
    negative count reads as 0: the rule asks for the declared form there too.
    """
    if not _builds_mrope(rope) or not isinstance(rope["mrope_section"], list):
        return None
    for entry in rope["mrope_section"]:
        if isinstance(entry, bool) or not isinstance(entry, int):
            what = f"{json.dumps(entry)} is not an integer"
        elif entry < 0:
            what = f"{entry} is negative"
        else:
            continue
        return (f"its entry {what}: vLLM's M-RoPE takes integer counts >= 0 (its forward pass splits the cos/sin "
                "cache by them with torch.split: TypeError for a float or a boolean, RuntimeError for a negative "
                "count)")
    return None


def mrope_rule(rope: Mapping[str, Any], head_dim: int) -> str | None:
    """Why vLLM's ``get_rope`` refuses this ``mrope_section`` (None: it builds the embedding).

    0.28 and 0.33 alike (rotary_embedding/__init__.py, mrope.py): ``default`` and ``yarn``, the types a
    Qwen3.5 config uses, build ``MRotaryEmbedding`` whenever ``mrope_section`` is present; it checks a
    non-empty (truthy) section with ``assert sum(mrope_section) == rotary_dim // 2``, and
    ``mrope_interleaved`` (any value) only changes the forward pass. Before that, get_rope keys its
    cache by the parameters (lists as tuples): an object, or a list holding one or a list, raises
    TypeError. Not covered: ``openpangu``
    (``MRotaryEmbeddingInterleaved``) and 0.33's ``bailing_mrope``, other model families' types.
    """
    if not _builds_mrope(rope):
        return None
    section = rope["mrope_section"]
    dim = rotary_dim(head_dim, rope)
    if isinstance(section, dict) or (isinstance(section, list) and any(isinstance(v, (list, dict)) for v in section)):
        return "it cannot be hashed (get_rope keys its cache by the RoPE parameters: TypeError)"
    if dim is None or not section:
        return None  # get_rope fails before (partial_rotary_factor), or MRotaryEmbedding skips its check
    total = _sum(section)
    if total is None:
        return "it is not a list of numbers (TypeError summing it)"
    if total != dim // 2:
        return f"its sum {json.dumps(total)} is not rotary_dim // 2 = {dim // 2} (MRotaryEmbedding asserts it)"
    return None


def _mrope_problems(text: Mapping[str, Any], prefix: str) -> list[ConfigProblem]:
    rope = text.get("rope_parameters")
    head_dim = text.get("head_dim", DEFAULT_HEAD_DIM)
    if not isinstance(rope, dict) or not isinstance(head_dim, int) or isinstance(head_dim, bool):
        return []
    dim = rotary_dim(head_dim, rope) or 0
    why = mrope_rule(rope, head_dim)
    if why is not None:
        why += f"; rotary_dim = head_dim {head_dim} x partial_rotary_factor = {dim}: vLLM refuses to build the " \
            "attention layers' RoPE"
    else:
        why = mrope_forward_rule(rope)
        if why is None:
            return []
    key = f"{prefix}rope_parameters.mrope_section"
    half = dim // 2
    split = [half // 3 + (1 if i < half % 3 else 0) for i in range(3)]  # Qwen3.5: 32 -> [11, 11, 10]
    return [ConfigProblem(
        key, f"{key} is {json.dumps(rope['mrope_section'])}: {why}",
        set_fix(key, split) if half == 32 else f"set {key} to the export's sections (integers >= 0 summing to "
        f"{half or 'rotary_dim // 2'}; Qwen3.5's split of 32 is [11, 11, 10])")]


def _token_problems(raw: Mapping[str, Any], vocab: int) -> list[ConfigProblem]:
    out: list[ConfigProblem] = []
    ids = {k: raw.get(k, default) for k, default in TOKEN_IDS.items()}
    seen: dict[Any, str] = {}
    for key, value in ids.items():
        given = "" if key in raw else f" (absent: transformers' default {value})"
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < vocab:
            out.append(ConfigProblem(key, f"{key} {value!r}{given} is not a token id below vocab_size {vocab}: the "
                                     "embedding lookup of that token fails", f"set {key} to the id the tokenizer gives "
                                     "that token (tokenizer.json added_tokens)"))
        elif value in seen:
            out.append(ConfigProblem(key, f"{key} {value}{given} is also {seen[value]}: the two special tokens cannot "
                                     "share an id", f"set {key} to the id the tokenizer gives that token "
                                     "(tokenizer.json added_tokens)"))
        else:
            seen[value] = key
    return out
