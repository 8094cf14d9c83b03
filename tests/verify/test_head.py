"""The joint head check (verify/checks/head.py): a config JointSchemaHead(**config) cannot take is one
head-incomplete error on that file, in each layout's place for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clef_format.read.checkpoint import read_checkpoint
from clef_format.spec import layouts as L
from clef_format.verify.checks.head import check_head
from tests.support.hostile_cases import edit_header


def _drop_key(path: Path, key: str) -> None:
    config = json.loads(path.read_text())
    del config[key]
    path.write_text(json.dumps(config))


@pytest.mark.parametrize("layout, config_rel", [("layout-2", L.HEAD_CONFIG),
                                                ("original-release", L.RELEASE_HEAD_CONFIG)])
def test_a_head_config_lacking_a_key_is_one_error_on_that_file(fresh, layout: str, config_rel: str) -> None:
    root = fresh(layout)
    _drop_key(root / config_rel, "heads")
    (finding,) = check_head(read_checkpoint(root))
    assert finding.to_dict() == {"code": "head-incomplete", "severity": "error",
                                 "message": "joint head config lacks heads", "file": config_rel,
                                 "fix": "re-download the joint head files of this revision"}


def test_a_missing_head_config_is_left_to_the_layout_check(fresh) -> None:
    root = fresh("layout-2")
    (root / L.HEAD_CONFIG).unlink()
    assert list(check_head(read_checkpoint(root))) == []


def test_keys_the_head_does_not_accept_are_named_with_their_removal(fresh) -> None:
    root = fresh("layout-2")
    path = root / L.HEAD_CONFIG
    config = json.loads(path.read_text())
    config["dropout"] = 0.1
    path.write_text(json.dumps(config))
    (finding,) = check_head(read_checkpoint(root))
    assert finding.to_dict() == {
        "code": "head-unexpected", "severity": "error",
        "message": f"{L.HEAD_CONFIG} has keys ['dropout'] that JointSchemaHead(**config) does not accept",
        "file": L.HEAD_CONFIG, "fix": f"remove ['dropout'] from {L.HEAD_CONFIG}"}


def test_a_head_config_that_is_not_json_is_left_to_the_reader(fresh) -> None:
    """The reader reports bad-config and keeps no config; the head check adds nothing on top."""
    root = fresh("layout-2")
    (root / L.HEAD_CONFIG).write_text("{not json")
    ck = read_checkpoint(root)
    assert ck.head_config is None and "bad-config" in {f.code for f in ck.findings}
    assert list(check_head(ck)) == []


def _set_keys(path: Path, **values: object) -> None:
    config = json.loads(path.read_text())
    config.update(values)
    path.write_text(json.dumps(config))


FIX = "re-download the joint head files of this revision"


def test_a_head_hidden_size_other_than_the_backbones_is_one_error_naming_both(fresh) -> None:
    root = fresh("layout-2", "bf16")
    _set_keys(root / L.HEAD_CONFIG, hidden_size=128)
    findings = [f.to_dict() for f in check_head(read_checkpoint(root))]
    assert {"code": "head-incomplete", "severity": "error",
            "message": "joint head hidden_size 128 differs from the backbone's 64",
            "file": L.HEAD_CONFIG, "fix": FIX} in findings


def test_heads_not_dividing_width_is_a_config_error_whose_fix_names_the_release_value(fresh) -> None:
    root = fresh("layout-2", "bf16")
    _set_keys(root / L.HEAD_CONFIG, heads=5)
    (finding,) = [f.to_dict() for f in check_head(read_checkpoint(root)) if f.code == "head-config-invalid"]
    assert finding == {
        "code": "head-config-invalid", "severity": "error",
        "message": f"{L.HEAD_CONFIG}: heads 5 does not divide width 32: multi-head attention splits the width into "
                   "equal heads (JointSchemaHead(**config) fails)",
        "file": L.HEAD_CONFIG,
        "fix": f"set heads in {L.HEAD_CONFIG} to the value the head was trained with (the release: 16, dividing "
               "width 1024)"}


def test_a_wrong_feedforward_of_layers_without_torch_names_gets_the_release_value_as_fix(fresh) -> None:
    """No linear1.weight to read the stored width from: the fix names the release's 4096."""
    root = fresh("layout-2", "bf16")
    rel = L.HEAD_WEIGHTS

    def rename(header: dict) -> None:
        for name in [n for n in header if ".linear1." in n]:
            header[name.replace(".linear1.", ".ff_in.")] = header.pop(name)

    edit_header(rel, rename)(root)
    _set_keys(root / L.HEAD_CONFIG, feedforward=48)
    (finding,) = [f.to_dict() for f in check_head(read_checkpoint(root)) if f.code == "head-config-invalid"]
    assert finding["message"].startswith(f"{L.HEAD_CONFIG}: feedforward 48 is no dimension of any matrix of ")
    assert finding["fix"] == (f"set feedforward in {L.HEAD_CONFIG} to the value the head was trained with "
                              "(the release: 4096)")


