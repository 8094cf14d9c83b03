"""``records._namedtuple`` (namedtuple without its per-class ``eval``) behaves as ``collections.namedtuple``."""

from __future__ import annotations

import collections
import inspect
import pickle
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clef_format.read.safetensors import TensorInfo
from clef_format.records import Record, _namedtuple

_names = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(lambda n: n.isidentifier())


@given(fields=st.lists(_names, min_size=0, max_size=12, unique=True).filter(
    lambda fs: not any(__import__("keyword").iskeyword(f) for f in fs)), data=st.data())
def test_same_behaviour_as_collections_namedtuple(fields: list[str], data: st.DataObject) -> None:
    n_defaults = data.draw(st.integers(0, len(fields)))
    defaults = tuple(range(100, 100 + n_defaults)) or None
    ours = _namedtuple("Rec", fields, defaults, __name__)
    theirs = collections.namedtuple("Rec", fields, defaults=defaults, module=__name__)
    assert inspect.signature(ours) == inspect.signature(theirs)
    assert ours._fields == theirs._fields and ours.__match_args__ == theirs.__match_args__
    assert ours._field_defaults == theirs._field_defaults
    assert ours.__doc__ == theirs.__doc__ and ours.__new__.__doc__ == theirs.__new__.__doc__
    values = list(range(len(fields)))
    a, b = ours(*values), theirs(*values)
    assert tuple(a) == tuple(b) and repr(a) == repr(b) and a._asdict() == b._asdict()
    assert ours(**dict(zip(fields, values))) == a
    for i, name in enumerate(fields):
        assert getattr(a, name) == values[i]
        assert getattr(ours, name).__doc__ == getattr(theirs, name).__doc__
        assert tuple(a._replace(**{name: -1})) == tuple(b._replace(**{name: -1}))
    assert ours._make(values) == a
    if fields:
        with pytest.raises(TypeError) as ours_err:
            ours(*values, 0)
        with pytest.raises(TypeError) as theirs_err:
            theirs(*values, 0)
        assert str(ours_err.value) == str(theirs_err.value)
    with pytest.raises(ValueError, match="unexpected field names"):
        a._replace(not_a_field=1)
    with pytest.raises(TypeError, match="Expected"):
        ours._make(values + [0])


def test_missing_argument_named_as_namedtuple_names_it() -> None:
    ours = _namedtuple("Rec", ["dtype", "shape"], None, __name__)
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'shape'"):
        ours("F32")
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        ours("F32", (1,), nope=1)


@pytest.mark.parametrize("bad", [["ok", "ok"], ["_private"], ["class"], ["not an identifier"]])
def test_refuses_what_namedtuple_refuses(bad: list[str]) -> None:
    with pytest.raises(ValueError):
        collections.namedtuple("Rec", bad)
    with pytest.raises(ValueError):
        _namedtuple("Rec", bad, None, __name__)


class _Point(Record):
    """A record with a default, a method and a property."""

    x: int
    y: int = 7

    @property
    def total(self) -> int:
        return self.x + self.y

    def scaled(self, k: int) -> _Point:
        return self._replace(x=self.x * k, y=self.y * k)


sys.modules[__name__]._Point = _Point  # (pickle finds it by module and name)


def test_record_class_keeps_its_body_and_pickles() -> None:
    p = _Point(2)
    assert p == (2, 7) and p.total == 9 and p.scaled(3) == _Point(6, 21)
    assert _Point.__doc__ == "A record with a default, a method and a property."
    assert repr(p) == "_Point(x=2, y=7)" and p._asdict() == {"x": 2, "y": 7}
    assert pickle.loads(pickle.dumps(p)) == p and type(pickle.loads(pickle.dumps(p))) is _Point
    assert not hasattr(p, "__dict__")  # empty __slots__ all the way up
    info = TensorInfo("F32", (2, 3), 0, 24)
    assert info._replace(end=48).end == 48 and TensorInfo._fields == ("dtype", "shape", "begin", "end")


def test_fields_with_defaults_must_trail() -> None:
    with pytest.raises(TypeError, match="defaults must come after"):
        class _Bad(Record):
            a: int = 1
            b: int
