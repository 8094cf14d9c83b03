"""config.json's JSON types, proven against transformers itself.

For every key clef-format reads from config.json, ``text_config`` and ``vision_config``, and every key
transformers' Qwen3.5 config classes declare, a value of each JSON type (null, bool, int, float,
string, list, object) is put in a valid checkpoint's config. verify must report an error naming the
key exactly when transformers' ``AutoConfig.from_pretrained`` refuses the file, except where
clef-format is stricter on purpose: ``STRICTER`` lists each such place with the reason (vLLM refuses
the value, or the weights cannot fit the model it describes); the test also proves transformers
really accepts those (the list never goes stale). A set-fix on a type finding, applied, clears it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from clef_format.fixtures.builders import build_checkpoint
from clef_format.spec import layouts as L
from clef_format.verify.run import verify
from clef_format.vllm_rules import config_types as T
from tests.verify.test_config_rules import SET_FIX, apply_set_fix

JSON_TYPES = ("null", "bool", "int", "float", "str", "list", "object")
ALL = frozenset(JSON_TYPES)
_MISSING = object()

#: Keys clef-format reads that transformers' classes do not declare, per part of config.json.
#: (full_attention_interval is read, by both, only without layer_types: the "no-layer-types" variant.)
READ_TOO = {
    "config": ("architectures", "model_type", "torch_dtype", "dtype", "quantization_config"),
    "text": ("model_type", "torch_dtype", "dtype", "attn_output_gate", "rope_parameters.partial_rotary_factor",
             "rope_parameters.rope_type"),
    "vision": ("model_type", "torch_dtype", "dtype"),
}
#: The value an absent key has (where a representative of its own type must mean the same).
DEFAULTS = {"full_attention_interval": 4}

_ARCH = "not type-checked by transformers (a base-class field), but vLLM picks the model class by " \
        "architectures[0] and refuses a config without one"
_DTYPE = "transformers keeps a non-string dtype unchecked (its annotation names torch.dtype); it is the dtype " \
         "every unquantized tensor is stored in, so clef-format needs a float dtype name"
_GATE = "not a field of transformers' config; vLLM sizes q_proj by (1 + attn_output_gate): a string, list, " \
        "object or null crashes it, a number is not the boolean the weights were exported with"
_ROPE_FACTOR = "transformers only reads it; vLLM's get_rope refuses anything but a number in (0, 1] (ValueError)"
_ROPE_TYPE = "transformers only warns (no validation function); vLLM's get_rope raises ValueError: Unknown RoPE " \
             "scaling type"
_QUANT = "not a transformers field; vLLM's compressed-tensors config refuses an object without quant_method"
_NUMBERS = frozenset({"bool", "int", "float", "object"})

#: Where verify refuses a JSON type transformers accepts: key -> (the JSON types, why). Everywhere else
#: verify and transformers agree, type for type; the test proves transformers accepts each of these.
STRICTER: dict[str, tuple[frozenset[str], str]] = {
    "architectures": (ALL - {"list"}, _ARCH),
    "torch_dtype": (_NUMBERS, _DTYPE),
    "dtype": (_NUMBERS, _DTYPE),
    "quantization_config": (frozenset({"object"}), _QUANT),
    # multimodal: Qwen3_5Config with text_config and vision_config
    "text_config": (frozenset({"null"}), "transformers then builds its default 9B text model, which these "
                                         "weights do not fit; clef-format reads the model's shape from it"),
    "vision_config": (frozenset({"null"}), "transformers then builds its default vision tower (27 blocks), "
                                           "which no Clef checkpoint stores"),
    "text_config.torch_dtype": (_NUMBERS, _DTYPE),
    "text_config.dtype": (_NUMBERS, _DTYPE),
    "vision_config.torch_dtype": (_NUMBERS, _DTYPE),
    "vision_config.dtype": (_NUMBERS, _DTYPE),
    "text_config.model_type": (ALL - {"str"}, "transformers keeps any value; vLLM's Qwen3.5 decoder layer raises "
                                              "ValueError (Invalid model_type) for anything but 'qwen3_5_text'"),
    "text_config.full_attention_interval": (frozenset({"bool", "float"}), "not typed by transformers (true makes "
                                            "every layer full attention, 4.0 the usual pattern): Clef's configs "
                                            "carry the integer"),
    "text_config.attn_output_gate": (ALL - {"bool"}, _GATE),
    "text_config.rope_parameters.partial_rotary_factor": (ALL - {"float", "null"}, _ROPE_FACTOR),
    "text_config.rope_parameters.rope_type": (ALL - {"str"}, _ROPE_TYPE),
    "vision_config.patch_size": (frozenset({"list"}), "transformers accepts int | list[int]; vLLM's Qwen3-VL patch "
                                 "embedding builds Conv3d(kernel_size=(temporal_patch_size, patch_size, patch_size)) "
                                 "and multiplies it by spatial_merge_size: only an integer works"),
    "vision_config.temporal_patch_size": (frozenset({"list"}), "as vision_config.patch_size"),
    # text-only: Qwen3_5TextConfig at the top level
    "attn_output_gate": (ALL - {"bool"}, _GATE),
    "rope_parameters.partial_rotary_factor": (ALL - {"float", "null"}, _ROPE_FACTOR),
    "rope_parameters.rope_type": (ALL - {"str"}, _ROPE_TYPE),
}


def _variants() -> dict[str, Any]:
    return {"multimodal": {}, "text-only": {"multimodal": False}, "no-layer-types": {"drop": "layer_types"}}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name, kw in _variants().items():
        root = tmp_path_factory.mktemp("types") / name
        # bf16: a quantization_config of another type would describe weights these are not
        build_checkpoint(root, "layout-2", "bf16", num_layers=4, multimodal=kw.get("multimodal", True))
        if kw.get("drop"):
            cfg = json.loads((root / L.CONFIG).read_text())
            del cfg["text_config"][kw["drop"]]
            (root / L.CONFIG).write_text(json.dumps(cfg))
        assert verify(str(root)).ok, name
        out[name] = root
    return out


def _parts(variant: str) -> list[tuple[str, str, dict[str, T.Types]]]:
    if variant == "text-only":
        return [("", "text", T.TEXT_FIELDS)]
    return [("", "config", T.CONFIG_FIELDS), ("text_config.", "text", T.TEXT_FIELDS),
            ("vision_config.", "vision", T.VISION_FIELDS)]


def _keys(variant: str) -> list[str]:
    keys = []
    for prefix, part, fields in _parts(variant):
        extra = READ_TOO[part] + (READ_TOO["config"] if variant == "text-only" else ())
        keys += [prefix + k for k in dict.fromkeys([*fields, *extra])]
    if variant == "no-layer-types":  # the one key this variant exists for (the others repeat "multimodal")
        keys = ["text_config.full_attention_interval", "text_config.num_hidden_layers"]
    return keys


CASES = [(v, k) for v in _variants() for k in _keys(v)]


def _get(d: Any, key: str) -> Any:
    for k in key.split("."):
        if not isinstance(d, dict) or k not in d:
            return _MISSING
        d = d[k]
    return d


def _set(d: dict[str, Any], key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    for k in parents:
        d = d[k]
    d[leaf] = value


def representatives(current: Any) -> dict[str, Any]:
    """One value per JSON type: the current value where it has that type, else the nearest of that type
    (``"1e-06"`` for a float, ``0`` for 1e-06, ``[v]``...), so a refusal is about the type alone."""
    plain_int = isinstance(current, int) and not isinstance(current, bool)
    return {
        "null": None,
        "bool": current if isinstance(current, bool) else True,
        "int": current if plain_int else (int(current) if isinstance(current, float) else 1),
        "float": current if isinstance(current, float) else (float(current) if plain_int else 1.0),
        "str": current if isinstance(current, str) else ("x" if current is _MISSING else json.dumps(current)),
        "list": current if isinstance(current, list) else ([] if current is _MISSING else [current]),
        "object": current if isinstance(current, dict) else {},
    }


def _brief(errors: list[Any]) -> list[str]:
    return [f"{f.code}: {f.message[:160]}" for f in errors[:3]] + ([f"... {len(errors) - 3} more"] if len(errors) > 3 else [])


def _transformers_refuses(root: Path) -> str | None:
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    try:
        transformers.AutoConfig.from_pretrained(str(root))
    except Exception as exc:  # noqa: BLE001 - any refusal counts: strict validation, post-init, a crash
        return f"{type(exc).__name__}: {exc}"[:300]
    return None


@pytest.mark.parametrize("variant, key", CASES, ids=[f"{v}-{k}" for v, k in CASES])
def test_each_json_type_is_refused_as_transformers_refuses_it(checkpoints, variant: str, key: str) -> None:
    root = checkpoints[variant]
    original = (root / L.CONFIG).read_text()
    base = json.loads(original)
    stricter, why = STRICTER.get(key, (frozenset(), ""))
    current = _get(base, key)
    if current is _MISSING:
        current = DEFAULTS.get(key.rsplit(".", 1)[-1], _MISSING)
    try:
        for jtype, value in representatives(current).items():
            cfg = copy.deepcopy(base)
            _set(cfg, key, value)
            (root / L.CONFIG).write_text(json.dumps(cfg))
            errors = [f for f in verify(str(root)).findings if f.severity == "error"]
            refused = _transformers_refuses(root)
            what = f"{key} = {json.dumps(value)} ({jtype})"
            if jtype in stricter:
                assert errors and refused is None, f"{what}: documented as refused by clef-format only ({why}); " \
                                                   f"clef-format {_brief(errors)}, transformers {refused}"
            else:
                assert bool(errors) == (refused is not None), \
                    f"{what}: clef-format {_brief(errors)}, transformers {refused}"
            if errors:
                assert any(key in f.message for f in errors), (what, [f.message for f in errors])
                for f in errors:
                    if f.code == "config-invalid" and f.fix and SET_FIX.search(f.fix) and key in f.fix:
                        apply_set_fix(root, f.fix)
                        after = [g for g in verify(str(root)).findings if g.severity == "error" and key in g.message]
                        assert not after, (what, f.fix, [g.message for g in after])
    finally:
        (root / L.CONFIG).write_text(original)


def test_the_table_lists_each_field_the_classes_declare_themselves() -> None:
    """``@strict`` validates a class's own fields; the table holds exactly those (plus PreTrainedConfig's
    ``id2label``, which its __post_init__ iterates), so a field added by a new transformers fails here."""
    pytest.importorskip("transformers")
    from transformers import PreTrainedConfig
    from transformers.models.qwen3_5 import configuration_qwen3_5 as Q

    base = {f.name for f in dataclasses.fields(PreTrainedConfig)}
    for cls, fields in ((Q.Qwen3_5Config, T.CONFIG_FIELDS), (Q.Qwen3_5TextConfig, T.TEXT_FIELDS),
                        (Q.Qwen3_5VisionConfig, T.VISION_FIELDS)):
        own = {f.name for f in dataclasses.fields(cls)} - base
        assert set(fields) - set(T.BASE_FIELDS) == own, cls.__name__


@pytest.mark.parametrize("edit, key, fix", [
    (("tie_word_embeddings", "true"), "tie_word_embeddings", 'set "tie_word_embeddings": false in config.json'),
    (("tie_word_embeddings", 1), "tie_word_embeddings", 'set "tie_word_embeddings": false in config.json'),
    (("text_config.rms_norm_eps", "1e-6"), "text_config.rms_norm_eps",
     'set "text_config.rms_norm_eps": 1e-06 in config.json'),
    (("text_config.rms_norm_eps", 0), "text_config.rms_norm_eps", 'set "text_config.rms_norm_eps": 0.0 in config.json'),
    (("text_config.max_position_embeddings", "32768"), "text_config.max_position_embeddings",
     'set "text_config.max_position_embeddings": 32768 in config.json'),
    (("text_config.use_cache", "yes"), "text_config.use_cache", "set text_config.use_cache to true or false"),
    (("text_config.use_cache", 0), "text_config.use_cache", 'set "text_config.use_cache": false in config.json'),
    (("text_config.use_cache", 1), "text_config.use_cache", 'set "text_config.use_cache": true in config.json'),
    (("text_config.use_cache", 2), "text_config.use_cache", "set text_config.use_cache to true or false"),
])
def test_the_reported_hostile_values_are_config_invalid_with_their_fix(fresh, edit, key: str, fix: str) -> None:
    """The values of the report (exit 0 before): each a config-invalid error naming the key, in verify
    and in the serving gate alike."""
    from clef_format.compat import check_checkpoint
    from clef_format.errors import IncompatibleError

    root = fresh("layout-2", "hybrid", num_layers=4)
    cfg = json.loads((root / L.CONFIG).read_text())
    _set(cfg, *edit)
    (root / L.CONFIG).write_text(json.dumps(cfg))
    hits = [f for f in verify(str(root)).findings if f.code == "config-invalid" and key in f.message]
    assert len(hits) == 1 and hits[0].severity == "error" and hits[0].fix.startswith(fix), hits
    with pytest.raises(IncompatibleError) as exc:
        check_checkpoint(root, "0.2.0")
    assert exc.value.code == "config-invalid" and key in exc.value.reason


def test_a_valid_value_of_each_declared_type_is_accepted() -> None:
    """The checker itself, on the validator's distinctions: bool is not int, int is not float unless declared."""
    assert T.accepts(("int",), 3) and not T.accepts(("int",), True) and not T.accepts(("int",), 3.0)
    assert T.accepts(("float",), 1e-6) and not T.accepts(("float",), 0) and not T.accepts(("float",), "1e-6")
    assert T.accepts(("float", "int"), 0) and not T.accepts(("float", "int"), False)
    assert T.accepts(("bool",), False) and not T.accepts(("bool",), 0) and not T.accepts(("bool",), "false")
    assert T.accepts(("int", "list[int]", "null"), [1, 2]) and not T.accepts(("int", "list[int]"), [1, True])
    assert T.accepts(("list[str]", "null"), None) and not T.accepts(("list[str]",), ["a", 1])