def test_a_tensor_missing_from_the_head_file_is_an_error_on_that_file_and_tensor(fresh) -> None:
    root = fresh("layout-2", "bf16")

    def rename(header: dict) -> None:
        header["residual_gate_x"] = header.pop("residual_gate")

    edit_header(L.HEAD_WEIGHTS, rename)(root)
    findings = [f.to_dict() for f in check_head(read_checkpoint(root))]
    assert {"code": "head-incomplete", "severity": "error",
            "message": f"{L.HEAD_WEIGHTS}: lacks residual_gate, which joint_schema_model.py builds",
            "file": L.HEAD_WEIGHTS, "tensor": "residual_gate", "fix": FIX} in findings
    assert any(f["code"] == "head-unexpected" and f["tensor"] == "residual_gate_x" and f["file"] == L.HEAD_WEIGHTS
               for f in findings)


def test_head_problems_beyond_fifty_are_counted_in_one_last_error(fresh) -> None:
    """layers = 60 against 4 stored: 56 missing layers (each one finding for its 18 tensors the reference
    builds), 50 listed, then one finding for the 6 left."""
    root = fresh("layout-2", "bf16")
    _set_keys(root / L.HEAD_CONFIG, layers=60)
    findings = [f.to_dict() for f in check_head(read_checkpoint(root))]
    assert len(findings) == 51
    assert findings[49]["message"] == f"{L.HEAD_WEIGHTS}: lacks layers.53 (18 tensors), which joint_schema_model.py builds"
    assert findings[-1] == {"code": "head-incomplete", "severity": "error",
                            "message": f"{L.HEAD_WEIGHTS}: 6 more problem(s) not listed",
                            "file": L.HEAD_WEIGHTS, "fix": FIX}


def _torch_head_shapes(code_path: Path, config: dict) -> dict[str, tuple[int, ...]]:
    """JointSchemaHead(**config) as the plugin builds it, by torch (the oracle), on the meta device."""
    import importlib.util
    import sys

    torch = pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("ref_cast_head", code_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        with torch.device("meta"):
            head = module.JointSchemaHead(**config)
    finally:
        sys.modules.pop(spec.name, None)
    return {k: tuple(v.shape) for k, v in head.state_dict().items()}


def _cast_config(root: Path, cast_in_code: bool) -> dict:
    """width written 32.0 and heads "4"; the reference converting them itself when ``cast_in_code``."""
    if cast_in_code:
        code = (root / L.HEAD_CODE).read_text()
        (root / L.HEAD_CODE).write_text(code.replace(
            "        super().__init__()\n", "        super().__init__()\n        width = int(width)\n"
            "        heads = int(heads)\n", 1))
    path = root / L.HEAD_CONFIG
    cfg = json.loads(path.read_text())
    cfg["width"], cfg["heads"] = float(cfg["width"]), str(cfg["heads"])
    path.write_text(json.dumps(cfg))
    return {k: v for k, v in cfg.items() if k != "requires_clef_vllm"}


def test_config_values_the_reference_converts_are_a_warning_whose_fix_works(fresh) -> None:
    """width 32.0 and heads "4": JointSchemaHead(**config) builds the head when its own code calls int() on
    them (torch shows it, and the file is that head): a warning, not the strict integer rule's error."""
    from clef_format.read.safetensors import read_header
    from clef_format.verify.run import verify

    root = fresh("layout-2", "bf16")
    raw = _cast_config(root, cast_in_code=True)
    stored = {n: tuple(i.shape) for n, i in read_header(root / L.HEAD_WEIGHTS).tensors.items()}
    assert _torch_head_shapes(root / L.HEAD_CODE, raw) == stored
    report = verify(str(root))
    (f,) = [f for f in report.findings if f.code == "head-config-invalid"]
    assert report.ok and f.severity == "warning" and "width, heads not integers" in f.message
    assert f.fix.endswith("width: 32, heads: 4")
    path = root / L.HEAD_CONFIG
    cfg = json.loads(path.read_text())
    cfg.update(width=32, heads=4)
    path.write_text(json.dumps(cfg))
    after = verify(str(root))
    assert after.ok and "head-config-invalid" not in after.codes()


def test_config_values_the_reference_does_not_convert_stay_an_error(fresh) -> None:
    """The same config under a reference that uses width as given: torch cannot build the head."""
    from clef_format.verify.run import verify

    root = fresh("layout-2", "bf16")
    raw = _cast_config(root, cast_in_code=False)
    with pytest.raises(TypeError):
        _torch_head_shapes(root / L.HEAD_CODE, raw)
    report = verify(str(root))
    assert not report.ok and "head-incomplete" in report.codes()
    assert not [f for f in report.findings if "converts them" in f.message]  # it does not: no such claim


def test_a_string_the_reference_cannot_convert_stays_an_error(fresh) -> None:
    from clef_format.verify.run import verify

    root = fresh("layout-2", "bf16")
    raw = _cast_config(root, cast_in_code=True)
    path = root / L.HEAD_CONFIG
    cfg = json.loads(path.read_text())
    cfg["heads"] = "4.0"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ValueError):
        _torch_head_shapes(root / L.HEAD_CODE, {**raw, "heads": "4.0"})
    assert not verify(str(root)).ok
