"""The version marker: PEP 440 specifiers through packaging, bare versions read as >=."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clef_format.spec.layouts import MARKER_VALUE
from clef_format.spec.marker import MarkerError, admits, check_marker, parse_marker, with_marker, without_marker


@pytest.mark.parametrize("value, ok, bad", [
    (">=0.2.0", ["0.2.0", "0.2.1", "1.0"], ["0.1.9"]),
    ("0.2.0", ["0.2.0", "0.3"], ["0.1.5"]),
    (">=0.2,<0.4", ["0.3.9"], ["0.4.0", "0.1"]),
    ("~=0.2.1", ["0.2.5"], ["0.3.0"]),
    (">=0.2.0", ["0.2.1rc1"], []),
])
def test_specifiers(value, ok, bad):
    spec = parse_marker(value)
    assert all(admits(spec, v) for v in ok)
    assert not any(admits(spec, v) for v in bad)


@pytest.mark.parametrize("value", ["", "   ", "1+1", "0.2.0+local", "at least 0.2", ">>0.2", 2, None, [">=0.2"], {"v": 1},
                                   ">=0.2.0,,<"])
def test_invalid_markers(value):
    with pytest.raises(MarkerError):
        parse_marker(value)


@given(st.dictionaries(st.sampled_from(["hidden_size", "width", "layers"]), st.integers(1, 100)))
def test_with_and_without_marker_round_trip(cfg):
    marked = with_marker(cfg)
    assert marked["requires_clef_vllm"] == ">=0.2.0"
    assert without_marker(marked) == cfg
    assert "requires_clef_vllm" not in cfg  # never mutates its input


def test_the_written_marker_is_valid_for_packaging():
    """check_marker accepts MARKER_VALUE without parsing it: packaging must agree."""
    from packaging.specifiers import SpecifierSet

    assert parse_marker(MARKER_VALUE) == SpecifierSet(">=0.2.0")
    check_marker(MARKER_VALUE)


@given(st.one_of(st.text(max_size=20), st.sampled_from([">=0.2.0", "0.2.0", ">=0.2.0 ", "=>0.2.0", "1+1", ""]),
                 st.integers(), st.none()))
def test_check_marker_agrees_with_parse_marker(value):
    try:
        parse_marker(value)
        parsed = True
    except MarkerError:
        parsed = False
    try:
        check_marker(value)
        checked = True
    except MarkerError:
        checked = False
    assert parsed == checked


def test_a_pre_release_plugin_counts_as_its_release() -> None:
    """``admits`` passes ``prereleases=True``: packaging alone would refuse 0.3.0rc1 for ">=0.2.0"."""
    spec = parse_marker(MARKER_VALUE)
    assert admits(spec, "0.3.0rc1") and admits(spec, "0.2.1.dev3")
    assert not admits(spec, "0.2.0rc1")  # a pre-release of 0.2.0 is still below 0.2.0


@pytest.mark.parametrize("value, message", [
    (5, "requires_clef_vllm must be a non-empty string, got 5"),
    ("  ", "requires_clef_vllm must be a non-empty string, got '  '"),
    ("1+1", "requires_clef_vllm = '1+1' is a version that cannot be a lower bound: Invalid specifier: '>=1+1'"),
    ("=>0.2.0", "requires_clef_vllm = '=>0.2.0' is not a PEP 440 specifier: Invalid specifier: '=>0.2.0'"),
    (",", "requires_clef_vllm = ',' names no version"),
])
def test_each_invalid_marker_says_why(value, message: str) -> None:
    """The message is what verify reports under marker-invalid: it names the key, the value and the cause."""
    with pytest.raises(MarkerError) as caught:
        parse_marker(value)
    assert str(caught.value) == message


def test_admits_counts_pre_releases_even_for_a_set_that_excludes_them() -> None:
    from packaging.specifiers import SpecifierSet

    spec = SpecifierSet(">=0.2.0", prereleases=False)
    assert admits(spec, "0.3.0rc1") and admits(spec, "0.2.1.dev3")


def test_admits_refuses_a_plugin_version_that_is_no_version() -> None:
    """Never a silent "not admitted": the caller passed something that is not a version."""
    from packaging.version import InvalidVersion

    with pytest.raises(InvalidVersion):
        admits(parse_marker(MARKER_VALUE), "banana")
