"""Is a repair of fused NVFP4 shards with different global scales sound? Weight error of each way out.

Usage:
    .venv/bin/python benchmarks/bench_shared_global_scale.py [CHECKPOINT ...] [--synthetic]

vLLM fuses in_proj_qkv / in_proj_z (and q/k/v, gate/up) into one layer with one NVFP4 global scale, the
largest of the shards' (``CompressedTensorsW4A4Fp4.process_weights_after_loading``); compressed-tensors
stores the global scale as a divisor (decoded weight = e2m1 * e4m3_group_scale / global_scale), so a shard
with a smaller global scale is decoded scaled by g_shard / g_max. Ways out, each measured by the relative
Frobenius error ``|W_decoded - W_ref| / |W_ref|`` of the shard whose scales change:

* ``as_stored``: decoded with its own global scale (what the producer meant; 0 against itself);
* ``vllm``: decoded with the largest global scale, as vLLM serves it today;
* ``rescale_up``: shared scale g_max, the smaller shard's FP8 group scales multiplied by g_max / g_shard
  and re-rounded to E4M3 (clamped at 448): the fp4 codes stay;
* ``rescale_down``: shared scale g_min, the larger shard's FP8 group scales multiplied by g_min / g_shard
  and re-rounded to E4M3 (never above 448): the fp4 codes stay;
* ``requant``: the shard decoded with its own scale, then quantized again under the shared g_min (new
  group scales and new fp4 codes; no original weights needed);
* ``requant_original`` (synthetic only): the producer-side fix, the original weights quantized once with
  the shared global scale.

On a real checkpoint the reference is the shard decoded with its own global scale (``as_stored``); on the
synthetic weights, the original float weights (and ``as_stored`` is then the NVFP4 error itself).
numpy only; the E4M3 and E2M1 roundings follow compressed-tensors' (round to nearest even).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clef_format.fixtures.tensors import f32_to_fp8_e4m3, load_file  # noqa: E402

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
FP4_MAX, FP8_MAX, GROUP = 6.0, 448.0, 16


def e4m3_values(bits: np.ndarray) -> np.ndarray:
    """float8_e4m3fn bit patterns -> float32."""
    b = bits.astype(np.int32)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = b & 0x7
    val = np.where(exp == 0, np.ldexp(man / 8.0, -6), np.ldexp(1.0 + man / 8.0, exp - 7))
    return (sign * val).astype(np.float32)


def round_e4m3(x: np.ndarray) -> np.ndarray:
    return e4m3_values(f32_to_fp8_e4m3(np.minimum(np.asarray(x, np.float32), FP8_MAX)))


def round_e2m1(x: np.ndarray) -> np.ndarray:
    """Nearest E2M1 value (ties to the even code), clamped at 6."""
    a = np.minimum(np.abs(x), FP4_MAX)
    idx = np.abs(a[..., None] - E2M1).argmin(axis=-1)
    return np.sign(x) * E2M1[idx]


def unpack(packed: np.ndarray) -> np.ndarray:
    """compressed-tensors' ``pack_fp4_to_uint8``: two codes per byte, the even column in the low nibble."""
    lo, hi = packed & 0x0F, packed >> 4
    codes = np.stack([lo, hi], axis=-1).reshape(packed.shape[0], -1)
    return np.where(codes & 0x8, -1.0, 1.0).astype(np.float32) * E2M1[codes & 0x7]


def quantize(w: np.ndarray, g: float) -> tuple[np.ndarray, np.ndarray]:
    """(e2m1 values, e4m3 group scales) of ``w`` under global scale ``g`` (compressed-tensors' NVFP4)."""
    grp = w.reshape(w.shape[0], -1, GROUP)
    s = round_e4m3(np.abs(grp).max(axis=-1) / FP4_MAX * g)
    q = round_e2m1(grp / np.where(s == 0, 1, s / g)[..., None])
    return q.reshape(w.shape), s


def decode(q: np.ndarray, s: np.ndarray, g: float) -> np.ndarray:
    return (q.reshape(q.shape[0], -1, GROUP) * (s / g)[..., None]).reshape(q.shape)


def global_scale(w: np.ndarray) -> float:
    return float(np.float32(FP8_MAX * FP4_MAX / np.abs(w).max()))


