"""The revision map of migrations/: validated like Alembic's before any step runs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from clef_format import migrations
from clef_format.migrations import RevisionMapError, validate


def step(revision, down, src, dst, repair=False):
    return SimpleNamespace(__name__=revision, revision=revision, down_revision=down, from_layout=src, to_layout=dst,
                           description="", upgrade=None, downgrade=None, repair=repair)


GOOD = [step("a", None, "layout-1", "layout-2"), step("r", "a", "layout-2-unmarked", "layout-2", repair=True)]


def test_the_shipped_chain_validates_base_first():
    assert [s.revision for s in migrations.steps()] == ["0001_int8_tables", "0002_repair_marker"]
    assert [s.module for s in validate(GOOD)] == GOOD


@pytest.mark.parametrize("bad, words", [
    (GOOD + [step("a", "r", "layout-2", "layout-3")], "duplicate revision id"),
    ([step("a", None, "layout-1", "layout-2"), step("b", None, "layout-2", "layout-3")], "exactly one base"),
    ([step("a", None, "layout-1", "layout-2"), step("b", "zzz", "layout-2", "layout-3")], "unknown revision"),
    ([step("a", None, "layout-1", "layout-2"), step("b", "c", "layout-2", "x"), step("c", "b", "x", "y")], "cycle"),
    ([step("a", None, "layout-1", "layout-2"), step("b", "a", "layout-1", "layout-3")], "starts at"),
    ([step("a", None, "layout-2", "layout-3")], "starts at"),
    ([step("a", None, "layout-1", "layout-2"), step("r", "a", "broken", "nowhere", repair=True)], "off the chain"),
    ([SimpleNamespace(__name__="m", revision="a")], "lacks"),
])
def test_invalid_maps_are_refused(bad, words):
    with pytest.raises(RevisionMapError, match=words):
        validate(bad)


def test_routes_follow_the_chain():
    assert [e.describe() for e in migrations.path("layout-2-unmarked", "layout-1")] == [
        "0002_repair_marker upgrade: layout-2-unmarked -> layout-2", "0001_int8_tables downgrade: layout-2 -> layout-1"]
    assert migrations.path("layout-1", "layout-2-unmarked") is None  # nothing ever produces the unmarked state
