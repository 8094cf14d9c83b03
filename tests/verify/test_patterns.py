"""Every pattern finding, produced by a real-format fixture checkpoint and asserted.

The checkpoints come from fixtures.builders (stored tensors in the real schemes); their
quantization_config is replaced by a broken one made with compressed-tensors' own classes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import pytest

from clef_format.fixtures.quant import PROJ, build_quant_config
from clef_format.read.checkpoint import read_checkpoint
from clef_format.spec.findings import Finding
from clef_format.verify.checks.patterns import check_patterns, pattern_findings
from clef_format.verify.options import VerifyOptions
from clef_format.vllm_rules.names import VERSION_TABLE
from tests.support.pattern_cases import quant_dict

N = 8  # fixture layers; hybrid stores layers 0-3 FP8, 4-7 NVFP4


def findings_with(root: Path, edit: Callable[[dict[str, Any]], None] | None = None) -> list[Finding]:
    if edit is not None:
        cfg_path = root / "config.json"
        config = json.loads(cfg_path.read_text())
        edit(config["quantization_config"] if "quantization_config" in config else config)
        cfg_path.write_text(json.dumps(config))
    return check_patterns(read_checkpoint(root))


def by_code(fs: list[Finding], code: str) -> list[Finding]:
    return [f for f in fs if f.code == code]


@pytest.mark.parametrize("build", ["nvfp4", "fp8", "hybrid", "mixed"])
def test_published_builds_have_no_pattern_errors(built: Callable[..., Path], build: str) -> None:
    fs = check_patterns(read_checkpoint(built("layout-2", build)))
    assert fs == []  # "lm_head" in ignore misses vLLM's language_model.lm_head, harmlessly: not reported


def test_ignore_unmatched_when_it_matters(fresh: Callable[..., Path]) -> None:
    """Targets reaching vLLM's lm_head make the HF-only "lm_head" ignore entry matter (layout-1 stores it BF16)."""
    fs = findings_with(fresh("layout-1", "nvfp4"), lambda q: q["config_groups"]["group_0"].update(targets=["Linear", "LMHead"]))
    (f,) = by_code(fs, "ignore-unmatched")
    assert f.severity == "warning" and f.fix == "use 'language_model.lm_head' instead of 'lm_head'"
    (m,) = by_code(fs, "scheme-tensor-mismatch")  # vLLM builds NVFP4 over the stored BF16 lm_head
    assert "language_model.lm_head" in m.message


def test_ignore_entry_matching_nothing(fresh: Callable[..., Path]) -> None:
    fs = findings_with(fresh("layout-2", "nvfp4"), lambda q: q["ignore"].append(r"re:.*no_such_proj$"))
    assert [f.severity for f in by_code(fs, "ignore-unmatched")] == ["info"]


def test_quant_config_invalid(fresh: Callable[..., Path]) -> None:
    fs = findings_with(fresh(), lambda q: q["config_groups"]["group_0"]["weights"].update(bogus=1))
    assert [f.code for f in fs] == ["quant-config-invalid"]


def test_pattern_unmatched(fresh: Callable[..., Path]) -> None:
    fs = findings_with(fresh(), lambda q: q["config_groups"]["group_0"]["targets"].append(r"re:.*mlp\.gate_upp_proj$"))
    (f,) = by_code(fs, "pattern-unmatched")
    assert "gate_upp_proj" in f.message and f.severity == "warning"


def test_hf_anchored_targets_leave_stored_fp8_layers_unquantized(fresh: Callable[..., Path]) -> None:
    anchored = rf"re:model\.language_model\.layers\.(0|1|2|3)\.{PROJ}$"
    fs = findings_with(fresh(), lambda q: q["config_groups"]["group_0"].update(targets=[anchored]))
    (f,) = by_code(fs, "pattern-hf-anchored")
    assert f.severity == "error" and anchored in f.message
    assert f.fix == f"use 're:language_model\\.model{anchored[len('re:model.language_model') + 1:]}' instead of '{anchored}'"
    unq = by_code(fs, "layer-unquantized")
    assert unq and all(x.severity == "error" for x in unq)
    assert any("layers.{0-3}" in x.message for x in unq)


def test_fix_of_hf_anchored_target_clears_the_findings(fresh: Callable[..., Path]) -> None:
    anchored = rf"re:model\.language_model\.layers\.(0|1|2|3)\.{PROJ}$"
    root = fresh()
    (f,) = by_code(findings_with(root, lambda q: q["config_groups"]["group_0"].update(targets=[anchored])), "pattern-hf-anchored")
    fixed = f.fix.split("'")[1]
    fs = findings_with(root, lambda q: q["config_groups"]["group_0"].update(targets=[fixed]))
    assert [x for x in fs if x.severity == "error"] == []


