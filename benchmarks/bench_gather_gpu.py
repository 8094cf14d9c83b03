"""GPU benchmark: int8 dequantize-on-gather (``clef_format.int8_gather``) against BF16 ``embedding``.

On one table of ``--vocab x --hidden`` (default 248320 x 4096, the Clef vocabulary), times

* ``bf16``:  ``torch.nn.functional.embedding(ids, weight_bf16)`` (what serving does today),
* ``fused``: ``gather_rows(q, scale, ids, backend="triton")`` (one Triton kernel),
* ``torch``: ``gather_rows(q, scale, ids, backend="torch")`` (index_select + one mul-and-cast),

for prefill and decode embedding lookups and for lexical-row gathers of option spans. Each call is
captured in a CUDA graph and its replay timed with ``triton.testing.do_bench`` (CUDA events,
warm-up, the L2 cache flushed before every run, median of the runs), so the numbers are GPU time
without Python or launch overhead, as under vLLM's graphs; eager timings are reported beside them.
Every case is timed in ``--rounds`` interleaved rounds; the table gives the median over rounds
and the per-round spread of the fused/BF16 ratio. Ids are uniform over the vocabulary (hardly any
repeats, so no help from the cache for either side).

Each case also checks exactness: the fused output must equal the torch-path output bit for bit,
and both must equal ``embedding`` over the table dequantized to BF16 with ``dequantize_rows``.

``--sweep`` instead times the kernel's launch shapes for a set of id counts (how ``_TUNED`` in
``int8_gather.py`` was chosen).

    PYTHONPATH=. python3 benchmarks/bench_gather_gpu.py --out results.md
    PYTHONPATH=. python3 benchmarks/bench_gather_gpu.py --sweep --out sweep.md
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

from tests.support.torch_int8 import dequantize_rows, quantize_rows
from clef_format.vllm.int8_gather import KernelConfig, _gather_triton, default_config, gather_rows

# (case kind, number of ids, goal for fused/bf16)
PREFILL = [("prefill", 4096), ("prefill", 8192), ("prefill 64x300", 19200)]
DECODE = [("decode", 64), ("decode", 128), ("decode", 256)]
LEXICAL = [("lexical span", n) for n in (2, 8, 32, 128, 512)]
GOALS = {"prefill": 0.85, "decode": 1.05}
SWEEP_IDS = (2, 32, 64, 128, 256, 512, 4096, 8192, 19200)


@dataclass
class Tables:
    bf16: torch.Tensor
    q: torch.Tensor
    scale: torch.Tensor
    deq: torch.Tensor  # the int8 table decoded to bf16: the reference for exactness


def build_tables(vocab: int, hidden: int, device: torch.device, seed: int) -> Tables:
    """A random BF16 table shaped like Clef's embeddings, quantized the way migrate does it."""
    gen = torch.Generator(device=device).manual_seed(seed)
    bf16 = torch.empty(vocab, hidden, dtype=torch.bfloat16, device=device)
    q = torch.empty(vocab, hidden, dtype=torch.int8, device=device)
    scale = torch.empty(vocab, 1, dtype=torch.float32, device=device)
    step = 16384
    for lo in range(0, vocab, step):
        hi = min(vocab, lo + step)
        block = torch.randn(hi - lo, hidden, generator=gen, device=device) * 0.02
        # a few rows with a large outlier, as real embedding rows have
        block[:: 97, 0] *= 50
        bf16[lo:hi] = block.to(torch.bfloat16)
        q[lo:hi], scale[lo:hi] = quantize_rows(bf16[lo:hi])
    deq = torch.empty_like(bf16)
    for lo in range(0, vocab, step):
        deq[lo : lo + step] = dequantize_rows(q[lo : lo + step], scale[lo : lo + step], torch.bfloat16)
    return Tables(bf16, q, scale, deq)


