"""Backbone checks: exactly the tensors the config implies, each with its dtype and shape, and no other.

One spec: ``spec.model_spec`` lists every module and plain parameter (text and vision, biases where
the model has them); ``spec.schemes.group_signature`` says which parameters, dtypes and shapes each
Linear module stores under the config group that quantized it (resolved as compressed-tensors does,
``vllm_rules.matching.resolve_hf``). When the quantization config cannot be parsed (reported by the
patterns check), a module is held to the scheme its stored tensors imply.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from clef_format.verify.vllm_build import VllmBuild
    from typing import Any, Callable, Iterator, Mapping

from clef_format.read.checkpoint import Checkpoint
from clef_format.verify.options import DEFAULTS, VerifyOptions
from clef_format.spec.findings import Finding, error, warning
from clef_format.spec.layouts import Layout
from clef_format.spec.model_spec import (ModelConfig, dtype_key, kv_cache_params, linear_modules, plain_params, table_shape,
                                         unscheduled_kv_scales)
from clef_format.spec.schemes import (
    FLOAT_DTYPES,
    NVFP4_W4A4,
    SCHEME_PARAMS,
    ParamSpec,
    expected_shapes,
    group_signature,
    signature_problems,
    stored_scheme,
)

#: The tensors and config.json disagree, and either may be the one changed (an edited quantization_config
#: gives the same errors as a damaged shard): the fix restores both.
_REDOWNLOAD = ("re-download the backbone and config.json from the same revision (they disagree; either may be the "
               "one changed); if it was produced locally, re-run the export")
_CODES = {"missing": "tensor-missing", "shape": "tensor-shape", "unexpected": "tensor-unexpected"}
_NAMES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def is_cast(stored: Any, dtypes: tuple[str, ...], shapes: tuple[tuple[int, ...], ...]) -> bool:
    """A float tensor of the right shape stored in another float dtype than the one expected. vLLM copies
    every checkpoint tensor into its parameter with ``param.data.copy_`` (default_weight_loader and the
    parallel linear loaders, 0.28 and 0.33: no dtype check), which casts, and transformers casts to the
    model's dtype too; so this is served (F32 -> BF16 rounds values that BF16 cannot hold)."""
    return (stored.dtype in FLOAT_DTYPES and all(d in FLOAT_DTYPES for d in dtypes) and stored.dtype not in dtypes
            and tuple(stored.shape) in shapes)


def _cast_finding(casts: Mapping[tuple[str, str], list[str]], dtype: str,
                  config_fix_holds: Callable[[str], bool], key: str) -> Iterator[Finding]:
    """One warning per (stored, expected) pair of dtypes, naming a few tensors. The fix names a torch_dtype
    only when ``config_fix_holds`` proves it: the backbone checked again under that dtype has no cast left
    (a few F32 norms in a BF16 export would otherwise be told to make the config float32, and then every
    BF16 tensor would be the cast)."""
    for (have, want), names in casts.items():
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        lossy = " (rounding the values BF16 or F16 cannot hold)" if FLOAT_DTYPES.index(have) > FLOAT_DTYPES.index(
            want) or {have, want} == {"BF16", "F16"} else " (exactly)"
        fix = (f'none needed to serve; to load them as stored, set config.json\'s {key} to "{_NAMES[have]}"'
               if want == dtype and len({h for h, w in casts if w == dtype}) == 1 and config_fix_holds(have) else
               "none needed to serve; re-export to store them as the config says")
        yield warning("dtype-cast", f"{len(names)} tensor(s) stored {have} where {want} is expected ({shown}): vLLM "
                      f"and transformers cast them to {want} on load{lossy}; a loader that copies without a cast "
                      "(e.g. load_state_dict(assign=True)) would keep the stored dtype", tensor=names[0], fix=fix)


