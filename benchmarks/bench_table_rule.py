"""The complete table rule at start-up, on full-size tables, against ``sha256sum`` of the same file.

Usage: .venv/bin/python benchmarks/bench_table_rule.py [--runs 3] [--dir DIR]

Writes a real ``clef_head/tables_int8.safetensors`` of the 9B shapes (two ``I8 [248320, 4096]``
tables of random values in [-127, 127], their F32 scales, the format's metadata with the digests:
2.03 GB), then times, interleaved and warm (the file in the page cache, as right after a download
or a migrate), each as a whole step:

* ``rule only``: ``read.table_scan.scan_tables`` without digests (what the rule alone costs);
* ``rule + digests``: the same pass with the BLAKE3 digest of every tensor (what ``--deep`` and the
  gate run, ``verify.checks.startup.startup_findings``' tables part);
* ``sha256sum``: coreutils over the same file (what checking it against a Hub etag costs);
* ``json.loads(tokenizer.json)``: a real-size tokenizer file (248k-token vocab, 247k merges).

Prints medians and the ratio of each to ``sha256sum``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VOCAB, HIDDEN = 248320, 4096
TABLES = ("model.language_model.embed_tokens.weight", "lm_head.weight")


def write_tables(path: Path) -> None:
    """The file as migrate writes it, with random rows (every value and scale valid); without the
    blake3 package (a bare machine) the file has no digests and the digest step is skipped."""
    from clef_format.fixtures.tensors import Tensor, save_file
    from clef_format.spec import tables_format as TF

    g = np.random.default_rng(0)
    tensors = {}
    for name in TABLES:
        q = g.integers(-127, 128, size=(VOCAB, HIDDEN), dtype=np.int8)
        tensors[name] = Tensor("I8", q)
        tensors[TF.scale_name(name)] = Tensor("F32", g.uniform(1e-3, 1e-1, size=(VOCAB, 1)).astype(np.float32))
    try:
        import blake3
    except ImportError:
        digests = None
    else:
        digests = {n: "blake3:" + blake3.blake3(np.ascontiguousarray(t.data).reshape(-1).view(np.uint8),
                                                max_threads=blake3.blake3.AUTO).hexdigest() for n, t in tensors.items()}
    figures = {"rel_error": 0.0087, "mean_row_cosine": 0.99996, "min_row_cosine": 0.9999, "max_row_rel_error": 0.013}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, path, metadata=TF.metadata_for("BF16", {n: figures for n in TABLES}, digests))


def write_tokenizer(path: Path) -> None:
    """A tokenizer.json of Qwen's size: a BPE vocab of 248k entries and 247k merges (about 10 MB)."""
    g = np.random.default_rng(1)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyzĠĊ"))
    words = ["".join(g.choice(letters, size=int(n))) + str(i) for i, n in enumerate(g.integers(2, 10, VOCAB))]
    tok = {"version": "1.0", "truncation": None, "padding": None,
           "added_tokens": [{"id": VOCAB - 1 - i, "content": f"<|tok{i}|>", "special": True} for i in range(300)],
           "normalizer": {"type": "NFC"}, "pre_tokenizer": {"type": "ByteLevel"},
           "model": {"type": "BPE", "vocab": {w: i for i, w in enumerate(words)},
                     "merges": [[words[i][:1], words[i][1:]] for i in range(VOCAB - 1000)]}}
    path.write_text(json.dumps(tok, ensure_ascii=False))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write the 2 GB file (default: a temp dir)")
    args = ap.parse_args()
    from clef_format.read.safetensors import read_header
    from clef_format.read.table_scan import scan_tables

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "clef_head" / "tables_int8.safetensors"
        tok = Path(tmp) / "tokenizer.json"
        write_tables(path)
        write_tokenizer(tok)
        header = read_header(path)
        recorded = json.loads(header.metadata.get("digests", "null"))

        def rule() -> None:
            scan = scan_tables(str(path), header, TABLES)
            assert not any(scan.problems.values())

        def rule_digests() -> None:
            scan = scan_tables(str(path), header, TABLES, recorded)
            assert {n: f"blake3:{d}" for n, d in scan.digests.items()} == recorded

        def sha256sum() -> None:
            subprocess.run(["sha256sum", str(path)], check=True, stdout=subprocess.DEVNULL)

        def tokenizer() -> None:
            json.loads(tok.read_bytes())

        steps = {"sha256sum": sha256sum, "rule only": rule, "rule + digests": rule_digests,
                 "json.loads(tokenizer.json)": tokenizer}
        if recorded is None:
            del steps["rule + digests"]
        times: dict[str, list[float]] = {k: [] for k in steps}
        sha256sum()  # warm the page cache
        for _ in range(args.runs):
            for name, fn in steps.items():
                t = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t)
        ref = statistics.median(times["sha256sum"])
        print(f"tables file {os.path.getsize(path) / 1e9:.2f} GB, tokenizer.json {os.path.getsize(tok) / 1e6:.1f} MB, "
              f"{os.cpu_count()} CPU(s), load {os.getloadavg()[0]:.1f}")
        print("| step | median s | runs (s) | ratio to `sha256sum` |")
        print("|---|---|---|---|")
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"| {name} | {med:.3f} | {', '.join(f'{t:.3f}' for t in ts)} | {med / ref:.2f}x |")


if __name__ == "__main__":
    main()
