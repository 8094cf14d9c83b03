"""compat: the layout/plugin data, the pair check, and the serving gate ``check_checkpoint``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from clef_format.compat import SERVED_BY, IncompatibleError, check_checkpoint, check_pair, expects_int8_tables
from clef_format.read.checkpoint import read_checkpoint
from clef_format.read.hf_cache import PathNotFound
from clef_format.spec import layouts as L
from clef_format.spec.findings import CODES
from clef_format.spec.layouts import Layout
from clef_format.verify.run import verify
from tests.support import hostile_cases

VERSIONS = ("0.1.0", "0.1.9", "0.2.0", "0.2.5", "0.3.0", "1.0.0")


def pair_code(layout: Layout, marker: SpecifierSet | None, version: str) -> str | None:
    try:
        check_pair(layout, marker, version)
    except IncompatibleError as exc:
        return exc.code
    return None


def test_data_names_every_layout() -> None:
    assert set(SERVED_BY) == set(Layout)
    assert SERVED_BY[Layout.LAYOUT_2_UNMARKED] is None and SERVED_BY[Layout.UNKNOWN] is None


@pytest.mark.parametrize("version", VERSIONS)
def test_pair_matrix(version: str) -> None:
    old = version.startswith("0.1")
    assert pair_code(Layout.LAYOUT_1, None, version) == (None if old else "plugin-incompatible")
    assert pair_code(Layout.LAYOUT_2, SpecifierSet(">=0.2.0"), version) == ("plugin-incompatible" if old else None)
    assert pair_code(Layout.LAYOUT_2, SpecifierSet(">=0.2.0,<0.3"), version) == (
        None if version in ("0.2.0", "0.2.5") else "plugin-incompatible")
    assert pair_code(Layout.LAYOUT_2_UNMARKED, None, version) == "marker-missing"
    assert pair_code(Layout.ORIGINAL_RELEASE, None, version) == "plugin-incompatible"
    assert pair_code(Layout.UNKNOWN, None, version) == "unknown-layout"
    assert expects_int8_tables(version) is not old


def test_every_refusal_has_a_known_code_and_a_fix() -> None:
    for layout in Layout:
        for version in (*VERSIONS, "not-a-version"):
            try:
                check_pair(layout, None, version)
            except IncompatibleError as exc:
                assert exc.code in CODES and exc.reason and exc.fix
                assert exc.code in str(exc) and exc.fix in str(exc)


def test_fixes_name_the_way_out() -> None:
    with pytest.raises(IncompatibleError) as exc:
        check_pair(Layout.LAYOUT_2, SpecifierSet(">=0.2.0"), "0.1.3", path="ck")
    assert "pip install 'clef-vllm>=0.2.0'" in exc.value.fix and "--to layout-1" in exc.value.fix
    with pytest.raises(IncompatibleError) as exc:
        check_pair(Layout.LAYOUT_1, None, "0.2.0", path="ck")
    assert exc.value.fix.endswith("clef-format migrate ck --to layout-2")
    with pytest.raises(IncompatibleError) as exc:
        check_pair(Layout.LAYOUT_2_UNMARKED, None, "0.2.0", path="ck", snapshot=True)
    assert "--output DIR" in exc.value.fix  # never write into a Hugging Face snapshot


@pytest.mark.parametrize("layout", ["layout-1", "layout-2", "layout-2-unmarked", "original-release"])
@pytest.mark.parametrize("version", ["0.1.3", "0.2.0"])
def test_check_checkpoint_and_verify_agree(built, layout: str, version: str) -> None:
    """verify --plugin-version and the serving gate answer from the same check."""
    root = built(layout, "bf16", num_layers=4)
    try:
        ck = check_checkpoint(root, version)
        refused = None
    except IncompatibleError as exc:
        refused = exc
    report = verify(str(root), plugin_version=version)
    flagged = [f for f in report.findings if f.code == "plugin-incompatible"]
    assert bool(flagged) == (refused is not None)
    if refused is None:
        assert ck.layout.value == layout
    else:
        assert refused.reason in flagged[0].message


def test_check_checkpoint_accepts_a_read_checkpoint(built) -> None:
    ck = read_checkpoint(built("layout-2", "bf16", num_layers=4))
    assert check_checkpoint(ck, "0.2.0") is ck


def test_check_checkpoint_refuses_layout2_without_tables(fresh) -> None:
    root = fresh("layout-2", "bf16", num_layers=4)
    os.remove(root / L.TABLES)
    assert read_checkpoint(root).layout is Layout.LAYOUT_2  # the marker says layout 2 ...
    with pytest.raises(IncompatibleError) as exc:
        check_checkpoint(root, "0.2.0")  # ... but the tables are not there
    assert exc.value.code == "tables-missing" and "tables_int8" in exc.value.fix


def test_check_checkpoint_refuses_truncated_tables(fresh) -> None:
    root = fresh("layout-2", "bf16", num_layers=4)
    data = (root / L.TABLES).read_bytes()
    (root / L.TABLES).write_bytes(data[: len(data) // 2])
    with pytest.raises(IncompatibleError) as exc:
        check_checkpoint(root, "0.2.0")
    assert exc.value.code == "bad-header"
    assert any(f.code == "bad-header" for f in exc.value.findings)


def test_check_checkpoint_refuses_invalid_marker(fresh) -> None:
    root = fresh("layout-2", "bf16", num_layers=4)
    cfg = json.loads((root / L.HEAD_CONFIG).read_text())
    cfg[L.MARKER_KEY] = "soon"
    (root / L.HEAD_CONFIG).write_text(json.dumps(cfg))
    with pytest.raises(IncompatibleError) as exc:
        check_checkpoint(root, "0.2.0")
    assert exc.value.code == "marker-invalid"


def test_check_checkpoint_missing_path(tmp_path: Path) -> None:
    with pytest.raises(PathNotFound):
        check_checkpoint(tmp_path / "nope", "0.2.0")


def test_gate_imports_no_torch(built) -> None:
    root = built("layout-2", "bf16", num_layers=4)
    code = ("import sys; from clef_format.compat import check_checkpoint; "
            f"check_checkpoint({str(root)!r}, '0.2.0'); "
            "bad = [m for m in ('torch', 'vllm', 'safetensors.torch') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def _gate_and_verify(root: Path, version: str, deep: bool = False) -> tuple[set[str] | None, set[str]]:
    """(codes the gate refuses with, or None when it serves; error codes of verify --plugin-version,
    with ``--deep`` for damage only the deep checks see: the gate decodes the scales as they do)."""
    try:
        check_checkpoint(root, version)
        refused = None
    except IncompatibleError as exc:
        refused = {exc.code, *(f.code for f in exc.findings)}
    except PathNotFound:
        refused = {"path-not-found"}
    report = verify(str(root), plugin_version=version, deep=deep)
    errors = {f.code for f in report.findings if f.severity == "error"}
    return refused, errors


@pytest.mark.parametrize("case", hostile_cases.CASES, ids=[c.name for c in hostile_cases.CASES])
def test_the_gate_refuses_exactly_what_verify_rejects(case: hostile_cases.Case, tmp_path: Path) -> None:
    """Every damaged checkpoint of the hostile corpus: served only when verify finds no error, and
    then refused with one of verify's codes (a head layer dropped, a dtype swapped, an HF-anchored
    pattern, an int8 -128 ... are all refused at start-up, not only reported by verify)."""
    root = hostile_cases.fresh_copy(tmp_path / "ck")
    case.build(root)
    # the gate decodes every scale and hashes what the engine reads against the download's references as
    # verify --deep does; a manifest it cannot use is logged, not refused (the engine never reads it)
    deep = case.deep and case.code in {"nonfinite-scale", "scale-range", "hash-mismatch", "missing-file"}
    refused, errors = _gate_and_verify(root, "0.2.1", deep=deep)
    if errors:
        assert refused is not None, f"{case.name}: verify reports {sorted(errors)} but the gate serves it"
        pair = {"plugin-incompatible", "marker-invalid", "marker-missing", "unknown-layout", "tables-missing"}
        # the gate refuses with verify's codes, or with the pair rule's own where verify says plugin-incompatible
        assert refused <= errors | (pair if "plugin-incompatible" in errors else set()), (refused, errors)
    else:
        assert refused is None, f"{case.name}: verify is clean but the gate refuses {refused}"


def test_the_gate_uses_the_running_vllms_rules(fresh) -> None:
    """The pattern rules follow the vLLM the plugin runs in (here: none installed -> the default), or the one
    named: an ignore regex meant for one shard of a fused layer makes vLLM 0.28 refuse to build it, while
    0.33 builds the whole layer unquantized."""
    from clef_format.vllm.gate import running_vllm
    from clef_format.vllm_rules.names import DEFAULT_VLLM

    v = running_vllm()
    assert v is None or v.count(".") == 1
    root = fresh("layout-2", "nvfp4")
    config = json.loads((root / L.CONFIG).read_text())
    config["quantization_config"]["ignore"].append(r"re:.*in_proj_qkv")
    (root / L.CONFIG).write_text(json.dumps(config))
    refused = {}
    for version in ("0.28", "0.33", None):
        with pytest.raises(IncompatibleError) as exc:
            check_checkpoint(root, "0.2.1", version)
        refused[version] = {f.code for f in exc.value.findings}
    assert "fused-scheme-mismatch" in refused["0.28"] and "layer-unquantized" not in refused["0.28"]
    assert "layer-unquantized" in refused["0.33"]
    assert refused[None] == refused[v or DEFAULT_VLLM]  # the running vLLM's rules (none installed: the default's)


@pytest.mark.parametrize("vllm_version", ["garbage", "0.1", "", "0", 7, ["0.28"]])
def test_a_bad_vllm_version_is_a_usage_error_with_a_fix(built, vllm_version) -> None:
    """The library's error for a bad argument (``UsageError``), with message and fix, before anything is
    read: never a bare ValueError or AttributeError."""
    from clef_format.errors import UsageError

    with pytest.raises(UsageError) as exc:
        check_checkpoint(built("layout-2", "bf16"), "0.2.0", vllm_version=vllm_version)
    assert str(exc.value) and "0.28" in exc.value.fix and exc.value.code == "usage-error"
    assert check_checkpoint(built("layout-2", "bf16"), "0.2.0", vllm_version="0.34")  # unproven, but known


@pytest.mark.parametrize("key, value", [("mrope_section", [1, 1, 1]), ("rope_theta", float("nan"))])
def test_check_checkpoint_refuses_rope_parameters_vllm_cannot_build(fresh, key: str, value) -> None:
    """The gate passed an mrope_section MRotaryEmbedding asserts on, and a NaN rope_theta."""
    root = fresh("layout-2", "bf16", num_layers=4)
    cfg = json.loads((root / L.CONFIG).read_text())
    cfg["text_config"]["rope_parameters"][key] = value
    (root / L.CONFIG).write_text(json.dumps(cfg))
    with pytest.raises(IncompatibleError) as exc:
        check_checkpoint(root, "0.2.0")
    assert exc.value.code == "config-invalid" and any(key in f.message for f in exc.value.findings)


# ---------------------------------------------------------------- files that are there but never read


@pytest.mark.parametrize("kind", ["fifo", "socket"])
def test_a_fifo_or_socket_is_special_file_in_verify_deep_manifest_and_the_gate(fresh, kind: str) -> None:
    """A FIFO (or socket) where tokenizer_config.json belongs: never opened (opening a FIFO blocks until a
    writer comes: the engine would hang), an error that says what it is, and the same in verify, verify
    --deep, manifest and the gate: never 'missing', never served, never silently skipped."""
    import socket

    from clef_format.cli.main import main

    root = fresh()
    rel = "tokenizer_config.json"
    (root / rel).unlink()
    if kind == "fifo":
        os.mkfifo(root / rel)
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(root / rel))
    for deep in (False, True):
        report = verify(str(root), plugin_version="0.2.1", deep=deep)
        hits = [f for f in report.findings if f.file == rel]
        assert [(f.code, f.severity) for f in hits] == [("special-file", "error")], hits
        assert ("FIFO" in hits[0].message and "block forever" in hits[0].message if kind == "fifo"
                else "socket" in hits[0].message)
        assert not any(f.code == "missing-file" for f in report.findings)
    with pytest.raises(IncompatibleError) as exc:
        check_checkpoint(str(root), "0.2.1")
    assert exc.value.code == "special-file" and rel in exc.value.reason and exc.value.fix
    assert main(["manifest", str(root)]) == 1 and not (root / "clef_manifest.json").exists()


def test_manifest_force_past_a_fifo_says_what_it_left_out(fresh, capsys) -> None:
    """``manifest --force`` writes past reading errors, but never silently: the FIFO it cannot list stays
    in the report (a warning now, naming it, with its fix), and the manifest lists every other file."""
    import json

    from clef_format.cli.main import main
    from clef_format.read.manifest import MANIFEST_NAME

    root = fresh()
    os.mkfifo(root / "extra.fifo")
    capsys.readouterr()
    assert main(["manifest", str(root), "--force", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    hits = [f for f in out["findings"] if f["file"] == "extra.fifo"]
    assert [(f["code"], f["severity"]) for f in hits] == [("special-file", "warning")], out
    assert "--force" in hits[0]["message"] and hits[0]["fix"]
    listed = json.loads((root / MANIFEST_NAME).read_text())["files"]
    assert "extra.fifo" not in listed and "config.json" in listed and out["files"] == len(listed)
    (root / MANIFEST_NAME).unlink()
    assert main(["manifest", str(root), "--force"]) == 0  # the text output says it too, with the fix
    text = capsys.readouterr().out
    assert "special-file" in text and "extra.fifo" in text and "fix: " in text


@pytest.mark.parametrize("with_manifest", [False, True])
def test_the_gate_reports_a_symlink_out_of_the_checkpoint_as_verify_does(fresh, tmp_path: Path,
                                                                         with_manifest: bool) -> None:
    """The backbone a symlink to a file outside the checkpoint: verify says path-escape naming it; the gate
    must say the same first (not unknown-layout, nor 'listed in clef_manifest.json but absent')."""
    from clef_format.cli.main import main

    root = fresh()
    if with_manifest:
        assert main(["manifest", str(root)]) == 0
    rel = L.BACKBONE_SINGLE
    outside = tmp_path / "outside.safetensors"
    (root / rel).rename(outside)
    (root / rel).symlink_to(outside)
    report = verify(str(root), plugin_version="0.2.1", deep=with_manifest)
    assert "path-escape" in [f.code for f in report.findings if f.file == rel and f.severity == "error"]
    assert not any(f.code == "missing-file" and f.file == rel for f in report.findings)
    with pytest.raises(IncompatibleError) as exc:
        check_checkpoint(str(root), "0.2.1")
    assert exc.value.code == "path-escape" and rel in exc.value.reason
    assert not any(f.code == "missing-file" for f in exc.value.findings)


def test_gate_or_report_raises_without_a_handler_and_hands_over_with_one(fresh) -> None:
    """The ungated build's hook (examples/clef-vllm): without ``on_refusal`` it is the gate; with one the
    refusal reaches the handler, nothing is raised, and the checkpoint comes back read (not checked)."""
    from clef_format.vllm import gate_or_report, head_config

    root = fresh("layout-2", "bf16", num_layers=4)
    cfg = json.loads((root / L.HEAD_CONFIG).read_text())
    cfg[L.MARKER_KEY] = ">=0.3.0"
    (root / L.HEAD_CONFIG).write_text(json.dumps(cfg))
    with pytest.raises(IncompatibleError) as exc:
        gate_or_report(root, "0.2.1")
    assert exc.value.code == "plugin-incompatible"
    seen: list[IncompatibleError] = []
    ck = gate_or_report(root, "0.2.1", seen.append)
    assert [e.code for e in seen] == ["plugin-incompatible"] and ck.layout is Layout.LAYOUT_2
    seen.clear()
    assert head_config(root, "0.2.1", seen.append) == {k: v for k, v in cfg.items() if k != L.MARKER_KEY}
    assert [e.code for e in seen] == ["plugin-incompatible"]
    with pytest.raises(IncompatibleError):
        head_config(root, "0.2.1")
