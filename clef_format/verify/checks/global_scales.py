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
    from typing import Iterator

from clef_format.read.checkpoint import Checkpoint
from clef_format.read.safetensors import read_scalars
from clef_format.spec.findings import Finding, warning
from clef_format.vllm_rules import names as vllm_names

#: The per-tensor scales vLLM reduces to one per fused layer (the input one: W4A4 only).
SCALES = ("weight_global_scale", "input_global_scale")


def _scalars(ck: Checkpoint, names: list[str]) -> dict[str, float]:
    """The values of these one-element tensors, one open per file."""
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


def check_global_scales(ck: Checkpoint) -> Iterator[Finding]:
    if ck.model is None or not ck.backbone:
        return
    model = vllm_names.build(ck.model, ck.vllm_version or vllm_names.DEFAULT_VLLM)
    fused = [(layer, scale) for layer in model.layers if len(layer.shards) > 1 for scale in SCALES
             if all(f"{s.name}.{scale}" in ck.backbone for s in layer.shards)]
    if not fused:
        return
    values = _scalars(ck, [f"{s.name}.{scale}" for layer, scale in fused for s in layer.shards])
    found: dict[tuple[str | None, str], list[tuple[str, list[tuple[str, float]]]]] = {}
    for layer, scale in fused:
        got = [(s.name, values.get(f"{s.name}.{scale}")) for s in layer.shards]
        vals = [v for _, v in got if v is not None]
        if len(vals) < len(got) or len(set(vals)) < 2 or not max(vals) > 0:
            continue
        found.setdefault((layer.fused, scale), []).append((layer.name, [(n, float(v or 0)) for n, v in got]))
    for (_, scale), hits in found.items():
        yield _finding(ck, scale, hits)


def _ratio(got: list[tuple[str, float]]) -> float:
    vals = [v for _, v in got]
    return min(vals) / max(vals)


def _finding(ck: Checkpoint, scale: str, hits: list[tuple[str, list[tuple[str, float]]]]) -> Finding:
    """One warning per fused kind and scale: the layers folded, the worst one spelled out."""
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
    return warning(
        "global-scale-mismatch",
        f"{head}; vLLM fuses them into one layer "
        f"with one scale, keeps the largest and logs \"the {scale.split('_')[0]} global scale is different for "
        f"parallel layers ... reduced accuracy\": {effect}",
        module=name, tensor=tensor, file=ck.tensor_file.get(tensor),
        fix=f"re-quantize with one global scale shared by {' and '.join(n.rsplit('.', 1)[-1] for n, _ in got)} "
            "(the smaller of theirs, computed from their joint maximum; llm-compressor 0.14 shares it only for "
            "q/k/v and gate/up, not for Qwen3.5's in_proj_qkv and in_proj_z); rewriting the stored scales "
            "instead is not lossless (docs/MIGRATION.md)")