def test_half_ignored_fused_layer(fresh: Callable[..., Path]) -> None:
    fs = findings_with(fresh(), lambda q: q["ignore"].append(r"re:.*in_proj_qkv$"))
    (f,) = by_code(fs, "fused-scheme-mismatch")
    assert "in_proj_qkvz" in f.message and "partly ignored" in f.message and f.severity == "error"
    assert "its shards (in_proj_qkv, in_proj_z) are partly ignored" in f.message
    assert f.fix == "ignore all of in_proj_qkv, in_proj_z or none of them (anchor regexes with $)"


def test_fused_shards_in_different_groups(fresh: Callable[..., Path]) -> None:
    def edit(q: dict[str, Any]) -> None:
        new = quant_dict([("FP8_DYNAMIC", [r"re:.*in_proj_qkv"], "float-quantized"),
                          ("NVFP4", [r"re:.*in_proj_z$", r"re:.*mlp.*", r"re:.*(self_attn|out_proj).*"], "nvfp4-pack-quantized")],
                         q["ignore"], "mixed-precision")
        q.clear()
        q.update(new)

    fs = findings_with(fresh("layout-2", "nvfp4"), edit)
    fused = by_code(fs, "fused-scheme-mismatch")
    assert fused and "in_proj_qkvz" in fused[0].message
    assert ("vLLM fuses shards the quantizer treated differently (in_proj_qkv: fp8-w8a8 via 're:.*in_proj_qkv'; "
            "in_proj_z: nvfp4-w4a4 via 're:.*in_proj_z$'); vLLM builds one scheme for all: fp8-w8a8") in fused[0].message
    # vLLM builds FP8 (the unanchored in_proj_qkv matches the fused name) over stored NVFP4 tensors
    mism = by_code(fs, "scheme-tensor-mismatch")
    assert mism and "fp8-w8a8" in mism[0].message and "nvfp4-w4a4" in mism[0].message


def test_scheme_tensor_mismatch(fresh: Callable[..., Path]) -> None:
    """Hybrid tensors (FP8 layers 0-3) under the NVFP4-everywhere config."""
    nvfp4 = build_quant_config("nvfp4", N)

    def edit(q: dict[str, Any]) -> None:
        q.clear()
        q.update(nvfp4)

    fs = findings_with(fresh(), edit)
    mism = by_code(fs, "scheme-tensor-mismatch")
    assert mism and all("layers.{0-3}" in f.message for f in mism)
    assert all("nvfp4-w4a4" in f.message and "fp8-w8a8" in f.message for f in mism)


def test_layer_meant_quantized_but_bf16_in_vllm(fresh: Callable[..., Path]) -> None:
    """A BF16 checkpoint whose recipe quantizes HF names vLLM never sees: warning (nothing stored quantized)."""
    fs = findings_with(fresh("layout-2", "bf16"), lambda c: c.update(
        quantization_config=quant_dict([("NVFP4", [r"re:model\.language_model\..*mlp.*"], None)], [], "nvfp4-pack-quantized")))
    unq = by_code(fs, "layer-unquantized")
    assert unq and {f.severity for f in unq} == {"warning"}
    assert all("the recipe quantizes it (nvfp4-w4a4 via 're:model\\.language_model\\..*mlp.*') but vLLM builds it "
               "unquantized (no target matches)" in f.message for f in unq)