def bench(fn: Callable[[], object], rep_ms: int) -> float:
    """Median milliseconds of ``fn`` by CUDA events, L2 flushed before each run (do_bench)."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median"))


def graphed(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` captured in a CUDA graph; returns its replay.

    Timing the replay measures the GPU work alone: an eager call's Python and launch overhead
    (larger for a Triton launch than for ``embedding``) is not in it, as it is not in vLLM, which
    replays CUDA graphs for decode batches. Eager times are reported beside it.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # compile and warm up outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph.replay


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.int16), b.view(torch.int16))


def run_cases(t: Tables, rounds: int, rep_ms: int, seed: int) -> list[dict]:
    gen = torch.Generator(device=t.q.device).manual_seed(seed + 1)
    vocab, hidden = t.q.shape
    rows = []
    for kind, n in PREFILL + DECODE + LEXICAL:
        ids = torch.randint(0, vocab, (n,), generator=gen, device=t.q.device)
        fns = {
            "bf16": lambda: torch.nn.functional.embedding(ids, t.bf16),
            "fused": lambda: gather_rows(t.q, t.scale, ids, torch.bfloat16, backend="triton"),
            "torch": lambda: gather_rows(t.q, t.scale, ids, torch.bfloat16, backend="torch"),
        }
        fused_out, torch_out = fns["fused"](), fns["torch"]()
        ref = torch.nn.functional.embedding(ids, t.deq)
        exact = same_bits(fused_out, torch_out) and same_bits(torch_out, ref)
        replays = {k: graphed(fn) for k, fn in fns.items()}
        times: dict[str, list[float]] = {k: [] for k in fns}
        eager: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(rounds):
            for name in fns:
                times[name].append(bench(replays[name], rep_ms))
                eager[name].append(bench(fns[name], rep_ms))
        med = {k: statistics.median(v) for k, v in times.items()}
        eager_med = {k: statistics.median(v) for k, v in eager.items()}
        fused_ratios = [f / b for f, b in zip(times["fused"], times["bf16"])]
        goal = GOALS.get(kind.split()[0])
        row = {
            "case": kind,
            "ids": n,
            "bf16_us": med["bf16"] * 1e3,
            "fused_us": med["fused"] * 1e3,
            "torch_us": med["torch"] * 1e3,
            "fused_ratio": med["fused"] / med["bf16"],
            "fused_ratio_min": min(fused_ratios),
            "fused_ratio_max": max(fused_ratios),
            "torch_ratio": med["torch"] / med["bf16"],
            "eager_fused_ratio": eager_med["fused"] / eager_med["bf16"],
            "eager_torch_ratio": eager_med["torch"] / eager_med["bf16"],
            "fused_gbps": n * hidden * 3 / (med["fused"] * 1e-3) / 1e9,
            "bf16_gbps": n * hidden * 4 / (med["bf16"] * 1e-3) / 1e9,
            "config": str(default_config(n, hidden)),
            "exact": exact,
            "goal": goal,
            "met": None if goal is None else med["fused"] / med["bf16"] <= goal,
            "raw_ms": times,
            "eager_raw_ms": eager,
        }
        rows.append(row)
        print(
            f"{kind:>16} {n:>6}: bf16 {row['bf16_us']:8.2f} us  fused {row['fused_us']:8.2f} us  "
            f"torch {row['torch_us']:8.2f} us  fused/bf16 {row['fused_ratio']:.3f} "
            f"[{row['fused_ratio_min']:.3f}..{row['fused_ratio_max']:.3f}]  "
            f"eager fused/bf16 {row['eager_fused_ratio']:.3f}  exact={exact}",
            flush=True,
        )
    return rows


def markdown(rows: list[dict]) -> str:
    head = (
        "| case | ids | BF16 embedding (us) | int8 fused (us) | int8 torch-ops (us) "
        "| **fused / BF16** | fused / BF16 per round | torch-ops / BF16 | eager: fused / BF16 "
        "| eager: torch-ops / BF16 | fused eff. GB/s | BF16 eff. GB/s | exact | goal | met |\n"
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---|---|\n"
    )
    lines = []
    for r in rows:
        goal = "-" if r["goal"] is None else f"<= {r['goal']:.2f}"
        met = "-" if r["met"] is None else ("yes" if r["met"] else "**no**")
        lines.append(
            f"| {r['case']} | {r['ids']} | {r['bf16_us']:.2f} | {r['fused_us']:.2f} | {r['torch_us']:.2f} "
            f"| **{r['fused_ratio']:.3f}** | {r['fused_ratio_min']:.3f}-{r['fused_ratio_max']:.3f} "
            f"| {r['torch_ratio']:.3f} | {r['eager_fused_ratio']:.3f} | {r['eager_torch_ratio']:.3f} "
            f"| {r['fused_gbps']:.0f} | {r['bf16_gbps']:.0f} "
            f"| {'yes' if r['exact'] else '**NO**'} | {goal} | {met} |"
        )
    return head + "\n".join(lines) + "\n"


def sweep(t: Tables, rep_ms: int, seed: int, all_results: dict) -> str:
    """Time every launch shape in a grid for a set of id counts; report the best few per count."""
    vocab, hidden = t.q.shape
    gen = torch.Generator(device=t.q.device).manual_seed(seed + 2)
    configs = [
        KernelConfig(bt, bh, nw)
        for bt, bh, nw in itertools.product((1, 2, 4, 8), (256, 512, 1024, 2048, 4096), (1, 2, 4, 8, 16))
        if 8 <= bt * bh // (32 * nw) <= 64 and bh <= hidden
    ]
    out = [f"{len(configs)} configs; times are CUDA-graph replays\n"]
    best: dict[int, list] = {}
    for n in SWEEP_IDS:
        ids = torch.randint(0, vocab, (n,), generator=gen, device=t.q.device)
        ref = torch.nn.functional.embedding(ids, t.deq)
        base = bench(graphed(lambda: torch.nn.functional.embedding(ids, t.bf16)), rep_ms)
        res = []
        for cfg in configs:
            def fn(cfg: KernelConfig = cfg) -> torch.Tensor:
                return _gather_triton(t.q, t.scale, ids, torch.bfloat16, 0, vocab, cfg)

            assert same_bits(fn(), ref), cfg
            res.append((bench(graphed(fn), rep_ms), cfg))
        all_results[n] = {"bf16_ms": base, "fused_ms": {str(c): ms for ms, c in res}}
        res.sort(key=lambda x: x[0])
        dflt = default_config(n, hidden)
        dflt_ms = next(ms for ms, c in res if c == dflt) if dflt in configs else float("nan")
        best[n] = res
        out.append(f"\n### {n} ids (BF16 embedding {base * 1e3:.2f} us; default {dflt} {dflt_ms * 1e3:.2f} us)\n")
        for ms, cfg in res[:8]:
            out.append(f"- {ms * 1e3:8.2f} us  ratio {ms / base:.3f}  {cfg}\n")
        out.append(f"- worst: {res[-1][0] * 1e3:.2f} us {res[-1][1]}\n")
        print("".join(out[-10:]), flush=True)
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds per case")
    ap.add_argument("--rep-ms", type=int, default=200, help="do_bench repetition budget per timing")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sweep", action="store_true", help="tune launch shapes instead of the benchmark")
    ap.add_argument("--out", help="also write the report (markdown) here")
    ap.add_argument("--json", help="also write raw numbers here")
    args = ap.parse_args(argv)

    if not torch.cuda.is_available():
        print("no CUDA device: this benchmark needs a GPU", file=sys.stderr)
        return 2
    import triton

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    started = time.time()
    t = build_tables(args.vocab, args.hidden, dev, args.seed)
    torch.cuda.synchronize()
    int8_bytes = t.q.numel() + t.scale.numel() * 4
    bf16_bytes = t.bf16.numel() * 2
    header = (
        f"device: {props.name} ({props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB), "
        f"torch {torch.__version__}, triton {triton.__version__}, CUDA {torch.version.cuda}\n"
        f"table: {args.vocab} x {args.hidden}; BF16 {bf16_bytes / 2**30:.3f} GiB, "
        f"int8 + scales {int8_bytes / 2**30:.3f} GiB ({int8_bytes / bf16_bytes:.3f}x)\n"
        f"timing: each call captured in a CUDA graph, its replay timed by triton.testing.do_bench "
        f"(CUDA events, warmup 25 ms, rep {args.rep_ms} ms, L2 flushed before every run, median); "
        f"{args.rounds} interleaved rounds, median over rounds. 'eager' columns: the same without the graph, "
        f"so they include Python and launch overhead wherever it is not hidden behind the GPU\n"
    )
    print(header, flush=True)
    if args.sweep:
        found: dict = {}
        report = header + "\n" + sweep(t, args.rep_ms, args.seed, found)
        rows = []
        if args.json:
            with open(args.json + ".sweep.json", "w") as fh:
                json.dump(found, fh, indent=1)
    else:
        rows = run_cases(t, args.rounds, args.rep_ms, args.seed)
        report = header + "\n" + markdown(rows)
        misses = [r for r in rows if r["met"] is False]
        inexact = [r for r in rows if not r["exact"]]
        report += (
            f"\nexact (fused == torch-ops == embedding over dequantized table, bitwise): "
            f"{'all cases' if not inexact else 'FAILED in ' + str(len(inexact)) + ' case(s)'}\n"
            f"goal misses: {', '.join(str(r['case']) + ' ' + str(r['ids']) for r in misses) or 'none'}\n"
        )
    report += f"\n(wall time {time.time() - started:.0f} s)\n"
    print(report, flush=True)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(report)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1, default=str)
    return 0 if all(r["exact"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
