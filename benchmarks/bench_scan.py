"""scan of a Hugging Face cache (50 full-size Clef revisions + 200 unrelated repos) vs `hf cache ls --revisions`.

Usage: .venv/bin/python benchmarks/bench_scan.py [--runs 5] [--repos 10] [--revisions 5] [--unrelated 200]

Builds the cache in huggingface_hub's layout in a temp dir: one full-size (9B names and shapes, real
headers, sparse data) layout-2 Hybrid checkpoint, whose files become blobs named by their sha256 (hard
links, so every repo holds them without copying 8 GB); ``--repos`` x ``--revisions`` snapshots, each
revision with its own head config (marker kept, dropped, invalid: the states a scan tells apart) and
each a full set of symlinks, so every revision's headers are read and checked; ``--unrelated`` model
repos without a Clef head. Then times whole processes, interleaved, warm disk: huggingface_hub's own
listing (`hf cache ls --revisions`, which judges nothing) and `clef-format scan --json` (which verifies
every Clef revision). The goal (issue 27): scan under 2 s on the 2-core machine.
"""

from __future__ import annotations

import argparse
import compileall
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def sha256_sparse(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(16 << 20):
            h.update(chunk)
    return h.hexdigest()


def build_cache(cache: Path, src: Path, repos: int, revisions: int, unrelated: int) -> int:
    from tests.support.hub_cache import fake_commit
    from clef_format.spec.layouts import HEAD_CONFIG, MARKER_KEY

    files = sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file())
    etags = {rel: sha256_sparse(src / rel) for rel in files}
    head = json.loads((src / HEAD_CONFIG).read_text())
    variants = [dict(head), {k: v for k, v in head.items() if k != MARKER_KEY}, {**head, MARKER_KEY: "at least 0.2"}]
    n = 0
    for r in range(repos):
        repo = cache / f"models--clef-org--clef-build-{r}"
        (repo / "blobs").mkdir(parents=True)
        (repo / "refs").mkdir()
        for rel, etag in etags.items():
            os.link(src / rel, repo / "blobs" / etag)
        for v in range(revisions):
            commit = fake_commit(f"{r}/{v}")
            snap = repo / "snapshots" / commit
            hcfg = json.dumps(variants[v % len(variants)]).encode()
            head_etag = hashlib.sha1(b"blob %d\0" % len(hcfg) + hcfg).hexdigest()
            (repo / "blobs" / head_etag).write_bytes(hcfg)
            for rel, etag in etags.items():
                link = snap / rel
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(os.path.relpath(repo / "blobs" / (head_etag if rel == HEAD_CONFIG else etag), link.parent))
            if v == revisions - 1:
                (repo / "refs" / "main").write_text(commit)
            n += 1
    for u in range(unrelated):
        repo = cache / f"models--someone--unrelated-{u}"
        commit = fake_commit(f"u{u}")
        snap = repo / "snapshots" / commit
        snap.mkdir(parents=True)
        (repo / "blobs").mkdir()
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(commit)
        for name, data in (("config.json", b'{"model_type": "bert"}'),
                           ("model.safetensors", b"\x02\x00\x00\x00\x00\x00\x00\x00{}"),
                           ("tokenizer.json", b"{}"), ("README.md", b"# unrelated %d" % u)):
            etag = hashlib.sha1(data + name.encode()).hexdigest()
            (repo / "blobs" / etag).write_bytes(data)
            (snap / name).symlink_to(f"../../blobs/{etag}")
    return n


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--repos", type=int, default=10)
    ap.add_argument("--revisions", type=int, default=5)
    ap.add_argument("--unrelated", type=int, default=200)
    args = ap.parse_args()
    from clef_format.fixtures.builders import build_checkpoint

    compileall.compile_dir(str(ROOT / "clef_format"), quiet=1)
    bindir = os.path.dirname(sys.executable)
    with tempfile.TemporaryDirectory() as tmp:
        src = build_checkpoint(Path(tmp) / "src", layout="layout-2", build="hybrid", full_size=True)
        cache = Path(tmp) / "hub"
        n = build_cache(cache, src, args.repos, args.revisions, args.unrelated)
        env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
        out = subprocess.run([os.path.join(bindir, "clef-format"), "scan", "--json"], capture_output=True, text=True, env=env)
        totals = json.loads(out.stdout)["totals"]
        assert totals["copies"] == n, totals
        cmds = {
            "hf cache ls --revisions": [os.path.join(bindir, "hf"), "cache", "ls", "--revisions"],
            "clef-format scan --json": [os.path.join(bindir, "clef-format"), "scan", "--json"],
            "clef-format scan --json --jobs 1": [os.path.join(bindir, "clef-format"), "scan", "--json", "--jobs", "1"],
        }
        times: dict[str, list[float]] = {k: [] for k in cmds}
        for _ in range(args.runs):
            for name, cmd in cmds.items():
                times[name].append(timed(cmd, env))
        print(f"cache: {n} Clef revisions in {args.repos} repos (full-size headers, {len(list(src.rglob('*')))} entries each) "
              f"+ {args.unrelated} unrelated repos; {args.runs} runs, interleaved; os.cpu_count() = {os.cpu_count()}, "
              f"load {os.getloadavg()[0]:.2f}")
        print(f"scan totals: {totals}")
        ref = statistics.median(times["hf cache ls --revisions"])
        print("| command | median s | ratio to `hf cache ls --revisions` |")
        print("|---|---|---|")
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"| `{name}` | {med:.2f} | {med / ref:.2f}x |")


if __name__ == "__main__":
    main()