def test_fused_ignore_meaning_differs_by_vllm_version(fresh: Callable[..., Path]) -> None:
    """A prefix regex meant for one shard: on 0.28 vLLM raises, on 0.33 the fused layer silently stays BF16.
    Either version's findings say what the other does."""
    from clef_format.read.checkpoint import read_checkpoint as read

    root = fresh("layout-2", "nvfp4")
    findings_with(root, lambda q: q["ignore"].append(r"re:.*in_proj_qkv"))
    ck = read(root)
    old = check_patterns(ck)  # default: 0.28, the version the serving plugin pins
    (f,) = [x for x in by_code(old, "fused-scheme-mismatch") if x.severity == "error"]
    assert "refuses to build" in f.message and "in_proj_qkvz" in f.message
    assert "not on vLLM 0.33" in f.message and "'re:.*in_proj_qkv' matches the fused layer name" in f.message
    there = [x for x in old if x.message.startswith("on vLLM 0.33 (checked: 0.28)")]
    assert {x.code for x in there} == {"layer-unquantized", "fused-scheme-mismatch"}
    assert {x.severity for x in there} == {"warning"}  # errors on another version warn about this one
    assert all("silently" not in x.message and "in_proj_qkvz" in x.message for x in there)
    new = check_patterns(ck, VerifyOptions(vllm_version="0.33"))
    (e,) = by_code(new, "layer-unquantized")
    assert e.severity == "error" and "stored nvfp4-w4a4 but vLLM builds it unquantized (ignored)" in e.message
    assert "not on vLLM 0.28" in e.message
    assert [x.code for x in new if x.message.startswith("on vLLM 0.28 (checked: 0.33)")] == ["fused-scheme-mismatch"]


def test_same_meaning_on_every_version_adds_nothing(built: Callable[..., Path]) -> None:
    ck = read_checkpoint(built("layout-2", "hybrid"))
    for version in ("0.28", "0.33"):
        assert check_patterns(ck, VerifyOptions(vllm_version=version)) == []


def test_config_refused_only_on_another_version_is_a_warning(fresh: Callable[..., Path]) -> None:
    """Group activation ordering: vLLM 0.28 serves it, 0.30+ refuses the whole config."""
    root = fresh("layout-2", "nvfp4")
    fs = findings_with(root, lambda q: q["config_groups"]["group_0"]["weights"].update(actorder="group"))
    (w,) = fs
    assert (w.code, w.severity) == ("quant-config-invalid", "warning")
    assert w.message.startswith("on vLLM 0.33 (checked: 0.28): vLLM refuses quantization_config")
    assert "activation ordering" in w.message
    after = next(r.after for r in VERSION_TABLE if r.name == "actorder_group_refused")
    assert w.message.endswith(f"[from 0.30: {after}]")  # the row behind the difference, by its meaning
    ck = read_checkpoint(root)
    (e,) = [f for f in check_patterns(ck, VerifyOptions(vllm_version="0.33")) if f.severity == "error"]
    assert e.code == "quant-config-invalid" and "not on vLLM 0.28" in e.message


def test_another_version_is_compared_when_every_differing_row_is_in_play(fresh: Callable[..., Path]) -> None:
    """0.28 against 0.30 differ in two rows (fused-name ignore, actorder); this config meets both."""
    root = fresh("layout-2", "nvfp4")

    def edit(q: dict[str, Any]) -> None:
        q["config_groups"]["group_0"]["weights"].update(actorder="group")
        q["ignore"].append(r"re:.*in_proj_qkv")

    findings_with(root, edit)
    ck = read_checkpoint(root)
    fs = pattern_findings(ck.model, ck.backbone, "0.28", ("0.30",))
    (mine,) = [f for f in fs if f.severity == "error"]
    assert mine.code == "fused-scheme-mismatch" and "[not on vLLM 0.30: ignore 're:.*in_proj_qkv' matches" in mine.message
    (theirs,) = [f for f in fs if f.severity == "warning"]
    assert theirs.code == "quant-config-invalid"
    assert theirs.message.startswith("on vLLM 0.30 (checked: 0.28): vLLM refuses quantization_config")


def test_a_class_name_target_no_vllm_layer_has_is_reported_as_hf_only(fresh: Callable[..., Path]) -> None:
    """compressed-tensors matches "Module" against every HF module's class; vLLM's layer classes never contain it."""
    fs = findings_with(fresh("layout-2", "nvfp4"), lambda q: q["config_groups"]["group_0"].update(targets=["Module"]))
    (f,) = by_code(fs, "pattern-hf-anchored")
    assert f.severity == "error" and f.message.startswith("target 'Module' matches Hugging Face modules (")
    assert not by_code(fs, "pattern-unmatched")


