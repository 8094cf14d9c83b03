"""The layout chain, one module per step, like Alembic revisions.

Each step module defines ``revision``, ``down_revision`` (the step it builds on, ``None`` for
the first), ``from_layout``, ``to_layout``, ``description``, and ``upgrade(ck) -> Plan`` and
``downgrade(ck) -> Plan`` (pure: a plan, never a write). ``downgrade`` of an irreversible step
raises ``StepRefused``. A *repair* step (``repair = True``) leads from a broken state into the
chain and has no way back.

    layout-1 --0001_int8_tables--> layout-2 <--0002_repair_marker-- layout-2-unmarked
"""

from __future__ import annotations

import importlib
from collections import deque
from types import ModuleType
from typing import Callable, NamedTuple

from clef_format.read.checkpoint import Checkpoint
from clef_format.migrate.plan import Plan

STEP_MODULES = ("v0001_int8_tables", "v0002_repair_marker")


class Edge(NamedTuple):
    """One way through a step: ``upgrade`` goes from_layout -> to_layout, ``downgrade`` back."""

    step: ModuleType
    direction: str
    src: str
    dst: str

    @property
    def revision(self) -> str:
        return str(self.step.revision)

    def plan(self, ck: Checkpoint) -> Plan:
        fn: Callable[[Checkpoint], Plan] = getattr(self.step, self.direction)
        return fn(ck)

    def describe(self) -> str:
        return f"{self.revision} {self.direction}: {self.src} -> {self.dst}"


def steps() -> list[ModuleType]:
    return [importlib.import_module(f"{__name__}.{name}") for name in STEP_MODULES]


def edges() -> list[Edge]:
    out = []
    for step in steps():
        out.append(Edge(step, "upgrade", step.from_layout, step.to_layout))
        if not getattr(step, "repair", False):
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
             "reversible": not getattr(s, "repair", False), "description": s.description} for s in steps()]


def revision_of(layout: str) -> str | None:
    """The revision a layout stands at (``base`` before the first step, None off the chain)."""
    if layout == "layout-1":
        return "base"
    for s in steps():
        if s.to_layout == layout and not getattr(s, "repair", False):
            return str(s.revision)
    return None
