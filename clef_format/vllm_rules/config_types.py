"""The JSON type of every config.json key transformers' Qwen3.5 config classes declare, and the check.

transformers 5 (5.20.2 and 5.24.0 alike, the versions the real-vLLM tiers install) decorates
``Qwen3_5Config``, ``Qwen3_5TextConfig`` and ``Qwen3_5VisionConfig`` with huggingface_hub's
``@strict``: when ``AutoConfig`` reads config.json, every field a class declares itself is checked
against its annotation, and one value of another JSON type refuses the whole config
(``StrictDataclassFieldValidationError``). vLLM reads config.json through ``AutoConfig``, so such a
checkpoint is served by neither.

The types, as that validator (``huggingface_hub.dataclasses.type_validator``) tells them apart:
``int`` is an integer and never a boolean (bool is an int subclass in Python, the validator excludes
it); ``float`` is a JSON number written with a fraction or exponent (``1e-06``, ``0.0``): an integer
such as ``0`` is refused where only ``float`` is declared (``isinstance(0, float)`` is false), and
accepted where the annotation says ``float | int``; ``bool`` is ``true``/``false`` only. Tests
(tests/verify/test_config_types.py) compare this table with those classes' fields and every key and
JSON type with what ``AutoConfig`` does. Pure: no transformers import.

Keys the tensor tree is computed from are parsed first by ``spec.model_spec`` (a wrong type there
is ``bad-config``); this table catches the rest (``config-invalid``).
"""

from __future__ import annotations

import json
import math
import re
import sys

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any, Mapping

#: Type names: a JSON type (null, bool, int, float, str, list, object) or a list of one (``list[int]``).
Types = tuple  # of type names

#: What ``PreTrainedConfig`` (the base of the three) refuses. ``@strict`` validates only the fields a
#: class declares itself, so the base's own annotations (``architectures``, ``return_dict``,
#: ``transformers_version``...) are not checked; its ``__post_init__`` iterates ``id2label`` (``.items()``)
#: and resolves a ``dtype`` / ``torch_dtype`` string as a torch attribute (``spec.model_spec`` reads
#: those: a float dtype name or null in each part).
BASE_FIELDS: dict[str, Types] = {
    "id2label": ("object", "null"),
}

#: ``Qwen3_5Config`` (model_type qwen3_5, the multimodal config.json's top level).
CONFIG_FIELDS: dict[str, Types] = {
    **BASE_FIELDS,
    "text_config": ("object", "null"),
    "vision_config": ("object", "null"),
    "image_token_id": ("int",),
    "video_token_id": ("int",),
    "vision_start_token_id": ("int",),
    "vision_end_token_id": ("int",),
    "tie_word_embeddings": ("bool",),
}

#: ``Qwen3_5TextConfig`` (``text_config``, or the top level of a text-only qwen3_5_text config.json).
TEXT_FIELDS: dict[str, Types] = {
    **BASE_FIELDS,
    "vocab_size": ("int",),
    "hidden_size": ("int",),
    "intermediate_size": ("int",),
    "num_hidden_layers": ("int",),
    "num_attention_heads": ("int",),
    "num_key_value_heads": ("int",),
    "hidden_act": ("str",),
    "max_position_embeddings": ("int",),
    "initializer_range": ("float",),
    "rms_norm_eps": ("float",),
    "use_cache": ("bool",),
    "tie_word_embeddings": ("bool",),
    "rope_parameters": ("object", "null"),  # RopeParameters (a TypedDict) | dict | None
    "attention_bias": ("bool",),
    "attention_dropout": ("float", "int"),
    "head_dim": ("int",),
    "linear_conv_kernel_dim": ("int",),
    "linear_key_head_dim": ("int",),
    "linear_value_head_dim": ("int",),
    "linear_num_key_heads": ("int",),
    "linear_num_value_heads": ("int",),
    "layer_types": ("list[str]", "null"),
    "pad_token_id": ("int", "null"),
    "bos_token_id": ("int", "null"),
    "eos_token_id": ("int", "list[int]", "null"),
}

