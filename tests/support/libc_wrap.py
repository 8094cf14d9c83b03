"""``ctypes.CDLL`` with its ``renameat2`` wrapped: the one libc call migrate makes outside ``os``.

The fault suite fails it, the durability suite records it; both patch ``ctypes.CDLL`` to return
``Libc(real_cdll(...), wrap)``, where ``wrap(real)`` returns the function to call instead.
"""

from __future__ import annotations

from typing import Any, Callable


class Libc:
    def __init__(self, lib: Any, wrap: Callable[[Callable[..., int]], Callable[..., int]]) -> None:
        self._lib = lib
        self._wrap = wrap

    def __getattr__(self, attr: str) -> Any:
        real = getattr(self._lib, attr)
        return self._wrap(real) if attr == "renameat2" else real
