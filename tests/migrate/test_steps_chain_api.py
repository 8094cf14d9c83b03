"""The revision map's API as a caller of ``clef_format.migrations`` sees it: which step module is named
when one lacks attributes, the optional attributes as every step record carries them, the layouts the
chain knows, the shortest route (None, and promptly, when there is none), the revision ``--current``
names for each layout, and the repair step's refusal to run backwards.

Written for survivors of the unsampled mutmut run over the migration steps (docs/TESTING.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from clef_format import migrations
from clef_format.errors import StepRefused
from clef_format.migrations import RevisionMapError, Script, validate
from clef_format.migrations import v0002_repair_marker
from clef_format.read.checkpoint import read_checkpoint
from tests.support.migrate import run_json

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = ("revision", "down_revision", "from_layout", "to_layout", "description", "upgrade", "downgrade")


def _step(revision, down, src, dst, **optional):
    return SimpleNamespace(__name__=f"steps.{revision}", revision=revision, down_revision=down, from_layout=src,
                           to_layout=dst, description=f"step {revision}", upgrade=None, downgrade=None, **optional)


def test_a_step_lacking_attributes_is_named_by_its_module_name_and_every_missing_attribute_listed() -> None:
    with pytest.raises(RevisionMapError) as exc:
        validate([SimpleNamespace(__name__="clef_format.migrations.v0009_half", revision="9")])
    assert str(exc.value) == ("step 'clef_format.migrations.v0009_half' lacks down_revision, from_layout, "
                              "to_layout, description, upgrade, downgrade")


def test_a_step_object_without_a_module_name_is_named_by_its_repr() -> None:
    """Not every object handed to ``validate`` is a module: one without ``__name__`` is shown as it is,
    and still refused as a broken revision map (not an AttributeError)."""
    thing = SimpleNamespace(revision="9", down_revision=None)
    with pytest.raises(RevisionMapError) as exc:
        validate([thing])
    assert str(exc.value) == f"step {thing!r} lacks from_layout, to_layout, description, upgrade, downgrade"


def test_optional_attributes_default_to_a_plain_reversible_unchecked_step() -> None:
    plain = Script.of(_step("a", None, "layout-1", "layout-2"))
    assert (plain.repair, plain.deep_check, plain.stream_checked, plain.reversible) == (False, False, frozenset(), True)


def test_optional_attributes_are_read_from_the_module() -> None:
    full = Script.of(_step("a", None, "layout-1", "layout-2", repair=True, DEEP_CHECK=True,
                           STREAM_CHECKED=("upgrade",)))
    assert (full.repair, full.deep_check, full.stream_checked, full.reversible) == (
        True, True, frozenset({"upgrade"}), False)


def test_the_shipped_steps_carry_their_checks() -> None:
    """Both shipped steps check the tables in full first; only the int8 upgrade's writer applies the
    rule itself while streaming (its module says so)."""
    got = {s.revision: (s.deep_check, s.stream_checked) for s in migrations.steps()}
    assert got == {"0001_int8_tables": (True, frozenset({"upgrade"})), "0002_repair_marker": (True, frozenset())}


def test_a_repair_listed_before_a_misplaced_step_does_not_hide_it() -> None:
    """The start of every non-repair step is checked, wherever a repair step stands in the list."""
    steps = [_step("a", None, "layout-1", "layout-2"),
             _step("r", "a", "layout-2-unmarked", "layout-2", repair=True),
             _step("b", "a", "layout-1", "layout-3")]
    with pytest.raises(RevisionMapError, match="'b' starts at 'layout-1', but its down_revision ends at 'layout-2'"):
        validate(steps)


def test_layouts_lists_each_layout_of_the_chain_once() -> None:
    assert migrations.layouts() == ["layout-1", "layout-2", "layout-2-unmarked"]


@pytest.mark.parametrize("src, dst", [("layout-2", "layout-2-unmarked"), ("layout-1", "layout-2-unmarked"),
                                      ("layout-2-unmarked", "layout-9")])
def test_an_unreachable_layout_is_answered_none_promptly(src: str, dst: str) -> None:
    """Nothing leads into the unmarked state (nor to a layout no step names): ``path`` says None, and
    says it at once (the chain has a cycle, layout-1 <-> layout-2, that a search must not go round)."""
    code = f"from clef_format import migrations; print(repr(migrations.path({src!r}, {dst!r})))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and proc.stdout == "None\n", proc.stderr


@pytest.mark.parametrize("layout, revision", [("layout-1", "base"), ("layout-2", "0001_int8_tables"),
                                              ("layout-2-unmarked", None)])
def test_current_names_the_revision_each_layout_stands_at(built, capsys, layout: str, revision: str | None) -> None:
    """``migrate --current``: layout-1 is the base, layout-2 stands at the int8 step, and the unmarked
    state is on no revision (only the repair leaves it); the text shows the same as the JSON."""
    from clef_format.cli.main import main

    root = built(layout)
    rc, out = run_json(capsys, str(root), "--current")
    assert out["layout"] == layout and out["revision"] == revision
    main(["migrate", str(root), "--current"])
    lines = [line.strip() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("revision")]
    assert lines == ([] if revision is None else [f"revision {revision}"])


def test_the_marker_repair_refuses_to_run_backwards_naming_the_way_to_layout_1(built) -> None:
    ck = read_checkpoint(built("layout-2"))
    with pytest.raises(StepRefused) as exc:
        v0002_repair_marker.downgrade(ck)
    assert str(exc.value) == ("the repair cannot be undone: layout-2-unmarked must never exist; "
                              "to serve with clef-vllm 0.1.x migrate --to layout-1")