#: ``Qwen3_5VisionConfig`` (``vision_config``).
VISION_FIELDS: dict[str, Types] = {
    **BASE_FIELDS,
    "depth": ("int",),
    "hidden_size": ("int",),
    "hidden_act": ("str",),
    "intermediate_size": ("int",),
    "num_heads": ("int",),
    "in_channels": ("int",),
    "patch_size": ("int", "list[int]"),  # int | list[int] | tuple[int, int]: JSON has no tuples
    "spatial_merge_size": ("int",),
    "temporal_patch_size": ("int", "list[int]"),
    "out_hidden_size": ("int",),
    "num_position_embeddings": ("int",),
    "initializer_range": ("float",),
    "rope_parameters": ("object", "null"),
}

#: The class that validates each part of config.json.
CLASSES = {"config": "Qwen3_5Config", "text": "Qwen3_5TextConfig", "vision": "Qwen3_5VisionConfig"}


def json_type(value: Any) -> str:
    """The JSON type of a parsed value, as the validator distinguishes them."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    return "object"


def _is(value: Any, name: str) -> bool:
    if name.startswith("list["):
        return isinstance(value, list) and all(_is(v, name[5:-1]) for v in value)
    return json_type(value) == name


def accepts(types: Types, value: Any) -> bool:
    """Whether transformers' validator accepts ``value`` for a field of ``types``."""
    return any(_is(value, t) for t in types)


_WORDS = {"int": "an integer", "float": "a float (a number with a fraction or exponent, e.g. 1e-06)",
          "bool": "true or false", "str": "a string", "null": "null", "object": "an object", "list": "a list",
          "list[int]": "a list of integers", "list[str]": "a list of strings"}
_GOT = {"int": "an integer", "float": "a float", "bool": "a boolean", "str": "a string", "null": "null",
        "object": "an object", "list": "a list"}


def describe(types: Types) -> str:
    return " or ".join(_WORDS[t] for t in types)


#: The largest integer a Python float holds (float(x) raises OverflowError beyond it).
_FLOAT_MAX_INT = int(sys.float_info.max)


def repaired(types: Types, value: Any) -> tuple[bool, Any]:
    """(True, the same value written as the declared type) when there is exactly one such value:
    ``"1e-6"`` -> ``1e-06``, ``"true"`` / ``1`` -> ``true`` for a bool, ``4.0`` -> ``4``, ``1`` -> ``1.0``."""
    candidates: list[Any] = []
    if isinstance(value, str):
        try:
            candidates.append(json.loads(value))
        except ValueError:
            pass
    if isinstance(value, int) and not isinstance(value, bool):
        if value in (0, 1):
            candidates.append(bool(value))
        if abs(value) <= _FLOAT_MAX_INT:  # a JSON integer has no range; beyond a float's no float equals it
            candidates.append(float(value))
    elif isinstance(value, float) and value.is_integer():
        candidates.append(int(value))
    for c in candidates:
        if accepts(types, c) and (c == value or isinstance(value, str)):
            return True, c
    return False, None


def type_problems(raw: Mapping[str, Any]) -> list[tuple[str, str, Types, Any]]:
    """Every key of config.json whose value's JSON type transformers refuses: (dotted key, the class that
    refuses it, the types it declares, the value), in file order."""
    out: list[tuple[str, str, Types, Any]] = []
    if "text_config" in raw:
        parts = [("", raw, CONFIG_FIELDS, CLASSES["config"]), ("text_config.", raw.get("text_config"), TEXT_FIELDS,
                 CLASSES["text"]), ("vision_config.", raw.get("vision_config"), VISION_FIELDS, CLASSES["vision"])]
    else:
        parts = [("", raw, TEXT_FIELDS, CLASSES["text"])]
    for prefix, d, fields, cls in parts:
        if not isinstance(d, dict):
            continue
        for key, value in d.items():
            types = fields.get(key)
            if types is not None and not accepts(types, value):
                out.append((prefix + key, cls, types, value))
    return out


def got(value: Any) -> str:
    """``'1e-6' (a string)``: a value and its JSON type, for a message."""
    text = json.dumps(value)
    return f"{text if len(text) <= 60 else text[:57] + '...'} ({_GOT[json_type(value)]})"


