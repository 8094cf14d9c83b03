"""The backbone check (verify/checks/backbone.py) when the quantization config cannot be resolved:
each Linear module is then held to the scheme its stored tensors imply."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from clef_format.read.checkpoint import read_checkpoint
from clef_format.read.safetensors import read_header
from clef_format.spec import layouts as L
from clef_format.spec.model_spec import table_shape
from clef_format.verify.checks.backbone import _REDOWNLOAD, check_backbone

BF16_LINEAR = "model.visual.blocks.0.attn.qkv"  # unquantized in every build (vision is ignored)
FP8_LINEAR = "model.language_model.layers.0.mlp.down_proj"  # hybrid: layers 0-3 FP8


def _unresolvable(root: Path) -> None:
    """A quantization_config compressed-tensors refuses (an unknown key in a weights scheme)."""
    path = root / "config.json"
    config = json.loads(path.read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["bogus"] = 1
    path.write_text(json.dumps(config))


def _rewrite(root: Path, change) -> None:
    path = root / L.BACKBONE_SINGLE
    tensors = load_file(str(path))
    meta = read_header(path).metadata
    change(tensors)
    save_file(tensors, str(path), metadata=meta)


def _findings(root: Path) -> list[tuple[str, str | None, str]]:
    return [(f.code, f.tensor, f.message) for f in check_backbone(read_checkpoint(root))]


def test_stored_tensors_of_every_scheme_pass_when_the_config_is_unresolvable(fresh) -> None:
    root = fresh("layout-2", "hybrid")
    _unresolvable(root)
    assert _findings(root) == []


def test_an_unquantized_weight_stored_in_another_float_dtype_is_a_cast_warning(fresh) -> None:
    """vLLM copies a checkpoint tensor into its parameter with a cast (param.data.copy_), and transformers
    casts to the model dtype: a BF16 model's weight stored F32 is served, a warning (issue 23)."""
    root = fresh("layout-2", "hybrid")
    _unresolvable(root)
    _rewrite(root, lambda t: t.update({f"{BF16_LINEAR}.weight": t[f"{BF16_LINEAR}.weight"].to(torch.float32)}))
    (f,) = check_backbone(read_checkpoint(root))
    assert (f.code, f.severity, f.tensor) == ("dtype-cast", "warning", f"{BF16_LINEAR}.weight")
    assert "stored F32 where BF16 is expected" in f.message and "cast" in f.message


def test_an_unquantized_weight_of_a_non_float_dtype_is_an_error(fresh) -> None:
    root = fresh("layout-2", "hybrid")
    _unresolvable(root)
    _rewrite(root, lambda t: t.update({f"{BF16_LINEAR}.weight": t[f"{BF16_LINEAR}.weight"].to(torch.int16)}))
    ((code, tensor, message),) = _findings(root)
    assert (code, tensor) == ("tensor-missing", f"{BF16_LINEAR}.weight")  # an I16 weight implies no scheme


def test_a_float32_config_over_bf16_tensors_is_one_cast_warning(fresh) -> None:
    """torch_dtype float32 over a BF16 export: both loaders cast; one warning whose fix names the stored dtype
    (it was 90 tensor-shape errors telling to re-download the backbone)."""
    from clef_format.verify.run import verify

    root = fresh("layout-2", "fp8")
    path = root / "config.json"
    config = json.loads(path.read_text())
    config["torch_dtype"] = "float32"
    path.write_text(json.dumps(config))
    report = verify(str(root))
    assert report.ok
    (f,) = [f for f in report.findings if f.severity != "info"]
    assert (f.code, f.severity) == ("dtype-cast", "warning") and "stored BF16 where F32 is expected" in f.message
    assert f.fix.endswith('set config.json\'s torch_dtype to "bfloat16"')


def test_a_quantized_weight_is_held_to_its_scheme_s_shapes(fresh) -> None:
    root = fresh("layout-2", "hybrid")
    _unresolvable(root)
    scale = f"{FP8_LINEAR}.weight_scale"
    _rewrite(root, lambda t: t.update({scale: torch.cat([t[scale], t[scale][:1]])}))
    ((code, tensor, _),) = _findings(root)
    assert (code, tensor) == ("tensor-shape", scale)


def test_a_module_without_a_weight_is_named(fresh) -> None:
    root = fresh("layout-2", "hybrid")
    _unresolvable(root)
    _rewrite(root, lambda t: [t.pop(n) for n in list(t) if n.startswith(f"{BF16_LINEAR}.")])
    assert _findings(root) == [("tensor-missing", f"{BF16_LINEAR}.weight",
                                f"{BF16_LINEAR}: no weight stored (neither weight nor weight_packed)")]


def _full_findings(root: Path) -> list:
    return list(check_backbone(read_checkpoint(root)))


