"""NVFP4 global scales of the shards vLLM fuses into one layer: they must be one value.

vLLM builds ``in_proj_qkvz`` (in_proj_qkv, in_proj_z), ``qkv_proj`` (q, k, v) and ``gate_up_proj``
(gate, up) as one layer with one NVFP4 global scale: ``CompressedTensorsW4A4Fp4.process_weights_after_loading``
(vLLM 0.28 and 0.33, W4A4 and the A16 variant alike) logs "the weight global scale is different for
parallel layers ... reduced accuracy" and keeps the largest one. A shard quantized with a smaller global
scale is then decoded scaled by its ratio to the largest (compressed-tensors stores the global scale as
a divisor). llm-compressor shares the scale only inside the fused groups it knows (q/k/v, gate/up), not
in Qwen3.5's in_proj_qkv / in_proj_z. The scalars are read at their header offsets (4 bytes each).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from clef_format.verify.vllm_build import VllmBuild
    from typing import Iterator

from clef_format.read.checkpoint import Checkpoint
from clef_format.verify.options import DEFAULTS, VerifyOptions
from clef_format.read.safetensors import read_scalars
from clef_format.spec.findings import Finding, error
from clef_format.vllm_rules import names as vllm_names

#: The per-tensor scales vLLM reduces to one per fused layer (the input one: W4A4 only).
SCALES = ("weight_global_scale", "input_global_scale")

#: One-element backbone scales judged on the structure path (the same rule as ``verify --deep``'s decode):
#: NVFP4 global scales (weights and activations are divided by them: must be > 0), per-tensor FP8 weight and
#: input scales and the KV-cache scales (multiplied in: finite and not negative).
SCALAR_SUFFIXES = (".weight_global_scale", ".input_global_scale", ".weight_scale", ".input_scale",
                   ".k_scale", ".v_scale", ".q_scale")


def _scale_fault(name: str, value: float) -> tuple[str, str] | None:
    """(code, what is wrong) for a bad one-element scale, else None: finite first, then the sign."""
    if value != value or value in (float("inf"), float("-inf")):
        return "nonfinite-scale", f"is {value!r} (NaN or infinite)"
    if name.endswith("global_scale") and not value > 0:
        return "scale-range", f"must be positive (weights are divided by it), got {value!r}"
    if value < 0:
        return "scale-range", f"is negative ({value!r})"
    return None


def check_scalar_scales(ck: Checkpoint, opts: VerifyOptions = DEFAULTS, vllm: VllmBuild | None = None) -> Iterator[Finding]:
    """Every one-element backbone scale finite and of the right sign: an error from facts, vLLM's dequant
    divides (NVFP4 global scales) or multiplies (FP8, KV cache) by it and serves NaN, inf or sign-flipped
    values. A few bytes each, at their header offsets; ``verify --deep`` decodes the larger ones."""
    if not ck.backbone:
        return
    names = [n for n, info in ck.backbone.items() if n.endswith(SCALAR_SUFFIXES) and info.numel == 1]
    values = _scalars(ck, names)
    for name in names:
        if name not in values:
            continue
        fault = _scale_fault(name, values[name])
        if fault is not None:
            code, what = fault
            yield error(code, f"{name}: this scale {what}; vLLM's dequantization uses it as stored",
                        tensor=name, file=ck.tensor_file.get(name),
                        fix="re-download the backbone; if it was quantized locally, re-run the quantization")


#: The last checkpoint ``_scalars`` read, the names it was asked and the values it found: the global-scale
#: check asks for a subset of what the scalar check just read (one read of each scale per verify).
_LAST: list[tuple[Checkpoint, frozenset[str], dict[str, float]]] = []


def _scalars(ck: Checkpoint, names: list[str]) -> dict[str, float]:
    """The values of these one-element tensors, one open per file."""
    if _LAST and _LAST[0][0] is ck and _LAST[0][1].issuperset(names):
        values = _LAST[0][2]
        return {n: values[n] for n in names if n in values}
    out = _read_scalars(ck, names)
    _LAST[:] = [(ck, frozenset(names), out)]
    return out


def _read_scalars(ck: Checkpoint, names: list[str]) -> dict[str, float]:
    by_file: dict[str, list[str]] = {}
    for n in names:
        rel = ck.tensor_file.get(n)
        if rel is not None and rel in ck.headers:
            by_file.setdefault(rel, []).append(n)
    out: dict[str, float] = {}
    for rel, wanted in by_file.items():
        try:
            out.update(read_scalars(ck.path(rel), ck.headers[rel], wanted))
        except OSError:
            continue  # an unreadable file is reported by the reader's own findings
    return out


def check_global_scales(ck: Checkpoint, opts: VerifyOptions = DEFAULTS, vllm: VllmBuild | None = None) -> Iterator[Finding]:
    if ck.model is None or not ck.backbone:
        return
    model = vllm.model if vllm is not None else vllm_names.build(ck.model, opts.rules)
    fused = [(layer, scale) for layer in model.layers if len(layer.shards) > 1 for scale in SCALES
             if all(f"{s.name}.{scale}" in ck.backbone for s in layer.shards)]
    if not fused:
        return
    values = _scalars(ck, [f"{s.name}.{scale}" for layer, scale in fused for s in layer.shards])
    found: dict[tuple[str | None, str], list[tuple[str, list[tuple[str, float]]]]] = {}
    for layer, scale in fused:
        got = [(s.name, values.get(f"{s.name}.{scale}")) for s in layer.shards]
        vals = [v for _, v in got if v is not None]
        if len(vals) < len(got) or len(set(vals)) < 2 or any(_scale_fault(scale, v) for v in vals):
            continue  # a NaN, zero or negative scale is check_scalar_scales' finding, not a ratio
        found.setdefault((layer.fused, scale), []).append((layer.name, [(n, float(v or 0)) for n, v in got]))
    for (_, scale), hits in found.items():
        yield _finding(ck, scale, hits)


def _ratio(got: list[tuple[str, float]]) -> float:
    vals = [v for _, v in got]
    return min(vals) / max(vals)


def _finding(ck: Checkpoint, scale: str, hits: list[tuple[str, list[tuple[str, float]]]]) -> Finding:
    """One error per fused kind and scale: the layers folded, the worst one spelled out. An error from facts:
    vLLM's own log says the fused layer is served with reduced accuracy, and the release card states the
    opposite property (the shards share one global scale, as vLLM's fused GEMM requires)."""
    from clef_format.verify.checks.patterns import summarize

    name, got = min(hits, key=lambda h: _ratio(h[1]))
    top = max(v for _, v in got)
    parts = ", ".join(f"{n.rsplit('.', 1)[-1]} {v:g}" for n, v in got)
    low = [(n.rsplit(".", 1)[-1], v / top) for n, v in got if v < top]
    if scale == "weight_global_scale":
        effect = "; ".join(f"{n}'s weights are decoded scaled by {r:.3f}" for n, r in low)
    else:
        effect = (f"the shared input is quantized with the largest, the range of the smallest activations "
                  f"({', '.join(n for n, _ in low)} saw larger ones and are clipped to {_ratio(got):.3f} of it)")
    head = f"{name}: its shards have different NVFP4 {scale}s ({parts}; ratio {_ratio(got):.3f})"
    if len(hits) > 1:
        ratios = sorted(_ratio(g) for _, g in hits)
        head = (f"{summarize(h[0] for h in hits)}: their shards have different NVFP4 {scale}s (ratio {ratios[0]:.3f} "
                f"to {ratios[-1]:.3f}; the worst, {name}: {parts})")
    tensor = f"{got[0][0]}.{scale}"
    return error(
        "global-scale-mismatch",
        f"{head}; vLLM fuses them into one layer "
        f"with one scale, keeps the largest and logs \"the {scale.split('_')[0]} global scale is different for "
        f"parallel layers ... reduced accuracy\": {effect}",
        module=name, tensor=tensor, file=ck.tensor_file.get(tensor),
        fix=f"re-quantize with one global scale shared by {' and '.join(n.rsplit('.', 1)[-1] for n, _ in got)} "
            "(the smaller of theirs, computed from their joint maximum; llm-compressor 0.14 shares it only for "
            "q/k/v and gate/up, not for Qwen3.5's in_proj_qkv and in_proj_z); rewriting the stored scales "
            "instead is not lossless (docs/MIGRATION.md)")
