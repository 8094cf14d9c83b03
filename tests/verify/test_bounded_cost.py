"""Hostile input costs a bounded report (docs/SECURITY.md): findings capped per class with a count of
the rest, headers and indexes with too many entries refused before they are parsed, and folders nested
deeper than the reader descends reported as ``tree-too-deep``, never a ``RecursionError``. Real files
throughout: a folder tree deeper than Python's recursion limit, real safetensors headers and indexes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from clef_format.errors import IncompatibleError
from clef_format.read import safetensors as ST
from clef_format.read.checkpoint import MAX_INDEX_ENTRIES, read_checkpoint
from clef_format.read.walk import MAX_DEPTH
from clef_format.report import MAX_FINDINGS_PER_CLASS, cap_findings, make_report
from clef_format.spec import layouts as L
from clef_format.spec.findings import error, warning
from clef_format.vllm.gate import check_checkpoint

CLI = [sys.executable, "-m", "clef_format"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True)


def _nest(root: Path, depth: int, first: str = "deep") -> Path:
    """``root/deep/d/d/...`` ``depth`` folders deep (os.makedirs and shutil.rmtree recurse: not used)."""
    d = root / first
    for _ in range(depth):
        os.mkdir(d)
        d = d / "d"
    return d.parent


def _unnest(bottom: Path, root: Path) -> None:
    """Remove what ``_nest`` made, bottom up, so that pytest's recursive cleanup never meets it."""
    d = bottom
    while d != root:
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
        d = d.parent


@pytest.fixture
def deep_checkpoint(fresh):
    root = fresh()
    bottom = _nest(root, sys.getrecursionlimit() + 50)
    (bottom / "model.bin").write_bytes(b"a pickle the reader never reaches")
    yield root
    _unnest(bottom, root)


def test_a_folder_nested_past_the_recursion_limit_is_a_finding_for_verify(deep_checkpoint) -> None:
    proc = _cli("verify", str(deep_checkpoint), "--json")
    assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 1
    payload = json.loads(proc.stdout)
    deep = [f for f in payload["findings"] if f["code"] == "tree-too-deep"]
    assert len(deep) == 1 and deep[0]["severity"] == "error" and deep[0]["fix"]
    assert deep[0]["file"] == "/".join(["deep"] + ["d"] * MAX_DEPTH)  # the first folder not listed
    assert payload["files"]  # the rest of the checkpoint was read
    text = _cli("verify", str(deep_checkpoint))
    assert text.returncode == 1 and "tree-too-deep" in text.stdout and "Traceback" not in text.stderr


def test_a_folder_nested_past_the_recursion_limit_stops_the_gate_with_a_finding(deep_checkpoint) -> None:
    with pytest.raises(IncompatibleError) as exc:
        check_checkpoint(str(deep_checkpoint), "0.2.1")
    assert exc.value.code == "tree-too-deep"


def test_a_folder_at_the_depth_limit_is_read_whole(fresh) -> None:
    root = fresh()
    bottom = _nest(root, MAX_DEPTH)
    (bottom / "x.pt").write_bytes(b"pickle")
    try:
        codes = [f.code for f in read_checkpoint(root).findings]
        assert "tree-too-deep" not in codes and "unsafe-file" in codes  # the deepest file was seen
    finally:
        _unnest(bottom, root)


def _scalars_header(n: int) -> bytes:
    raw, size = ST.encode_header([(f"t.{i}", "F32", (1,)) for i in range(n)], {"format": "pt"})
    return raw + b"\0" * size


def test_a_header_with_more_tensors_than_the_limit_is_refused_before_parsing(fresh) -> None:
    root = fresh()
    (root / L.BACKBONE_SINGLE).write_bytes(_scalars_header(ST.MAX_TENSORS + 1))
    proc = _cli("verify", str(root), "--json")
    assert proc.returncode == 1, proc.stderr[-2000:]
    bad = [f for f in json.loads(proc.stdout)["findings"] if f["code"] == "bad-header"]
    assert len(bad) == 1 and f"over the limit of {ST.MAX_TENSORS} tensors per file" in bad[0]["message"]