def test_a_module_without_a_weight_names_the_module_and_the_fix(fresh) -> None:
    root = fresh("layout-2", "hybrid")
    _unresolvable(root)
    _rewrite(root, lambda t: [t.pop(n) for n in list(t) if n.startswith(f"{BF16_LINEAR}.")])
    (finding,) = _full_findings(root)
    assert (finding.module, finding.fix) == (BF16_LINEAR, _REDOWNLOAD)


def test_a_missing_plain_parameter_is_named_with_the_fix(fresh) -> None:
    root = fresh("layout-2", "hybrid")
    norm = "model.language_model.norm.weight"
    _rewrite(root, lambda t: t.pop(norm))
    (finding,) = _full_findings(root)
    assert (finding.code, finding.tensor, finding.message, finding.fix) == (
        "tensor-missing", norm, f"{norm} is missing", _REDOWNLOAD)


def test_a_tensor_the_config_does_not_imply_is_unexpected(fresh) -> None:
    root = fresh("layout-2", "hybrid")
    extra = "model.language_model.layers.0.mlp.extra.weight"
    _rewrite(root, lambda t: t.update({extra: torch.zeros(2, 2, dtype=torch.bfloat16)}))
    (finding,) = _full_findings(root)
    assert (finding.code, finding.tensor, finding.file) == ("tensor-unexpected", extra, L.BACKBONE_SINGLE)
    assert finding.message.startswith(f"{extra} is not part of a ")


def test_lm_head_is_still_checked_when_embed_tokens_is_absent(fresh) -> None:
    """Layout 1 keeps both tables in the backbone; one absent table does not stop the other's check."""
    root = fresh("layout-1", "hybrid")
    cfg = read_checkpoint(root).model
    vocab, hidden = table_shape(cfg)

    def change(t):
        t.pop(L.EMBED_TOKENS)
        t[L.LM_HEAD] = t[L.LM_HEAD][:-1]

    _rewrite(root, change)
    findings = _full_findings(root)
    assert [(f.code, f.tensor, f.file) for f in findings] == [("table-shape", L.LM_HEAD, L.BACKBONE_SINGLE)]
    assert findings[0].message == f"{L.LM_HEAD} is BF16[{vocab - 1}, {hidden}], expected BF16[{vocab}, {hidden}]"
    assert findings[0].fix == _REDOWNLOAD
    _rewrite(root, lambda t: t.update({L.LM_HEAD: torch.zeros(vocab, hidden, dtype=torch.float32)}))
    assert [(f.code, f.severity, f.tensor) for f in _full_findings(root)] == [("dtype-cast", "warning", L.LM_HEAD)]


def test_a_float16_model_holds_its_biases_to_float16(fresh) -> None:
    """torch_dtype float16: every unquantized tensor, biases included, is F16."""
    root = fresh("layout-2", "hybrid")
    path = root / "config.json"
    config = json.loads(path.read_text())
    config["torch_dtype"] = "float16"
    path.write_text(json.dumps(config))
    _rewrite(root, lambda t: t.update({n: v.to(torch.float16) for n, v in t.items() if v.dtype == torch.bfloat16}))
    assert read_checkpoint(root).model.dtype == "F16"
    assert _findings(root) == []


def test_a_quantization_config_edit_is_fixed_by_the_fix_it_prints(fresh, built) -> None:
    """The hostile tester's case: quantization args edited (``strategy`` null), the tensors as exported.
    The tensor-shape errors' fix must name config.json too (it named only the backbone, which was fine);
    followed (config.json restored from the same revision), the checkpoint verifies OK."""
    from clef_format.verify.run import verify

    root = fresh("layout-2", "fp8")
    path = root / "config.json"
    original = path.read_text()
    config = json.loads(original)
    (group,) = [g for g in config["quantization_config"]["config_groups"].values()][:1]
    group["weights"]["strategy"] = "tensor" if group["weights"]["strategy"] == "channel" else "channel"
    path.write_text(json.dumps(config))
    errors = [f for f in verify(str(root)).findings if f.severity == "error"]
    listed = [f for f in errors if f.code.startswith("tensor-") and f.tensor]  # (the last one counts the rest)
    assert listed and all("config.json" in (f.fix or "") for f in listed)
    path.write_text((built("layout-2", "fp8") / "config.json").read_text())
    assert verify(str(root)).ok


def _follow_torch_dtype_fix(root: Path, fix: str) -> bool:
    """Apply a dtype-cast fix that names a dtype key of config.json; False when the fix names none."""
    import re

    m = re.search(r"set config\.json's (\S+) to (\"\w+\")$", fix)
    if m is None:
        return False
    path = root / "config.json"
    config = json.loads(path.read_text())
    *parents, leaf = m.group(1).split(".")
    node = config
    for k in parents:
        node = node[k]
    node[leaf] = json.loads(m.group(2))
    path.write_text(json.dumps(config))
    return True


