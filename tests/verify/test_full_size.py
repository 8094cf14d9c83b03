"""Full-size checkpoints (9B names and shapes, sparse data) have real headers and verify clean."""

from __future__ import annotations

from safetensors import safe_open

from clef_format.fixtures.builders import build_checkpoint
from clef_format.verify.run import verify


def test_full_size_hybrid_layout_2(tmp_path):
    root = build_checkpoint(tmp_path / "full", layout="layout-2", build="hybrid", full_size=True)
    report = verify(str(root))
    assert report.ok and report.layout == "layout-2", [f.to_dict() for f in report.findings]
    with safe_open(str(root / "clef_head" / "tables_int8.safetensors"), framework="np") as f:
        assert list(f.get_slice("lm_head.weight").get_shape()) == [248320, 4096]
    with safe_open(str(root / "model.safetensors"), framework="np") as f:
        assert list(f.get_slice("model.language_model.layers.31.mlp.down_proj.weight_packed").get_shape()) == [4096, 6144]
        assert list(f.get_slice("model.language_model.layers.0.mlp.down_proj.weight").get_shape()) == [4096, 12288]
    assert report.details.files["model.safetensors"] > 6e9  # sparse on disk, full size in the header


def test_full_size_layout_1_is_legacy(tmp_path):
    root = build_checkpoint(tmp_path / "full1", layout="layout-1", build="nvfp4", full_size=True)
    report = verify(str(root))
    assert report.layout == "layout-1" and report.codes() == {"legacy-layout"}


def test_structure_path_imports_nothing_heavy(tmp_path):
    """verify of a full-size layout-2 checkpoint imports no torch, numpy, packaging, tqdm, rich, dataclasses, typing."""
    import subprocess
    import sys

    root = build_checkpoint(tmp_path / "full", layout="layout-2", build="hybrid", full_size=True)
    code = (
        "import sys\nbefore = set(sys.modules)\nimport io, contextlib\nfrom clef_format.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = main(['verify', {str(root)!r}, '--json'])\n"
        "heavy = sorted(m for m in set(sys.modules) - before if m.split('.')[0] in ('torch', 'numpy', 'packaging', 'tqdm',"
        " 'rich', 'dataclasses', 'click', 'huggingface_hub', 'safetensors', 'compressed_tensors', 'pathlib', 'typing'))\n"
        "print(rc, heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "0 []"