def _signatures(cfg: ModelConfig, version: str,
                built: VllmBuild | None = None) -> Mapping[str, Mapping[str, ParamSpec]] | None:
    """Per Linear module, the parameter signature of its config group (the config as ``built`` parsed it
    for vLLM ``version``, when given); ``None`` if the quantization config cannot be resolved. A module
    the quantizer left alone but vLLM quantizes through a target matching only its class name
    (``re:.*Linear``) is held to the group vLLM builds it with: the stored tensors are what vLLM needs,
    and the pattern, not the backbone, is what to fix."""
    specs = linear_modules(cfg)
    if not cfg.quantization:
        return {m.name: group_signature(None, None, None, None, m.out_features, m.in_features, cfg.dtype) for m in specs}
    from clef_format.vllm_rules.matching import QuantConfigError, class_matched_modules, parse_quant_config, resolve_hf

    try:
        qc = built.quant if built is not None and built.quant is not None else \
            parse_quant_config(cfg.quantization, version)
        decisions = resolve_hf(cfg, qc)
        by_class = class_matched_modules(cfg, qc, version)  # reported as pattern-class-name by the patterns check
    except (QuantConfigError, ValueError, TypeError):
        return None
    out: dict[str, Mapping[str, ParamSpec]] = {}
    # modules share groups and shapes: (target, or ("vllm", target) for a class match; out; in)
    memo: dict[tuple[str | tuple[str, str] | None, int, int], Mapping[str, ParamSpec]] = {}
    for m in specs:
        d = decisions.get(m.name)
        target = d.target if d is not None and d.scheme is not None and d.target in qc.hf_targets else None
        vllm_entry = by_class.get(m.name) if target is None else None
        key = (target if vllm_entry is None else ("vllm", vllm_entry.target), m.out_features, m.in_features)
        sig = memo.get(key)
        if sig is None:
            entry = qc.hf_targets[target] if target is not None else vllm_entry
            if entry is None:
                sig = group_signature(None, None, None, None, m.out_features, m.in_features, cfg.dtype)
            else:
                sig = group_signature(entry.weights.raw, entry.input.raw if entry.input else None,
                                      entry.output.raw if entry.output else None, entry.format or qc.format,
                                      m.out_features, m.in_features, cfg.dtype)
                if d is not None and d.scheme == NVFP4_W4A4 and "input_global_scale" not in sig:
                    # vLLM's CompressedTensorsW4A4Fp4.create_weights registers it whatever the inputs' dynamic
                    # says (0.28, 0.33): loaded when stored; without it, left as torch.empty made it
                    sig = {**sig, "input_global_scale": ParamSpec(("F32",), ((1,),))}
            memo[key] = sig
        out[m.name] = sig
    return out


def _stored_signature(stored: Mapping[str, Any], out_f: int, in_f: int, dtype: str) -> Mapping[str, ParamSpec] | None:
    """The fallback: the signature of the scheme the stored tensors imply."""
    scheme = stored_scheme(stored)
    if scheme is None:
        return None
    shapes = expected_shapes(scheme, out_f, in_f)
    return {s: ParamSpec(rule.dtypes if s != "weight" or scheme != "unquantized" else (dtype,),
                         tuple(shapes[s])) for s, rule in SCHEME_PARAMS[scheme].items() if rule.required}


def module_params(backbone: Mapping[str, Any], modules: Any) -> dict[str, dict[str, Any]]:
    """Stored parameters of each module: module -> {suffix: header entry}; any suffix (one pass)."""
    out: dict[str, dict[str, Any]] = {m: {} for m in modules}
    for name, info in backbone.items():
        module, _, suffix = name.rpartition(".")
        params = out.get(module)
        if params is not None:
            params[suffix] = info
    return out


def check_backbone(ck: Checkpoint, opts: VerifyOptions = DEFAULTS, vllm: VllmBuild | None = None) -> Iterator[Finding]:
    if ck.model is None or not ck.backbone:
        return
    yield from _backbone_findings(ck, ck.model, opts, vllm, prove=True)


