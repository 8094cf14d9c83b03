"""The pair rule of spec.compat: layout-2 only with >=0.2.0, layout-1 only with 0.1.x, whatever the
marker admits; a marker admitting a version outside its layout's range, or none, is invalid;
pre-releases follow PEP 440."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from clef_format.compat import IncompatibleError, check_checkpoint, check_pair
from clef_format.spec import layouts as L
from clef_format.spec.compat import LAYOUT_2_FLOOR, SERVED_BY, marker_problem, served_layout
from clef_format.spec.layouts import Layout
from clef_format.verify.run import verify

INSIDE = [">=0.2.0", ">=0.2", ">=0.2.0,<0.3", "==0.2.*", "~=0.2.1", "==0.2.4", ">0.2.0", ">=0.2.0rc1", ">=1.0",
          ">=0.2.0,!=0.2.3", "===0.2.0"]
BELOW = ["==0.1.4", ">=0.1", ">0.1.99", "!=0.1.4", "<0.3", "~=0.1", "==0.1.*", ">=0.1.9,<0.3", "<=0.2.0", "===0.1.0"]
EMPTY = [">=0.2,<0.2", ">0.3,<0.3", "==0.2.0,!=0.2.0", ">=0.3,<=0.2.9", "==0.2.*,==0.3.*", ">0.2.0,<0.2.0.post1"]


@pytest.mark.parametrize("value", INSIDE)
def test_markers_inside_the_layout_2_range_are_valid(value):
    assert marker_problem(SpecifierSet(value)) is None


@pytest.mark.parametrize("value", BELOW)
def test_markers_admitting_a_0_1_plugin_are_invalid(value):
    problem = marker_problem(SpecifierSet(value))
    assert problem is not None and "below 0.2.0" in problem
    # and the claim is true: some 0.1.x version is admitted
    assert any(SpecifierSet(value).contains(v, prereleases=True) for v in ("0.1.0", "0.1.4", "0.1.100", "0.1.9"))


@pytest.mark.parametrize("value", EMPTY)
def test_markers_admitting_nothing_are_invalid(value):
    problem = marker_problem(SpecifierSet(value))
    assert problem is not None and "no version" in problem


@pytest.mark.parametrize("marker", ["==0.1.4", ">=0.1", ">=0.2,<0.2"])
@pytest.mark.parametrize("version", ["0.1.4", "0.2.0", "0.2.5"])
def test_an_invalid_marker_is_served_by_nobody(marker, version):
    with pytest.raises(IncompatibleError) as exc:
        check_pair(Layout.LAYOUT_2, SpecifierSet(marker), version, path="ck")
    assert exc.value.code in ("marker-invalid", "plugin-incompatible")
    assert "clef-format migrate" not in exc.value.fix  # no migration rewrites a layout-2 marker


def test_layout_ranges_are_disjoint_and_cover_every_version_from_0_1():
    for v in ("0.1.0.dev0", "0.1.0", "0.1.4", "0.1.5rc1", "0.1.99", "0.2.0.dev1", "0.2.0rc1", "0.2.0", "0.2.1rc2",
              "0.3", "1.0", "0.2.0.post1"):
        served = [lay for lay, spec in SERVED_BY.items() if spec is not None and spec.contains(v, prereleases=True)]
        assert len(served) == 1, (v, served)
        assert served_layout(v) is served[0]
    assert served_layout("0.0.9") is None


@pytest.mark.parametrize("version, layout1, layout2_default, layout2_rc_marker", [
    ("0.1.4", None, "plugin-incompatible", "plugin-incompatible"),
    ("0.1.5rc1", None, "plugin-incompatible", "plugin-incompatible"),
    ("0.2.0rc1", "plugin-incompatible", "plugin-incompatible", None),  # PEP 440: 0.2.0rc1 < 0.2.0
    ("0.2.0.dev3", "plugin-incompatible", "plugin-incompatible", "plugin-incompatible"),  # dev0-3 < rc1
    ("0.2.0", "plugin-incompatible", None, None),
    ("0.2.1rc1", "plugin-incompatible", None, None),
    ("0.0.9", "plugin-incompatible", "plugin-incompatible", "plugin-incompatible"),
])
def test_prereleases_follow_pep_440(version, layout1, layout2_default, layout2_rc_marker):
    def code(layout, marker):
        try:
            check_pair(layout, marker, version)
        except IncompatibleError as exc:
            return exc.code
        return None

    assert code(Layout.LAYOUT_1, None) == layout1
    assert code(Layout.LAYOUT_2, SpecifierSet(">=0.2.0")) == layout2_default
    assert code(Layout.LAYOUT_2, SpecifierSet(">=0.2.0rc1")) == layout2_rc_marker
    assert Version("0.2.0rc1") < Version("0.2.0")


def test_a_prerelease_refusal_points_to_the_layout_it_can_serve():
    """0.2.0rc1 on a >=0.2.0 checkpoint: the fix is a plugin release, never a migration to layout-1
    (which 0.2.0rc1 cannot serve either)."""
    with pytest.raises(IncompatibleError) as exc:
        check_pair(Layout.LAYOUT_2, SpecifierSet(">=0.2.0"), "0.2.0rc1", path="ck")
    assert "--to layout-1" not in exc.value.fix and "pip install" in exc.value.fix
    assert served_layout("0.2.0rc1") is Layout.LAYOUT_2


@pytest.mark.parametrize("marker, version", [("==0.1.4", "0.1.4"), (">=0.1", "0.1.4"), (">=0.2,<0.2", "0.2.0"),
                                             (">=0.2,<0.2", "0.1.4")])
def test_verify_and_the_gate_refuse_markers_outside_the_range(fresh, marker, version):
    root = fresh("layout-2", "bf16", num_layers=4)
    cfg = json.loads((root / L.HEAD_CONFIG).read_text())
    cfg[L.MARKER_KEY] = marker
    (root / L.HEAD_CONFIG).write_text(json.dumps(cfg))
    report = verify(str(root), plugin_version=version)
    assert not report.ok
    assert "marker-invalid" in report.codes() and "plugin-incompatible" in report.codes()
    assert "marker-invalid" in verify(str(root)).codes()
    with pytest.raises(IncompatibleError) as exc:
        check_checkpoint(root, version)
    assert exc.value.code in ("marker-invalid", "plugin-incompatible")


# ----------------------------------------------------------------------------- markers, by generation

_RELEASES = ["0", "0.1", "0.1.4", "0.2", "0.2.0", "0.2.1", "0.3", "1.0"]
_SUFFIXES = ["", ".dev0", ".dev3", "a1", "rc1", ".post1", ".post2.dev1", "+local", "+cpu.1"]
_GRID = sorted({Version(f"{r}{s}") for r in _RELEASES + ["0.1.9", "0.2.5", "0.4"] for s in _SUFFIXES})


def _specifiers() -> st.SearchStrategy[str]:
    op = st.sampled_from(["==", "!=", ">=", "<=", ">", "<", "~="])
    version = st.builds(lambda r, s: r + s, st.sampled_from(_RELEASES), st.sampled_from(_SUFFIXES))
    one = st.builds(lambda o, v: o + v, op, version).filter(_valid_specifier)
    star = st.builds(lambda o, r: f"{o}{r}.*", st.sampled_from(["==", "!="]), st.sampled_from(_RELEASES[1:]))
    return st.lists(st.one_of(one, star), min_size=1, max_size=3).map(",".join)


def _valid_specifier(text: str) -> bool:
    try:
        SpecifierSet(text)
        return True
    except InvalidSpecifier:
        return False


@settings(max_examples=600, deadline=None)
@given(_specifiers())
def test_marker_problem_is_total_and_sound_on_a_version_grid(text: str) -> None:
    """Any marker packaging parses gets an answer, never an exception (dev, pre, post and local
    bounds included); and the answer agrees with a dense grid of versions wherever the grid decides:
    "admits no version" only when no grid version is admitted, "below 0.2.0" only when one is."""
    marker = SpecifierSet(text)
    problem = marker_problem(marker)
    admitted = [v for v in _GRID if marker.contains(v, prereleases=True)]
    if problem is None:
        assert all(v >= LAYOUT_2_FLOOR for v in admitted), (text, admitted)
    elif "admits no version" in problem:
        assert admitted == [], (text, admitted)
    else:
        assert "below 0.2.0" in problem


@pytest.mark.parametrize("text", [">=0.2.0.dev0", "<0.3.0.dev0,>=0.2.0.dev0", "==0.2.0+local", ">0.2.0.post3",
                                  "~=0.2.0rc1", "==0.2.0.dev2"])
def test_markers_with_dev_pre_post_local_bounds_are_judged(text: str) -> None:
    assert marker_problem(SpecifierSet(text)) is None
    version = next(v for v in [*_GRID, Version("0.2.0.dev2")] if SpecifierSet(text).contains(v, prereleases=True))
    check_pair(Layout.LAYOUT_2, SpecifierSet(text), str(version))  # served: no IncompatibleError


@pytest.mark.parametrize("text", [">=0.2.0.post0,!=0.2.0.*,<0.2.1.1", ">0.2.0.dev1,<0.2.0a1"])
def test_markers_admitting_only_a_narrow_range_are_valid(text: str) -> None:
    """Markers whose only admitted versions are the next release up (0.2.1.dev0 ... 0.2.1.0.x) or the
    next dev release (0.2.0.dev2 ...) admit something, all of it at or above 0.2.0.dev0."""
    marker = SpecifierSet(text)
    assert marker_problem(marker) is None
    version = "0.2.1" if "0.2.1.1" in text else "0.2.0.dev2"
    assert marker.contains(version, prereleases=True)
    check_pair(Layout.LAYOUT_2, marker, version)  # served


def test_a_marker_is_judged_with_pre_releases_whatever_the_set_says() -> None:
    """A set built with prereleases=False (packaging's own default before 26) is still judged under
    PEP 440 ordering with pre-releases admitted, as the plugin is."""
    only_prereleases = SpecifierSet(">=0.2.0rc1,<0.2.0rc2", prereleases=False)
    assert marker_problem(only_prereleases) is None
    check_pair(Layout.LAYOUT_2, only_prereleases, "0.2.0rc1")


def _refusal(*args, **kwargs) -> IncompatibleError:
    with pytest.raises(IncompatibleError) as exc:
        check_pair(*args, **kwargs)
    return exc.value


def test_an_unparsable_plugin_version_is_refused_with_a_fix() -> None:
    err = _refusal(Layout.LAYOUT_2, None, "banana", path="ck")
    assert err.code == "plugin-incompatible"
    assert err.reason == "'banana' is not a version"
    assert err.fix == "pass the installed clef-vllm version, e.g. 0.2.1"


@pytest.mark.parametrize("snapshot", [False, True])
def test_an_unmarked_layout_2_is_refused_with_the_migrate_command(snapshot: bool) -> None:
    err = _refusal(Layout.LAYOUT_2_UNMARKED, None, "0.2.1", path="ck", snapshot=snapshot)
    assert err.code == "marker-missing"
    assert err.reason.startswith("int8 tables without a requires_clef_vllm marker (the 2026-10-07 downloads)")
    assert err.fix == "repair it: clef-format migrate ck --to layout-2" + (" --output DIR" if snapshot else "")


def test_an_unknown_layout_is_refused_with_the_verify_command() -> None:
    err = _refusal(Layout.UNKNOWN, None, "0.2.1", path="ck")
    assert err.code == "unknown-layout"
    assert err.fix == "run clef-format verify ck and re-download what it reports"


def test_a_layout_1_snapshot_for_a_0_2_plugin_is_migrated_to_a_copy() -> None:
    """The cache snapshot itself is never written: the migrate command carries --output."""
    err = _refusal(Layout.LAYOUT_1, None, "0.2.1", path="ck", snapshot=True)
    assert err.code == "plugin-incompatible"
    assert err.fix == "migrate the weights: clef-format migrate ck --to layout-2 --output DIR"


@pytest.mark.parametrize("text, version", [("===0.2.0+cpu,==0.2.0+cpu", "0.2.0+cpu"), ("==0.2.0,===0.2.0+cpu", "0.2.0+cpu"),
                                           ("<=1.0,===1.0+cpu", "1.0+cpu"), ("===0.2.0+cpu,==0.2.1", None)])
def test_an_arbitrary_equality_with_a_local_label_is_judged_exactly(text: str, version: str | None) -> None:
    """``===`` compares the text as written: a marker admitting exactly '0.2.0+cpu' admits a version (it
    was once called empty by a bound that dropped the local label); one admitting nothing says so."""
    problem = marker_problem(SpecifierSet(text))
    if version is None:
        assert problem is not None and "admits no version" in problem
    else:
        assert SpecifierSet(text).contains(version, prereleases=True)
        assert problem is None


def test_a_low_bound_excluded_by_a_wildcard_is_not_called_admitted() -> None:
    """'>=0.1.post0,!=0.1.*,<0.2.1' admits nothing below 0.2.0 that a witness shows: still refused (not
    proven), but never with a false example."""
    problem = marker_problem(SpecifierSet("<0.2.1,>=0.1.post0,!=0.1.*"))
    assert problem is not None and "may admit versions below 0.2.0" in problem and "e.g." not in problem
    problem = marker_problem(SpecifierSet(">=0.1.5,<0.3"))
    assert problem is not None and "admits versions below 0.2.0 (e.g. 0.1.5)" in problem
