"""The layout chain, one module per step, like Alembic revisions.

Each step module defines ``revision``, ``down_revision`` (the step it builds on, ``None`` for
the first), ``from_layout``, ``to_layout``, ``description``, and ``upgrade(ck) -> Plan`` and
``downgrade(ck) -> Plan`` (pure: a plan, never a write). ``downgrade`` of an irreversible step
raises ``StepRefused``. A *repair* step (``repair = True``) leads from a broken state into the
chain and has no way back. Optional: ``DEEP_CHECK = True`` (the tables are checked in full before
either direction runs), ``STREAM_CHECKED`` (the directions whose writer applies that rule itself).
Each module is read once, at discovery, into a ``Script`` (as Alembic wraps each revision file).

    layout-1 --0001_int8_tables--> layout-2 <--0002_repair_marker-- layout-2-unmarked
"""

from __future__ import annotations

import importlib
import pkgutil
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, NamedTuple, Sequence

from clef_format.errors import ClefError
from clef_format.migrate.plan import Plan
from clef_format.read.checkpoint import Checkpoint
from clef_format.spec.layouts import Layout

#: The layout the chain starts from (Alembic's ``base``).
BASE_LAYOUT = Layout.LAYOUT_1.value
_REQUIRED = ("revision", "down_revision", "from_layout", "to_layout", "description", "upgrade", "downgrade")


class RevisionMapError(ClefError):
    """The step modules do not form a valid chain (a bug in clef-format, found before any step runs)."""


@dataclass(frozen=True)
class Script:
    """One step module, every attribute read once at discovery (the optional ones with their default
    here, never by ``getattr`` at the place that needs them)."""

    module: Any
    revision: str
    down_revision: str | None
    from_layout: str
    to_layout: str
    description: str
    upgrade: Callable[[Checkpoint], Plan]
    downgrade: Callable[[Checkpoint], Plan]
    repair: bool = False
    deep_check: bool = False
    stream_checked: frozenset[str] = frozenset()

    @classmethod
    def of(cls, module: Any) -> "Script":
        """The step ``module`` as a record, or ``RevisionMapError`` naming what it lacks."""
        if isinstance(module, Script):
            return module
        missing = [a for a in _REQUIRED if not hasattr(module, a)]
        if missing:
            raise RevisionMapError(f"step {getattr(module, '__name__', module)!r} lacks {', '.join(missing)}")
        return cls(module, module.revision, module.down_revision, module.from_layout, module.to_layout,
                   module.description, module.upgrade, module.downgrade,
                   repair=bool(getattr(module, "repair", False)), deep_check=bool(getattr(module, "DEEP_CHECK", False)),
                   stream_checked=frozenset(getattr(module, "STREAM_CHECKED", ())))

    @property
    def reversible(self) -> bool:
        return not self.repair


class Edge(NamedTuple):
    """One way through a step: ``upgrade`` goes from_layout -> to_layout, ``downgrade`` back."""

    step: Script
    direction: str
    src: str
    dst: str

    @property
    def revision(self) -> str:
        return str(self.step.revision)

    def plan(self, ck: Checkpoint) -> Plan:
        fn = self.step.upgrade if self.direction == "upgrade" else self.step.downgrade
        return fn(ck)

    def describe(self) -> str:
        return f"{self.revision} {self.direction}: {self.src} -> {self.dst}"


def _discover() -> list[Any]:
    """Every ``vNNNN_*`` module of this package, like Alembic's scan of ``versions/``."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name.startswith("v") and m.name[1:5].isdigit())
    return [importlib.import_module(f"{__name__}.{name}") for name in names]


def validate(modules: Sequence[Any]) -> list[Script]:
    """The steps ordered from the base, each a ``Script``, or ``RevisionMapError``: every attribute present, unique ids,
    one base, every ``down_revision`` known, no cycle, each non-repair step starting where its
    ``down_revision`` ends (the base layout for the first), each repair step ending on the chain."""
    found = [Script.of(m) for m in modules]
    by_id: dict[str, Script] = {}
    for step in found:
        if step.revision in by_id:
            raise RevisionMapError(f"duplicate revision id {step.revision!r}")
        by_id[step.revision] = step
    bases = [s for s in found if s.down_revision is None]
    if len(bases) != 1:
        raise RevisionMapError(f"the chain needs exactly one base step (down_revision None), found {len(bases)}")
    for step in found:
        seen: set[str] = set()
        here = step
        while here.down_revision is not None:
            if here.revision in seen:
                raise RevisionMapError(f"cycle through {here.revision!r}")
            seen.add(here.revision)
            if here.down_revision not in by_id:
                raise RevisionMapError(f"{here.revision!r} builds on unknown revision {here.down_revision!r}")
            here = by_id[here.down_revision]
    on_chain = {BASE_LAYOUT} | {s.to_layout for s in found if not s.repair}
    for step in found:
        if step.repair:
            if step.to_layout not in on_chain:
                raise RevisionMapError(f"repair {step.revision!r} leads to {step.to_layout!r}, off the chain")
            continue
        start = BASE_LAYOUT if step.down_revision is None else by_id[step.down_revision].to_layout
        if step.from_layout != start:
            raise RevisionMapError(f"{step.revision!r} starts at {step.from_layout!r}, but its down_revision "
                                   f"ends at {start!r}")
    order: list[Script] = []
    frontier = [bases[0]]
    while frontier:
        here = frontier.pop(0)
        order.append(here)
        frontier.extend(s for s in found if s.down_revision == here.revision)
    return order


@lru_cache(maxsize=None)
def _steps() -> tuple[Script, ...]:
    return tuple(validate(_discover()))


def steps() -> list[Script]:
    """The validated steps, base first."""
    return list(_steps())


def edges() -> list[Edge]:
    out = []
    for step in steps():
        out.append(Edge(step, "upgrade", step.from_layout, step.to_layout))
        if step.reversible:
            out.append(Edge(step, "downgrade", step.to_layout, step.from_layout))
    return out


def path(src: str, dst: str) -> list[Edge] | None:
    """The shortest sequence of steps from layout ``src`` to ``dst``; [] when equal, None when unreachable."""
    if src == dst:
        return []
    queue: deque[tuple[str, list[Edge]]] = deque([(src, [])])
    seen = {src}
    while queue:
        here, route = queue.popleft()
        for edge in edges():
            if edge.src == here and edge.dst not in seen:
                if edge.dst == dst:
                    return route + [edge]
                seen.add(edge.dst)
                queue.append((edge.dst, route + [edge]))
    return None


def layouts() -> list[str]:
    """Every layout the chain can reach or leave."""
    names: list[str] = []
    for e in edges():
        for n in (e.src, e.dst):
            if n not in names:
                names.append(n)
    return names


def history() -> list[dict[str, object]]:
    """The chain for ``--history``: each step, its parent and where it leads."""
    return [{"revision": s.revision, "down_revision": s.down_revision, "from": s.from_layout, "to": s.to_layout,
             "reversible": s.reversible, "description": s.description} for s in steps()]


def revision_of(layout: str) -> str | None:
    """The revision a layout stands at (``base`` before the first step, None off the chain)."""
    if layout == BASE_LAYOUT:
        return "base"
    for s in steps():
        if s.to_layout == layout and s.reversible:
            return str(s.revision)
    return None