def rel(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


def ways(q: np.ndarray, s: np.ndarray, g: float, g_other: float, ref: np.ndarray) -> dict[str, float]:
    """Errors of the shard (codes ``q``, group scales ``s``, global ``g``) fused with one of global ``g_other``."""
    g_max, g_min = max(g, g_other), min(g, g_other)
    own = decode(q, s, g)
    out = {"as_stored": rel(own, ref), "vllm": rel(decode(q, s, g_max), ref)}
    if g < g_max:  # this shard is the smaller one: rescale its scales up to g_max
        up = s * (g_max / g)
        out["rescale_up"] = rel(decode(q, round_e4m3(up), g_max), ref)
        out["clamped_groups"] = float((up > FP8_MAX).mean())
    else:
        out["rescale_up"] = out["as_stored"]
        out["clamped_groups"] = 0.0
    out["rescale_down"] = rel(decode(q, round_e4m3(s * (g_min / g)), g_min), ref) if g > g_min else out["as_stored"]
    rq, rs = quantize(own, g_min)
    out["requant"] = rel(decode(rq, rs, g_min), ref)
    return out


def real(path: Path) -> list[dict[str, float | str]]:
    t = load_file(path / "model.safetensors")
    rows = []
    names = sorted({n.rsplit(".", 2)[0] for n in t if n.endswith("linear_attn.in_proj_z.weight_global_scale")})
    for la in names:
        shards = {}
        for s in ("in_proj_qkv", "in_proj_z"):
            p = f"{la}.{s}"
            shards[s] = (unpack(t[f"{p}.weight_packed"].data), e4m3_values(t[f"{p}.weight_scale"].data),
                         float(t[f"{p}.weight_global_scale"].data.reshape(-1)[0]))
        (_, _, ga), (_, _, gb) = shards["in_proj_qkv"], shards["in_proj_z"]
        if ga == gb:
            continue
        for name, (q, s, g), other in (("in_proj_qkv", shards["in_proj_qkv"], gb), ("in_proj_z", shards["in_proj_z"], ga)):
            ref = decode(q, s, g)
            rows.append({"checkpoint": path.name, "shard": f"{la.split('.')[-2]}.{name}", "ratio": min(g, other) / max(g, other),
                         **ways(q, s, g, other, ref)})
    return rows


def synthetic(seed: int = 0) -> list[dict[str, float | str]]:
    """Shards shaped like the 9B's in_proj_qkv [8192, 4096] and in_proj_z [4096, 4096] rows (cut to 1024 rows),
    Student-t(5) weights with per-row spread, amax ratios like the real outputs (0.82-0.98)."""
    g = np.random.default_rng(seed)
    rows = []
    for ratio in (0.82, 0.90, 0.95, 0.98):
        w = {}
        for name in ("in_proj_qkv", "in_proj_z"):
            x = g.standard_t(5, (1024, 4096)).astype(np.float32) * np.float32(0.02)
            x *= np.exp(0.3 * g.standard_normal((1024, 1))).astype(np.float32)
            w[name] = x
        # make in_proj_z's amax larger by 1/ratio, so its global scale is smaller: ratio = g_z / g_qkv
        w["in_proj_z"] *= np.float32(np.abs(w["in_proj_qkv"]).max() / np.abs(w["in_proj_z"]).max() / ratio)
        gs = {n: global_scale(x) for n, x in w.items()}
        shared = min(gs.values())
        for name, x in w.items():
            other = gs["in_proj_z" if name == "in_proj_qkv" else "in_proj_qkv"]
            q, s = quantize(x, gs[name])
            r = ways(q, s, gs[name], other, x)
            oq, osc = quantize(x, shared)
            r["requant_original"] = rel(decode(oq, osc, shared), x)
            rows.append({"checkpoint": f"synthetic ratio {ratio}", "shard": name,
                         "ratio": min(gs[name], other) / max(gs[name], other), **r})
    return rows


def table(rows: list[dict[str, float | str]]) -> None:
    cols = ["as_stored", "vllm", "rescale_up", "clamped_groups", "rescale_down", "requant", "requant_original"]
    print("| checkpoint | shard | g ratio | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 3) + "|")
    for r in rows:
        vals = " | ".join(f"{r[c]:.4f}" if c in r else "" for c in cols)
        print(f"| {r['checkpoint']} | {r['shard']} | {r['ratio']:.3f} | {vals} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoints", nargs="*", type=Path)
    ap.add_argument("--synthetic", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [r for p in args.checkpoints for r in real(p)]
    if args.synthetic or not args.checkpoints:
        rows += synthetic()
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        table(rows)


if __name__ == "__main__":
    main()