def _transformers_dtype(root: Path) -> str:
    """The dtype transformers' own config class resolves (the oracle of which key wins)."""
    from transformers import AutoConfig

    return str(AutoConfig.from_pretrained(str(root)).dtype).removeprefix("torch.")


@pytest.mark.parametrize("keys", [{"torch_dtype": None, "dtype": "float16"},
                                  {"torch_dtype": "bfloat16", "dtype": "float16"},
                                  {"torch_dtype": "float16", "dtype": "bfloat16"}])
def test_the_dtype_key_transformers_keeps_is_the_one_judged_and_fixed(fresh, keys: dict) -> None:
    """transformers 5 keeps ``dtype`` when both keys are given: the cast is judged against it, and the fix
    edits it (an edit of torch_dtype beside it would change nothing)."""
    from clef_format.verify.run import verify

    root = fresh("layout-2", "fp8")
    path = root / "config.json"
    config = json.loads(path.read_text())
    for k, v in keys.items():
        config.pop(k, None) if v is None else config.__setitem__(k, v)
    path.write_text(json.dumps(config))
    casts = [f for f in verify(str(root)).findings if f.code == "dtype-cast"]
    assert bool(casts) == (_transformers_dtype(root) != "bfloat16")  # the export is BF16
    if casts:
        assert _follow_torch_dtype_fix(root, casts[0].fix) and _transformers_dtype(root) == "bfloat16"
        assert "dtype-cast" not in verify(str(root)).codes()


def test_a_few_float32_tensors_in_a_bf16_export_are_not_told_to_make_the_config_float32(fresh) -> None:
    """Two F32 weights among hundreds of BF16 tensors: a torch_dtype of float32 would make every BF16 tensor the
    cast. The fix names no torch_dtype there; where it names one, following it leaves no cast."""
    from clef_format.verify.run import verify

    root = fresh("layout-2", "hybrid")
    _rewrite(root, lambda t: t.update({n: t[n].to(torch.float32) for n in (
        f"{BF16_LINEAR}.weight", "model.visual.blocks.0.attn.proj.weight")}))
    (f,) = [f for f in verify(str(root)).findings if f.code == "dtype-cast"]
    assert "2 tensor(s) stored F32 where BF16 is expected" in f.message
    assert f.fix == "none needed to serve; re-export to store them as the config says"
    assert not _follow_torch_dtype_fix(root, f.fix)


def test_a_torch_dtype_fix_when_followed_leaves_no_cast(fresh) -> None:
    from clef_format.verify.run import verify

    root = fresh("layout-2", "fp8")
    path = root / "config.json"
    config = json.loads(path.read_text())
    config["torch_dtype"] = "float16"
    path.write_text(json.dumps(config))
    (f,) = [f for f in verify(str(root)).findings if f.code == "dtype-cast"]
    assert _follow_torch_dtype_fix(root, f.fix)
    report = verify(str(root))
    assert report.ok and not [f for f in report.findings if f.code == "dtype-cast"]


def _nvfp4_inputs_dynamic(root: Path) -> None:
    path = root / "config.json"
    config = json.loads(path.read_text())
    groups = config["quantization_config"]["config_groups"]
    (name,) = [g for g, v in groups.items() if (v.get("input_activations") or {}).get("dynamic") == "local"]
    groups[name]["input_activations"]["dynamic"] = True
    path.write_text(json.dumps(config))


def test_nvfp4_inputs_declared_dynamic_with_their_global_scales_stored_are_served(fresh) -> None:
    """vLLM builds W4A4 for NVFP4 inputs whatever their ``dynamic`` says, and its CompressedTensorsW4A4Fp4
    registers input_global_scale always (0.28, 0.33): the stored scales are loaded, served as stored."""
    from clef_format.verify.run import verify

    root = fresh("layout-2", "nvfp4", num_layers=4)
    _nvfp4_inputs_dynamic(root)
    report = verify(str(root))
    assert report.ok, [(f.code, f.message) for f in report.findings if f.severity == "error"][:3]


def test_nvfp4_inputs_declared_dynamic_without_their_global_scales_are_broken(fresh) -> None:
    """The same config with the scales dropped (what compressed-tensors stores for dynamic inputs): vLLM's
    input_global_scale stays torch.empty, so the layer computes with garbage."""
    from clef_format.verify.run import verify

    root = fresh("layout-2", "nvfp4", num_layers=4)
    _nvfp4_inputs_dynamic(root)
    _rewrite(root, lambda t: [t.pop(n) for n in list(t) if n.endswith(".input_global_scale")])
    report = verify(str(root))
    assert not report.ok and "input_global_scale" in " ".join(f.message for f in report.findings)