def _backbone_findings(ck: Checkpoint, cfg: ModelConfig, opts: VerifyOptions, vllm: VllmBuild | None,
                       prove: bool) -> Iterator[Finding]:
    """The backbone held to ``cfg``; ``prove``: a torch_dtype fix is checked by running this again under it."""
    dtype = cfg.dtype

    def config_fix_holds(stored: str) -> bool:
        if not prove:
            return False
        again = _backbone_findings(ck, cfg._replace(dtype=stored), opts, vllm, prove=False)
        return not any(f.code == "dtype-cast" for f in again)

    accounted: set[str] = set()
    specs = linear_modules(cfg)
    params = module_params(ck.backbone, (m.name for m in specs))
    signatures = _signatures(cfg, opts.rules, vllm)
    casts: dict[tuple[str, str], list[str]] = {}
    for spec in specs:
        stored = params[spec.name]
        accounted.update(f"{spec.name}.{s}" for s in stored)
        want = signatures[spec.name] if signatures is not None else _stored_signature(
            stored, spec.out_features, spec.in_features, dtype)
        if want is None:
            yield error("tensor-missing", f"{spec.name}: no weight stored (neither weight nor weight_packed)",
                        module=spec.name, tensor=f"{spec.name}.weight", file=None, fix=_REDOWNLOAD)
            continue
        for kind, suffix, text in signature_problems(want, stored, spec.out_features if spec.bias else None, dtype):
            tensor = f"{spec.name}.{suffix}"
            rule = want.get(suffix) or ParamSpec((dtype,), ((spec.out_features,),))  # (the bias)
            if kind == "shape" and is_cast(stored[suffix], rule.dtypes, rule.shapes):
                casts.setdefault((stored[suffix].dtype, rule.dtypes[0]), []).append(tensor)
                continue
            yield error(_CODES[kind], f"{spec.name}: {text}", module=spec.name, tensor=tensor,
                        file=ck.tensor_file.get(tensor), fix=_REDOWNLOAD)
    for name, shape in plain_params(cfg).items():
        info = ck.backbone.get(name)
        if info is None:
            yield error("tensor-missing", f"{name} is missing", tensor=name, fix=_REDOWNLOAD)
            continue
        accounted.add(name)
        if is_cast(info, (dtype,), (shape,)):
            casts.setdefault((info.dtype, dtype), []).append(name)
        elif info.shape != shape or info.dtype != dtype:
            yield error("tensor-shape", f"{name} is {info.dtype}{list(info.shape)}, config implies {dtype}{list(shape)}",
                        tensor=name, file=ck.tensor_file.get(name), fix=_REDOWNLOAD)
    for name, kv in kv_cache_params(cfg).items():
        info = ck.backbone.get(name)
        if info is None:  # vLLM then serves the FP8 cache with scale 1.0 (it warns): not a load failure
            yield warning("tensor-missing", f"{name} is missing: the config has a kv_cache_scheme, and vLLM uses a "
                          "KV-cache scale of 1.0 where the checkpoint has none", tensor=name,
                          fix="re-run the export with the kv_cache_scheme's calibration, or drop kv_cache_scheme")
            continue
        accounted.add(name)
        if info.dtype not in kv.dtypes or tuple(info.shape) not in kv.shapes:
            yield error("tensor-shape", f"{name} is {info.dtype}{list(info.shape)}, expected "
                        f"{'/'.join(kv.dtypes)} {' or '.join(str(list(sh)) for sh in kv.shapes)} (one scale per "
                        "tensor: vLLM's per-tensor KV-cache scale)",
                        tensor=name, file=ck.tensor_file.get(name), fix=_REDOWNLOAD)
    loose = [n for n in unscheduled_kv_scales(cfg) if n in ck.backbone]
    accounted.update(loose)
    if loose:  # loaded (vLLM's KV-cache method is on every Attention), then unused with an unquantized cache
        yield warning("tensor-unexpected", f"{len(loose)} KV-cache scale(s) ({loose[0]}, ...) without a "
                      "kv_cache_scheme in the config: vLLM loads them (compressed-tensors gives every Attention "
                      "its KV-cache method whatever kv_cache_scheme says) and, with an unquantized KV cache, "
                      "serves with scale 1.0 instead; with --kv-cache-dtype fp8 it uses them",
                      tensor=loose[0], file=ck.tensor_file.get(loose[0]),
                      fix="add the kv_cache_scheme they were calibrated with to quantization_config, or drop them")
    vocab_hidden = table_shape(cfg)
    for table in ck.tables:
        info = ck.backbone.get(table)
        if info is None:
            continue
        accounted.add(table)
        if ck.layout in (Layout.LAYOUT_2, Layout.LAYOUT_2_UNMARKED):
            continue  # reported as tables-duplicated by the layout check
        if is_cast(info, (dtype,), (vocab_hidden,)):
            casts.setdefault((info.dtype, dtype), []).append(table)
        elif info.dtype != dtype or info.shape != vocab_hidden:
            yield error("table-shape", f"{table} is {info.dtype}{list(info.shape)}, expected {dtype}{list(vocab_hidden)}",
                        tensor=table, file=ck.tensor_file.get(table), fix=_REDOWNLOAD)
    yield from _cast_finding(casts, dtype, config_fix_holds, dtype_key(ck.config) if isinstance(ck.config, dict) else
                             "torch_dtype")
    for name in sorted(set(ck.backbone) - accounted):
        yield error("tensor-unexpected", f"{name} is not part of a {cfg.architecture} with this config",
                    tensor=name, file=ck.tensor_file.get(name),
                    fix="check that config.json belongs to these weights; re-download both from one revision")