def test_a_number_written_for_a_bool_or_float_is_repaired_only_where_one_value_means_it() -> None:
    """0 and 1 are false and true; any other integer is no boolean. An integer is the float it equals."""
    assert T.repaired(("bool",), 0) == (True, False)
    assert T.repaired(("bool",), 1) == (True, True)
    assert T.repaired(("bool",), 2) == (False, None)
    assert T.repaired(("float",), 0) == (True, 0.0)
    assert T.repaired(("int",), 4.0) == (True, 4)
    assert T.repaired(("float",), "1e-6") == (True, 1e-06)


@pytest.mark.parametrize("value, text", [
    ("1e-6", '"1e-6" (a string)'),
    (0, "0 (an integer)"),
    (True, "true (a boolean)"),
    (None, "null (null)"),
    ([1, 2], "[1, 2] (a list)"),
    ({"a": 1}, '{"a": 1} (an object)'),
    ("x" * 58, '"' + "x" * 58 + '" (a string)'),  # 60 characters as JSON: shown whole
    ("x" * 59, '"' + "x" * 56 + '... (a string)'),  # 61: cut to 57 and an ellipsis
    (list(range(30)), json.dumps(list(range(30)))[:57] + "... (a list)"),
])
def test_a_refused_value_is_shown_as_json_with_its_type_and_a_long_one_is_cut(value, text: str) -> None:
    assert T.got(value) == text
    assert len(T.got(value).split(" (")[0]) <= 60


def test_the_type_finding_message_shows_the_value_and_its_type(fresh) -> None:
    root = fresh("layout-2", "hybrid", num_layers=4)
    cfg = json.loads((root / L.CONFIG).read_text())
    cfg["text_config"]["rms_norm_eps"] = "1e-6"
    (root / L.CONFIG).write_text(json.dumps(cfg))
    hits = [f for f in verify(str(root)).findings if f.code == "config-invalid" and "rms_norm_eps" in f.message]
    assert len(hits) == 1
    assert hits[0].message.startswith('text_config.rms_norm_eps is "1e-6" (a string), but transformers\' '
                                      "Qwen3_5TextConfig accepts only a float")
