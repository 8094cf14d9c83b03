"""Checks: pure functions from a ``Checkpoint`` to findings. ``CHECKS`` is the order verify runs them."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Callable, Iterable

from ..checkpoint import Checkpoint
from ..findings import Finding
from .backbone import check_backbone
from .cache import check_cache
from .head import check_head
from .layout import check_layout
from .patterns import check_patterns
from .tables import check_tables

if TYPE_CHECKING:
    Check = Callable[[Checkpoint], Iterable[Finding]]

CHECKS: list[Check] = [
    check_layout,
    check_backbone,
    check_tables,
    check_head,
    check_cache,
    check_patterns,
]