def test_scheme_tensor_mismatch_lists_every_stored_kind_of_a_fused_layer(fresh: Callable[..., Path]) -> None:
    """Hybrid layer 0 (FP8 in the config) with gate_proj stored NVFP4 (layer 4's tensors) and up_proj BF16."""
    import torch
    from safetensors.torch import load_file, save_file

    from clef_format.read.safetensors import read_header
    from clef_format.spec import layouts as L

    root = fresh("layout-2", "hybrid")
    path = root / L.BACKBONE_SINGLE
    tensors, meta = load_file(str(path)), read_header(path).metadata
    gate0, gate4 = "model.language_model.layers.0.mlp.gate_proj.", "model.language_model.layers.4.mlp.gate_proj."
    up0 = "model.language_model.layers.0.mlp.up_proj."
    shape = tensors[up0 + "weight"].shape
    for n in [n for n in tensors if n.startswith((gate0, up0))]:
        del tensors[n]
    tensors.update({gate0 + n[len(gate4):]: t.clone() for n, t in tensors.items() if n.startswith(gate4)})
    tensors[up0 + "weight"] = torch.zeros(shape, dtype=torch.bfloat16)
    save_file(tensors, str(path), metadata=meta)
    (f,) = by_code(check_patterns(read_checkpoint(root)), "scheme-tensor-mismatch")
    assert f.message.startswith("language_model.model.layers.{0}.mlp.gate_up_proj: vLLM builds fp8-w8a8")
    assert f.message.endswith("but the stored tensors are nvfp4-w4a4, unquantized")


@pytest.mark.parametrize("field, value", [("num_bits", "8"), ("num_bits", 8.0), ("symmetric", "true"), ("symmetric", 1),
                                          ("dynamic", 0)])
def test_args_compressed_tensors_coerces_verify_like_the_typed_value(fresh: Callable[..., Path], field: str,
                                                                     value: Any) -> None:
    """QuantizationArgs is a lax pydantic model: "8" and 8.0 are the int 8, "true" and 1 are True, 0 is
    False (tests/spec/test_quant_args_vs_compressed_tensors.py proves the rules). vLLM builds the same
    schemes, so verify finds the checkpoint as valid as with the typed value."""
    from clef_format.verify.run import verify

    root = fresh("layout-2", "fp8")
    cfg_path = root / "config.json"
    config = json.loads(cfg_path.read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"][field] = value
    cfg_path.write_text(json.dumps(config))
    report = verify(str(root))
    assert report.ok and not [f for f in report.findings if f.severity == "error"], report.findings


@pytest.mark.parametrize("field, value", [("num_bits", 8.5), ("num_bits", "eight"), ("symmetric", "maybe"),
                                          ("symmetric", 2), ("dynamic", "true"), ("observer", 5)])
def test_args_compressed_tensors_refuses_stay_refused(fresh: Callable[..., Path], field: str, value: Any) -> None:
    fs = findings_with(fresh("layout-2", "fp8"), lambda q: q["config_groups"]["group_0"]["weights"].update({field: value}))
    (f,) = by_code(fs, "quant-config-invalid")
    assert f.severity == "error" and field in f.message


@pytest.mark.parametrize("target", [r"re:.*Linear", "linear"])
def test_class_name_target_is_one_pattern_finding_with_a_pattern_fix(fresh: Callable[..., Path], target: str) -> None:
    """vLLM matches these against its layers' class names (re.match / case-insensitive substring) and builds
    every layer FP8 as stored; compressed-tensors' quantizer matches neither. The finding names the pattern
    and its fix; the backbone is not blamed (it was 100 tensor errors telling to re-download it)."""
    from clef_format.verify.run import verify

    root = fresh("layout-2", "fp8")

    def retarget(value: str) -> None:
        cfg_path = root / "config.json"
        config = json.loads(cfg_path.read_text())
        config["quantization_config"]["config_groups"]["group_0"]["targets"] = [value]
        cfg_path.write_text(json.dumps(config))

    retarget(target)
    report = verify(str(root))
    assert report.ok, [f for f in report.findings if f.severity == "error"]
    (f,) = [f for f in report.findings if f.severity != "info"]
    assert (f.code, f.severity, f.fix) == ("pattern-class-name", "warning", f"use 'Linear' instead of '{target}'")
    assert f"target '{target}'" in f.message and "ColumnParallelLinear" in f.message
    retarget("Linear")  # the fix
    assert not [f for f in verify(str(root)).findings if f.severity != "info"]


def test_class_name_target_over_bf16_weights_is_still_an_error(fresh: Callable[..., Path]) -> None:
    """Where vLLM builds FP8 by class name over weights stored BF16, the layers are still refused."""
    fs = findings_with(fresh("layout-2", "bf16"), lambda c: c.update(quantization_config=quant_dict(
        [("FP8_DYNAMIC", [r"re:.*Linear"], None)], ["lm_head", r"re:.*visual.*"], "float-quantized")))
    assert by_code(fs, "pattern-class-name") and any(f.severity == "error" for f in fs)
