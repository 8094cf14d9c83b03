"""The names migrate keeps beside a target for an interrupted run: ``.T.clef-migrate`` (its workspace:
the parked original or the staged tree, and the journal) and ``.T.clef-migrate.lock``. Pure naming, so
that a reader (``scan``) can tell such a folder from a checkpoint without importing the writer."""

from __future__ import annotations

WS_SUFFIX, LOCK_SUFFIX = ".clef-migrate", ".clef-migrate.lock"


def workspace_owner(name: str) -> str | None:
    """The target name whose workspace or lock ``name`` is (``.T.clef-migrate[.lock]`` -> ``T``), else None.
    The one home of the naming rule: such a name is migrate's, never a place for a user's folder."""
    for suffix in (LOCK_SUFFIX, WS_SUFFIX):
        if name.startswith(".") and name.endswith(suffix) and len(name) > len(suffix) + 1:
            return name[1:-len(suffix)]
    return None


def is_workspace(name: str) -> bool:
    """Whether a folder named ``name`` is a migrate workspace (not its lock)."""
    return workspace_owner(name) is not None and not name.endswith(LOCK_SUFFIX)
