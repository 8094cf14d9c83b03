"""Immutable records (namedtuple classes) declared like ``typing.NamedTuple``, without importing
``typing`` at run time: importing it costs about a tenth of what verify may spend on a 9B checkpoint.
Type checkers see ``typing.NamedTuple`` itself, with its full checking of fields.

    class TensorInfo(Record):
        dtype: str
        shape: tuple[int, ...]
        note: str = ""          # defaults only on trailing fields, as with NamedTuple

The class built is a plain namedtuple subclass (``_replace``, ``_asdict``, ``_make``, ``_fields``,
equality, unpacking, pickling), with the body's methods, properties and docstring, and empty
``__slots__``. Its base is made as ``collections.namedtuple`` makes one, except for ``__new__``:
namedtuple compiles a source line per class (``eval``), which was three fifths of the cost of a
record class and, over the ~35 classes a verify run loads, about 2.5% of the whole command (measured
with callgrind: benchmarks/RESULTS.md); here one code object per number of fields is compiled once and
its argument names are renamed per class (``CodeType.replace``), which gives the same signature,
keywords and defaults. ``tests/test_records.py`` holds the two to the same behaviour.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NamedTuple as Record
else:
    from _collections import _tuplegetter  # what collections.namedtuple uses for its field properties
    from keyword import iskeyword
    from types import FunctionType

    _TEMPLATES: dict = {}  # number of fields -> the code of ``lambda _cls, a0, ...: _tuple_new(_cls, (a0, ...))``
    _GLOBALS = {"_tuple_new": tuple.__new__, "__builtins__": {}}

    def _new_code(fields: tuple, typename: str):
        template = _TEMPLATES.get(len(fields))
        if template is None:
            args = ", ".join(f"a{i}" for i in range(len(fields)))
            items = args + ("," if len(fields) == 1 else "")
            template = eval(f"lambda _cls, {args}: _tuple_new(_cls, ({items}))", _GLOBALS).__code__
            _TEMPLATES[len(fields)] = template
        return template.replace(co_varnames=("_cls", *fields), co_name="__new__",
                                co_qualname=f"{typename}.__new__")

    def _namedtuple(typename: str, field_names: list, defaults: tuple | None, module: str | None,
                    body: dict | None = None) -> type:
        """``collections.namedtuple(typename, field_names, defaults=defaults, module=module)``, without its
        per-class ``eval`` (the module docstring says why); ``body``: names to add to its namespace (the
        class then made is the record itself, without a second class deriving from it)."""
        for name in [typename, *field_names]:
            if type(name) is not str or not name.isidentifier() or iskeyword(name):
                raise ValueError(f"Type names and field names must be valid identifiers: {name!r}")
        if len(set(field_names)) != len(field_names) or any(n.startswith("_") for n in field_names):
            raise ValueError(f"{typename}: field names must be unique and not start with an underscore")
        fields = tuple(map(sys.intern, field_names))
        num_fields = len(fields)
        arg_list = ", ".join(fields) + ("," if num_fields == 1 else "")  # (namedtuple's docstrings, exactly)
        repr_fmt = "(" + ", ".join(f"{name}=%r" for name in fields) + ")"
        tuple_new = tuple.__new__
        __new__ = FunctionType(_new_code(fields, typename), _GLOBALS, "__new__", defaults)
        __new__.__doc__ = f"Create new instance of {typename}({arg_list})"

        @classmethod
        def _make(cls, iterable):
            result = tuple_new(cls, iterable)
            if len(result) != num_fields:
                raise TypeError(f"Expected {num_fields} arguments, got {len(result)}")
            return result

        def _replace(self, /, **kwds):
            result = self._make(map(kwds.pop, fields, self))
            if kwds:
                raise ValueError(f"Got unexpected field names: {list(kwds)!r}")
            return result

        def __repr__(self):
            return self.__class__.__name__ + repr_fmt % self

        def _asdict(self):
            return dict(zip(self._fields, self))

        def __getnewargs__(self):
            return tuple(self)

        for method in (_make.__func__, _replace, __repr__, _asdict, __getnewargs__):
            method.__qualname__ = f"{typename}.{method.__name__}"
        namespace = {
            "__doc__": f"{typename}({arg_list})", "__slots__": (), "_fields": fields,
            "_field_defaults": dict(zip(fields[num_fields - len(defaults or ()):], defaults or ())),
            "__new__": __new__, "_make": _make, "_replace": _replace, "__repr__": __repr__, "_asdict": _asdict,
            "__getnewargs__": __getnewargs__, "__match_args__": fields,
        }
        for index, name in enumerate(fields):
            namespace[name] = _tuplegetter(index, f"Alias for field number {index}")
        if body:
            namespace.update(body)
        result = type(typename, (tuple,), namespace)
        result.__module__ = module
        return result

    class _RecordMeta(type):
        def __new__(mcls, name, bases, ns):
            if not bases:  # Record itself
                return super().__new__(mcls, name, bases, ns)
            fields = list(ns.get("__annotations__", {}))
            with_default = [f for f in fields if f in ns]
            if with_default != fields[len(fields) - len(with_default):]:
                raise TypeError(f"{name}: fields with defaults must come after fields without")
            defaults = tuple(ns.pop(f) for f in with_default)
            if "__new__" in ns or "__classcell__" in ns or "__slots__" in ns:
                # the body calls the namedtuple's own __new__ (super()): that needs it as a base class
                base = _namedtuple(name, fields, defaults or None, ns.get("__module__"))
                ns.setdefault("__slots__", ())
                return type(name, (base,), ns)
            body = {k: v for k, v in ns.items() if k != "__annotations__" or v}
            return _namedtuple(name, fields, defaults or None, ns.get("__module__"), body)

    class Record(metaclass=_RecordMeta):
        """Base to declare a record; the class it makes derives from a namedtuple, not from Record."""