def test_the_tensor_limit_counts_entries_not_bytes(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(ST, "MAX_TENSORS", 10)
    at = tmp_path / "at.safetensors"
    at.write_bytes(_scalars_header(10))  # with __metadata__: the limit is on tensors
    assert len(ST.read_header(at).tensors) == 10
    over = tmp_path / "over.safetensors"
    over.write_bytes(_scalars_header(11))
    with pytest.raises(ST.HeaderError) as exc:
        ST.read_header(over)
    assert exc.value.reason == "too-many-tensors"


def test_an_index_with_more_entries_than_the_limit_is_refused_before_parsing(fresh) -> None:
    root = fresh(shards=2)
    index = json.loads((root / L.BACKBONE_INDEX).read_text())
    shard = next(iter(index["weight_map"].values()))
    index["weight_map"].update({f"m.{i}.weight": shard for i in range(MAX_INDEX_ENTRIES + 1)})
    (root / L.BACKBONE_INDEX).write_text(json.dumps(index))
    ck = read_checkpoint(root)
    bad = [f for f in ck.findings if f.code == "bad-config" and f.file == L.BACKBONE_INDEX]
    assert len(bad) == 1 and f"over the limit of {MAX_INDEX_ENTRIES}" in bad[0].message
    assert ck.layout_unread == L.BACKBONE_INDEX  # nothing is said about a backbone whose index was not read
    assert not [f for f in ck.findings if f.code == "index-mismatch"]


def test_findings_of_one_class_are_capped_with_a_count_of_the_rest_in_text_and_json(fresh) -> None:
    root = fresh()
    path = root / L.BACKBONE_SINGLE
    tensors = load_file(path)
    extra = 3 * MAX_FINDINGS_PER_CLASS
    tensors.update({f"model.language_model.layers.0.mlp.stray_{i}.weight": torch.zeros(2, 2, dtype=torch.bfloat16)
                    for i in range(extra)})
    save_file(tensors, path, metadata={"format": "pt"})
    proc = _cli("verify", str(root), "--json")
    assert proc.returncode == 1
    payload = json.loads(proc.stdout)
    stray = [f for f in payload["findings"] if f["code"] == "tensor-unexpected" and f["severity"] == "error"]
    more = extra - MAX_FINDINGS_PER_CLASS
    assert len(stray) == MAX_FINDINGS_PER_CLASS + 1
    assert stray[-1]["message"].startswith(f"... and {more} more tensor-unexpected errors")
    assert payload["capped"] == {"tensor-unexpected/error": more}
    text = _cli("verify", str(root))
    assert text.returncode == 1 and f"... and {more} more tensor-unexpected errors" in text.stdout


def test_capping_keeps_order_and_is_stable() -> None:
    n = MAX_FINDINGS_PER_CLASS
    many = [error("tensor-unexpected", f"t{i}") for i in range(n + 5)]
    edge = [warning("index-mismatch", f"w{i}") for i in range(n + 1)]
    kept, capped = cap_findings([*many, *edge])
    assert [f.message for f in kept[:n]] == [f"t{i}" for i in range(n)]
    assert [f.message for f in kept if f.code == "index-mismatch"] == [f"w{i}" for i in range(n + 1)]  # one over: whole
    assert capped == {"tensor-unexpected/error": 5} and kept[-1].severity == "error"
    report = make_report("verify", "x", None, kept, capped=capped)
    again = make_report("verify", "x", None, report.findings, report.details, report.capped)
    assert again.findings == report.findings and again.capped == capped and again.to_dict()["capped"] == capped


def test_a_deep_tree_in_the_local_dir_download_cache_is_no_traceback(fresh) -> None:
    """``.cache/`` is skipped by the tree walk but searched for unfinished downloads: walked the same way."""
    root = fresh()
    cache = root / ".cache" / "huggingface" / "download"
    cache.parent.mkdir(parents=True)
    bottom = _nest(cache.parent, sys.getrecursionlimit() + 50, first=cache.name)
    (cache / "model.safetensors.incomplete").write_bytes(b"")
    try:
        proc = _cli("verify", str(root), "--json")
        assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
        codes = [f["code"] for f in json.loads(proc.stdout)["findings"]]
        assert codes == ["partial-download"]  # the unfinished file at the top is still found
    finally:
        _unnest(bottom, root)
