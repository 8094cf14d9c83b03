"""Layout detection and a clean verify for every layout, published build and backbone sharding."""

from __future__ import annotations

import pytest

from clef_format.read.checkpoint import read_checkpoint
from clef_format.spec.layouts import Layout, LayoutFacts, detect_layout
from clef_format.verify.run import verify

BUILDS = ["nvfp4", "fp8", "hybrid", "mixed"]


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("layout", ["layout-1", "layout-2"])
def test_every_build_and_layout_verifies(built, layout, build, shards):
    report = verify(str(built(layout, build, shards=shards)))
    assert report.layout == layout
    assert report.ok, [f.to_dict() for f in report.findings]
    expected = {"legacy-layout"} if layout == "layout-1" else set()
    assert report.codes() == expected


def test_original_release_is_sharded_bf16(built):
    root = built("original-release")
    ck = read_checkpoint(root)
    assert ck.layout is Layout.ORIGINAL_RELEASE
    assert len(ck.backbone_files) == 4
    assert {info.dtype for info in ck.backbone.values()} == {"BF16"}
    assert verify(str(root)).ok


def test_unmarked_is_an_error(built):
    report = verify(str(built("layout-2-unmarked")))
    assert report.layout == "layout-2-unmarked"
    assert not report.ok
    (finding,) = [f for f in report.findings if f.code == "marker-missing"]
    assert finding.fix and "clef-format migrate" in finding.fix and "--to layout-2" in finding.fix


def test_text_only_config(built):
    root = built("layout-2", "fp8", multimodal=False)
    report = verify(str(root))
    assert report.ok and report.layout == "layout-2", [f.to_dict() for f in report.findings]
    assert "model.embed_tokens.weight" in read_checkpoint(root).tables


def test_detection_does_not_depend_on_sharding(built):
    one = read_checkpoint(built("layout-1", "nvfp4", shards=1))
    many = read_checkpoint(built("layout-1", "nvfp4", shards=5))
    assert one.layout == many.layout == Layout.LAYOUT_1
    shapes = lambda ck: {k: (v.dtype, v.shape, v.nbytes) for k, v in ck.backbone.items()}  # noqa: E731
    assert shapes(one) == shapes(many)  # same tensors, dtypes, shapes and sizes
    assert len(many.backbone_files) == 5


@pytest.mark.parametrize(
    "facts, layout",
    [
        (LayoutFacts(True, True, False, True, False, False), Layout.ORIGINAL_RELEASE),
        (LayoutFacts(True, False, True, True, False, False), Layout.LAYOUT_1),
        (LayoutFacts(True, False, True, False, True, True), Layout.LAYOUT_2),
        (LayoutFacts(True, False, True, False, True, False), Layout.LAYOUT_2_UNMARKED),
        (LayoutFacts(True, False, True, True, True, False), Layout.LAYOUT_2_UNMARKED),
        (LayoutFacts(True, False, True, False, False, False), Layout.UNKNOWN),
        (LayoutFacts(False, False, True, True, True, True), Layout.UNKNOWN),
        (LayoutFacts(True, False, False, False, False, False), Layout.UNKNOWN),
    ],
)
def test_detect_layout_table(facts, layout):
    assert detect_layout(facts) is layout


def test_release_head_without_backbone_tables_is_unknown() -> None:
    facts = LayoutFacts(has_backbone=True, has_release_head=False, has_clef_head=False, tables_in_backbone=True,
                        has_tables_file=False, has_marker=False)
    assert detect_layout(facts) is Layout.UNKNOWN
    assert detect_layout(facts._replace(has_release_head=True)) is Layout.ORIGINAL_RELEASE
    assert detect_layout(facts._replace(has_release_head=True, tables_in_backbone=False)) is Layout.UNKNOWN


def test_migrate_command_writes_a_snapshot_elsewhere() -> None:
    from clef_format.spec.layouts import migrate_command

    assert migrate_command("ck", "layout-2") == "clef-format migrate ck --to layout-2"
    assert migrate_command("org/name", "layout-2", snapshot=True) == "clef-format migrate org/name --to layout-2 --output DIR"


def _vllm_accepts(folder, value: str) -> bool:
    """vLLM 0.28/0.33's rule, restated: DefaultModelLoader globs ``*.safetensors`` in the folder and
    filter_duplicate_safetensors_files refuses any weight_map value whose os.path.join(folder, value)
    is not one of those strings (tests/tier_vllm/test_index_glob.py runs vLLM's own function)."""
    import glob
    import os

    return os.path.join(str(folder), value) in set(glob.glob(os.path.join(str(folder), "*.safetensors")))


@pytest.mark.parametrize("value", ["a.safetensors", "./a.safetensors", "sub/../a.safetensors", "sub/a.safetensors",
                                   ".h.safetensors", "a.safetensors/", "A.SAFETENSORS", "a.bin", ".safetensors"])
def test_vllm_globs_is_vllms_glob_and_string_comparison(tmp_path, value: str) -> None:
    from clef_format.spec.layouts import vllm_globs

    for rel in ("a.safetensors", ".h.safetensors", ".safetensors", "sub/a.safetensors", "a.bin", "A.SAFETENSORS"):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    assert vllm_globs(value) == _vllm_accepts(tmp_path, value)


@pytest.mark.parametrize("has_tables_file, tables_in_backbone", [(True, False), (False, True), (True, True)])
def test_a_marker_never_read_decides_no_clef_head_layout(has_tables_file: bool, tables_in_backbone: bool) -> None:
    facts = LayoutFacts(has_backbone=True, has_release_head=False, has_clef_head=True,
                        tables_in_backbone=tables_in_backbone, has_tables_file=has_tables_file, has_marker=None)
    assert detect_layout(facts) is Layout.UNKNOWN