# ----------------------------------------------------------------------------- compressed-tensors' QuantizationArgs
#
# compressed-tensors' ``QuantizationArgs`` is a pydantic model in lax mode: vLLM and transformers read the
# ``weights`` / ``input_activations`` / ``output_activations`` of a config group through it, and it turns
# ``"8"``, ``8.0`` and ``true`` into the int 8 and ``"true"`` / ``1`` into True before any rule sees them.
# These functions are its rules in the stdlib (the structure path imports neither pydantic nor
# compressed-tensors); tests/spec/test_quant_args_vs_compressed_tensors.py proves them equal to its model
# over generated values of every JSON type. Each returns (True, the coerced value) or (False, why).

#: pydantic-core's string -> int: surrounding whitespace, a sign, ASCII digits with single underscores
#: between them, and a fraction of zeros only ("8.00"); no exponent, no hex.
_INT_TEXT = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*(?:\.0+)?")
#: pydantic-core's string -> bool words (case-insensitive, no surrounding whitespace).
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})


def lax_int(value: Any) -> tuple[bool, Any]:
    """pydantic's lax ``int``: an int, a boolean (0/1), a finite float with no fraction within int64, or
    an integer string."""
    if isinstance(value, bool):
        return True, int(value)
    if isinstance(value, int):
        return True, value
    if isinstance(value, float):
        if not math.isfinite(value):
            return False, "not a finite number"
        if not value.is_integer():
            return False, "a number with a fractional part"
        if not -2.0 ** 63 < value < 2.0 ** 63:
            return False, "too large for an integer"
        return True, int(value)
    if isinstance(value, str):
        text = value.strip()
        if _INT_TEXT.fullmatch(text):
            return True, int(text.split(".")[0])
        return False, "a string that is not an integer"
    return False, f"{_GOT[json_type(value)]}, not an integer"


def lax_bool(value: Any) -> tuple[bool, Any]:
    """pydantic's lax ``bool``: a boolean, 0/1 (int or float), or one of the words true/false, yes/no,
    on/off, t/f, y/n, 1/0 in any case."""
    if isinstance(value, bool):
        return True, value
    if isinstance(value, (int, float)) and value in (0, 1):
        return True, bool(value)
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return True, value.lower() in _TRUE
    return False, f"{json.dumps(value)} is not a boolean"


def quant_group_size(value: Any) -> tuple[bool, Any]:
    """``group_size``: its before-validator compares the value as given (``value < -1``: a string or a
    list raises TypeError, below -1 ValueError), then the lax ``int | None``."""
    if value is None:
        return True, None
    if isinstance(value, (str, list, dict)):
        return False, f"{_GOT[json_type(value)]} cannot be compared with -1 (TypeError)"
    if value < -1:
        return False, f"{value} is below -1"
    return lax_int(value)


def quant_dynamic(value: Any) -> tuple[bool, Any]:
    """``dynamic``: a string must name ``local`` (any case); anything else is a lax ``bool``."""
    if isinstance(value, str):
        return (True, "local") if value.lower() == "local" else (False, f"{value!r} is neither 'local' nor a boolean")
    if value is None or isinstance(value, (list, dict)):
        return False, f"{_GOT[json_type(value)]} is neither 'local' nor a boolean"
    return lax_bool(value)


def quant_str(value: Any) -> tuple[bool, Any]:
    """A ``str | None`` field (``observer``): pydantic does not turn numbers into strings."""
    if value is None or isinstance(value, str):
        return True, value
    return False, f"{_GOT[json_type(value)]}, not a string"


def quant_object(value: Any) -> tuple[bool, Any]:
    """A ``dict[str, Any]`` field (``observer_kwargs``)."""
    if isinstance(value, dict):
        return True, value
    return False, f"{_GOT[json_type(value)]}, not an object"


#: The fields of ``QuantizationArgs`` coerced (or checked) here, and how.
QUANT_FIELDS = {"num_bits": lax_int, "symmetric": lax_bool, "group_size": quant_group_size,
                "dynamic": quant_dynamic, "observer": quant_str, "observer_kwargs": quant_object}
#: Not here: ``block_structure``, whose validator differs between compressed-tensors 0.17 (what the
#: proven vLLM versions install) and 0.20 (positive sizes only); ``matching.parse_args`` keeps its rule.
