"""Immutable records (``collections.namedtuple`` classes) declared like ``typing.NamedTuple``, without
importing ``typing`` at run time: importing it costs about a tenth of what verify may spend on a 9B
checkpoint. Type checkers see ``typing.NamedTuple`` itself, with its full checking of fields.

    class TensorInfo(Record):
        dtype: str
        shape: tuple[int, ...]
        note: str = ""          # defaults only on trailing fields, as with NamedTuple

The class built is a plain namedtuple subclass (``_replace``, ``_asdict``, equality, unpacking), with
the body's methods, properties and docstring, and empty ``__slots__``.
"""

from __future__ import annotations

import collections

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NamedTuple as Record
else:

    class _RecordMeta(type):
        def __new__(mcls, name, bases, ns):
            if not bases:  # Record itself
                return super().__new__(mcls, name, bases, ns)
            fields = list(ns.get("__annotations__", {}))
            with_default = [f for f in fields if f in ns]
            if with_default != fields[len(fields) - len(with_default):]:
                raise TypeError(f"{name}: fields with defaults must come after fields without")
            defaults = [ns.pop(f) for f in with_default]
            base = collections.namedtuple(name, fields, defaults=defaults or None, module=ns.get("__module__"))
            ns.setdefault("__slots__", ())
            return type(name, (base,), ns)

    class Record(metaclass=_RecordMeta):
        """Base to declare a record; the class it makes derives from a namedtuple, not from Record."""
