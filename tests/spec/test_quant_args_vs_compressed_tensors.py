"""The lax coercion of ``QuantizationArgs`` (``config_types.QUANT_FIELDS``) against compressed-tensors' own
pydantic model: over generated values of every JSON type, each field is accepted exactly when
``QuantizationArgs.model_validate`` accepts it, and coerced to the same value."""

from __future__ import annotations

import math
from typing import Any

import pytest
from compressed_tensors.quantization import QuantizationArgs
from hypothesis import given, settings
from hypothesis import strategies as st

from clef_format.vllm_rules import config_types as T

#: Strings from the characters integer and boolean parsing care about, and the words themselves.
_TEXT = st.one_of(st.text(alphabet="0123456789+-_. eEx\t\u00a0", max_size=8),
                  st.sampled_from(["true", "True", "TRUE", "false", "yes", "no", "on", "off", "t", "f", "y", "n",
                                   "1", "0", " true", "local", "LOCAL", "Local ", "8", "8.0", "8.00", "1_0", "2x4",
                                   "0x4", "2x4x8", " 2x 4", "\u0668", "-1", "128"]))
_NUMBER = st.one_of(st.integers(-5, 300), st.integers(-(2 ** 70), 2 ** 70),
                    st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0, 1, 2, -1, -2, 0.5, 0.0, 1.0, -1.0, 8.0, 8.5, 16.0, 2.0 ** 63, -(2.0 ** 63), 1e19,
                                     9007199254740993.0]))
_SCALAR = st.one_of(st.none(), st.booleans(), _NUMBER, _TEXT, _NUMBER)  # numbers twice: the boundaries matter
VALUES = st.one_of(_SCALAR, st.lists(_SCALAR, max_size=3), st.dictionaries(st.sampled_from(["a", "b"]), _SCALAR,
                                                                           max_size=2))

#: Companion fields each one needs to form valid args on its own (the strategy a value implies).
_COMPANIONS: dict[str, Any] = {"dynamic": {"strategy": "tensor_group", "group_size": 16}}


def _theirs(field: str, value: Any) -> tuple[bool, Any]:
    args = dict(_COMPANIONS.get(field, {})) if value is not None else {}
    args[field] = value
    if field == "group_size" and isinstance(value, (int, float)) and not isinstance(value, bool) \
            and math.isfinite(value) and value != -1:
        args["strategy"] = "group"  # a positive size needs the group strategy, others are refused anyway
    try:
        parsed = QuantizationArgs.model_validate(args)
    except (ValueError, TypeError):  # pydantic's ValidationError is a ValueError; a before-validator's TypeError
        return False, None
    got = getattr(parsed, field)
    return True, got.value if hasattr(got, "value") else got


@pytest.mark.parametrize("field", sorted(T.QUANT_FIELDS))
@settings(max_examples=400, deadline=None)
@given(value=VALUES)
def test_field_coercion_equals_quantization_args(field: str, value: Any) -> None:
    ok, coerced = T.QUANT_FIELDS[field](value)
    theirs_ok, theirs = _theirs(field, value)
    if field == "group_size" and ok and coerced is not None and coerced == 0:
        return  # group_size 0 is refused by the strategy rule (parse_args), not the field: see the test below
    assert ok == theirs_ok, (field, value, coerced)
    if ok:
        assert coerced == theirs and type(coerced) is type(theirs), (field, value, coerced, theirs)


@pytest.mark.parametrize("args", [{"num_bits": "8"}, {"num_bits": 8.0}, {"symmetric": "true"}, {"symmetric": 1},
                                  {"num_bits": " 4 ", "type": "float", "group_size": 16.0, "strategy": "tensor_group",
                                   "dynamic": "LOCAL", "symmetric": "yes"}, {"group_size": 0}, {"num_bits": 8.5},
                                  {"symmetric": "maybe"}, {"dynamic": "true"}, {"group_size": "128"},
                                  {"observer": 5}, {"observer_kwargs": []}])
def test_parse_args_accepts_what_compressed_tensors_accepts(args: dict[str, Any]) -> None:
    from clef_format.vllm_rules.matching import QuantConfigError, parse_args

    try:
        QuantizationArgs.model_validate(args)
        theirs = True
    except (ValueError, TypeError):
        theirs = False
    try:
        parse_args(args, "weights")
        ours = True
    except QuantConfigError:
        ours = False
    assert ours == theirs, args
