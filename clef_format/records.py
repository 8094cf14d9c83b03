"""Immutable records (``collections.namedtuple`` classes) declared like ``typing.NamedTuple``, without
importing ``typing``: importing it costs about a tenth of what verify may spend on a 9B checkpoint.

    class TensorInfo(Record):
        dtype: str
        shape: tuple[int, ...]
        note: str = ""          # defaults only on trailing fields, as with NamedTuple

The class built is a plain namedtuple subclass (``_replace``, ``_asdict``, equality, unpacking), with
the body's methods, properties and docstring, and empty ``__slots__``.
"""

from __future__ import annotations

import collections


class _RecordMeta(type):
    def __new__(mcls, name: str, bases: tuple[type, ...], ns: dict[str, object]) -> type:
        if not bases:  # Record itself
            return super().__new__(mcls, name, bases, ns)
        fields = list(ns.get("__annotations__", {}))  # type: ignore[call-overload]
        with_default = [f for f in fields if f in ns]
        if with_default != fields[len(fields) - len(with_default):]:
            raise TypeError(f"{name}: fields with defaults must come after fields without")
        defaults = [ns.pop(f) for f in with_default]
        base = collections.namedtuple(name, fields, defaults=defaults or None,  # type: ignore[misc]
                                      module=str(ns.get("__module__")))
        ns.setdefault("__slots__", ())
        return type(name, (base,), ns)


class Record(metaclass=_RecordMeta):
    """Base to declare a record; the class it makes derives from a namedtuple, not from Record."""
