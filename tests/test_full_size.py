"""Full-size checkpoints (9B names and shapes, sparse data) have real headers and verify clean."""

from __future__ import annotations

from safetensors import safe_open

from clef_format.verify import verify
from fixtures.builders import build_checkpoint


def test_full_size_hybrid_layout_2(tmp_path):
    root = build_checkpoint(tmp_path / "full", layout="layout-2", build="hybrid", full_size=True)
    report = verify(str(root))
    assert report.ok and report.layout == "layout-2", [f.to_dict() for f in report.findings]
    with safe_open(str(root / "clef_head" / "tables_int8.safetensors"), framework="np") as f:
        assert list(f.get_slice("lm_head.weight").get_shape()) == [248320, 4096]
    with safe_open(str(root / "model.safetensors"), framework="np") as f:
        assert list(f.get_slice("model.language_model.layers.31.mlp.down_proj.weight_packed").get_shape()) == [4096, 6144]
        assert list(f.get_slice("model.language_model.layers.0.mlp.down_proj.weight").get_shape()) == [4096, 12288]
    assert report.extra["files"]["model.safetensors"] > 6e9  # sparse on disk, full size in the header


def test_full_size_layout_1_is_legacy(tmp_path):
    root = build_checkpoint(tmp_path / "full1", layout="layout-1", build="nvfp4", full_size=True)
    report = verify(str(root))
    assert report.layout == "layout-1" and report.codes() == {"legacy-layout"}
