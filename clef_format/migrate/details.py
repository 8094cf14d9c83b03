"""migrate's own keys, typed: the steps (each plan, and what running it measured) and what the call says.

A call collects them into a ``MigrateDraft`` as it goes (attributes, checked like any other) and freezes
it into ``MigrateDetails`` at the end; ``cli/render.py`` reads the record's fields, never keys.
"""

from __future__ import annotations

from typing import Any

from clef_format.records import Record


class StepResult(Record):
    """One step: its plan (``Plan.to_dict``; a later step's is planned only once the one before has run)
    and, once it ran, what running it measured (``migrate.apply.Result``)."""

    plan: dict[str, Any]
    quality: dict[str, dict[str, float]] | None = None  # per int8 table written: its quality figures
    carried_by: dict[str, int] | None = None  # how unchanged files came over (link, copy...) and how many
    seconds: dict[str, float] | None = None  # wall time per phase and per written file
    entries: dict[str, int] | None = None  # user entries before and after

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"plan": self.plan}
        if self.quality is not None:
            out.update(quality=self.quality, carried_by=self.carried_by, seconds=self.seconds, entries=self.entries)
        return out


#: The keys a call says only when it has something to say, in the order it first says them.
OPTIONAL = ("revision", "pending", "message", "pending_outputs", "recovery", "result", "space_free")


class MigrateDetails(Record):
    """``from``/``to``: the layouts asked about; ``steps`` planned or run; ``output`` (``--output``);
    ``recovered``: what finishing or rolling back an interrupted run did. Then, when said (``said``: which,
    in the order they were first set): ``revision`` and ``pending`` (``--current``: the chain revision and
    the interrupted run waiting), ``message``, ``pending_outputs``, ``recovery`` (what resuming or
    ``--abort`` would do), ``result`` (the checkpoint that holds the result), ``space_free``."""

    from_layout: str | None
    to: str | None
    dry_run: bool
    steps: tuple[StepResult, ...]
    output: str | None
    recovered: tuple[str, ...]
    revision: str | None = None
    pending: str | None = None
    message: str | None = None
    pending_outputs: list[str] | None = None
    recovery: str | None = None
    result: str | None = None
    space_free: int | None = None
    said: tuple[str, ...] = ()

    @property
    def capped_after(self) -> str | None:
        return None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"from": self.from_layout, "to": self.to, "dry_run": self.dry_run,
                               "steps": [s.to_dict() for s in self.steps], "output": self.output,
                               "recovered": list(self.recovered)}
        for key in self.said:
            out[key] = getattr(self, key)
        return out


class MigrateDraft:
    """``MigrateDetails`` under construction: a call sets its attributes as it goes (steps and recovered
    grow); ``freeze`` makes the record, the optional keys said in the order they were first set."""

    revision: str | None
    pending: str | None
    message: str | None
    pending_outputs: list[str] | None
    recovery: str | None
    result: str | None
    space_free: int | None

    def __init__(self, from_layout: str | None, to: str | None, dry_run: bool, output: str | None) -> None:
        self.from_layout = from_layout
        self.to = to
        self.dry_run = dry_run
        self.output = output
        self.steps: list[StepResult] = []
        self.recovered: list[str] = []
        self._said: list[str] = []

    def __setattr__(self, name: str, value: Any) -> None:
        if name in OPTIONAL and name not in self._said:
            self._said.append(name)
        object.__setattr__(self, name, value)

    def freeze(self) -> MigrateDetails:
        said = tuple(self._said)
        return MigrateDetails(self.from_layout, self.to, self.dry_run, tuple(self.steps), self.output,
                              tuple(self.recovered), **{k: getattr(self, k) for k in said}, said=said)
