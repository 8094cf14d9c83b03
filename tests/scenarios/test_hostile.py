"""The hostile-input corpus through the real CLI, and our header reader against safetensors' own.

Every case must give its finding code and exit 1, with no traceback and bounded memory (checked
structurally with tracemalloc, never with timings). Safetensors-level cases must be accepted or
rejected exactly as ``safetensors.safe_open`` does, except where clef-format is deliberately
stricter (duplicate JSON keys, which serde silently resolves to the last one).
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clef_format.cli.main import main
from clef_format.read.safetensors import HeaderError, read_header
from tests.support.hostile_cases import (
    CASES,
    CASES_BY_NAME,
    NOTE_CASES,
    Case,
    fresh_copy,
    ours_accepts,
    pristine,
    safe_open_accepts,
)

#: Python heap a non-deep verify may use on any corpus case (the tiny checkpoint needs ~2 MB).
MEMORY_BOUND = 24 * 1024 * 1024


def _build(case: Case, tmp_path: Path) -> Path:
    root = fresh_copy(tmp_path / "ck")
    case.build(root)
    return root


def _verify(root: Path, deep: bool, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict, str]:
    capsys.readouterr()  # drop what building the case printed (e.g. `manifest`)
    rc = main(["verify", str(root), "--json"] + (["--deep"] if deep else []))
    out, err = capsys.readouterr()
    return rc, json.loads(out), err


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 40
    assert sum(1 for c in CASES if c.st_file) >= 20


def test_pristine_is_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = fresh_copy(tmp_path / "ck")
    rc, report, _ = _verify(root, False, capsys)
    assert rc == 0 and report["ok"], report["findings"]
    rc, report, _ = _verify(root, True, capsys)
    assert rc == 0, report["findings"]
    assert {f["code"] for f in report["findings"]} == {"manifest-missing"}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_gives_code_and_exit_1(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _build(case, tmp_path)
    if not case.deep:
        tracemalloc.start()
    try:
        rc, report, err = _verify(root, case.deep, capsys)
    finally:
        if not case.deep:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
    codes = [f["code"] for f in report["findings"]]
    assert rc == 1, codes
    assert report["ok"] is False
    assert case.code in codes, f"{case.name}: expected {case.code}, got {report['findings']}"
    assert all(f["severity"] in ("error", "warning", "info") for f in report["findings"])
    assert "Traceback" not in err
    if not case.deep:
        assert peak < MEMORY_BOUND, f"{case.name}: verify used {peak} bytes of Python heap"


SUBPROCESS_SAMPLE = ["header-claims-over-100mb-sparse-huge", "nested-json-bomb", "symlink-dev-zero", "fifo-config",
                     "pickle-bin-present", "config-huge-file", "index-path-traversal", "manifest-hash-mismatch"]


@pytest.mark.parametrize("name", SUBPROCESS_SAMPLE)
def test_case_through_the_console_script(name: str, tmp_path: Path) -> None:
    """The installed entry point, as a user runs it: exit 1, one JSON object, no traceback."""
    case = CASES_BY_NAME[name]
    root = _build(case, tmp_path)
    cmd = [sys.executable, "-m", "clef_format.cli", "verify", str(root), "--json"] + (["--deep"] if case.deep else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert case.code in {f["code"] for f in json.loads(proc.stdout)["findings"]}


def test_huge_claimed_header_is_never_read(tmp_path: Path) -> None:
    """A 300 MB sparse file claiming a 150 MB header: refused from the 8-byte prefix alone."""
    root = _build(CASES_BY_NAME["header-claims-over-100mb-sparse-huge"], tmp_path)
    path = root / "model.safetensors"
    st_ = path.stat()
    assert st_.st_size == 300 * 1024 * 1024 and st_.st_blocks * 512 < 1024 * 1024  # huge, and sparse
    tracemalloc.start()
    try:
        with pytest.raises(HeaderError) as exc:
            read_header(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert exc.value.reason == "header-too-large"
    assert peak < 64 * 1024, peak


def test_header_reader_reads_only_the_header(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Count the bytes read_header pulls from a real file: prefix + header, never the data buffer."""
    import builtins
    import io

    path = pristine() / "model.safetensors"
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    counted = {"bytes": 0}
    real_open = builtins.open

    class Counting(io.BufferedReader):
        def read(self, size: int = -1) -> bytes:  # type: ignore[override]
            data = super().read(size)
            counted["bytes"] += len(data)
            return data

    def counting_open(file, mode="r", *args, **kwargs):  # type: ignore[no-untyped-def]
        if mode == "rb" and os.fspath(file) == str(path):
            return Counting(io.FileIO(file, "rb"))
        return real_open(file, mode, *args, **kwargs)

    import clef_format.read.safetensors as sh

    monkeypatch.setattr(sh, "open", counting_open, raising=False)
    header = read_header(path)
    assert counted["bytes"] == 8 + n
    assert header.file_size > 8 + n


# ------------------------------------------------------------------ parity with safe_open

ST_CASES = [c for c in CASES if c.st_file]


@pytest.mark.parametrize("case", ST_CASES, ids=[c.name for c in ST_CASES])
def test_reader_matches_safe_open(case: Case, tmp_path: Path) -> None:
    root = _build(case, tmp_path)
    path = root / case.st_file  # type: ignore[operator]
    assert not ours_accepts(path)
    if case.parity:
        assert not safe_open_accepts(path)


def test_pristine_files_accepted_by_both() -> None:
    for rel in ("model.safetensors", "clef_head/joint_head.safetensors", "clef_head/tables_int8.safetensors"):
        assert ours_accepts(pristine() / rel) and safe_open_accepts(pristine() / rel)


@st.composite
def _small_valid(draw: st.DrawFn) -> bytes:
    """A small valid safetensors file written by safetensors itself."""
    import torch
    from safetensors.torch import save

    dtypes = [torch.float32, torch.bfloat16, torch.int8, torch.uint8, torch.float16, torch.int64]
    n = draw(st.integers(1, 4))
    tensors = {}
    for i in range(n):
        shape = tuple(draw(st.lists(st.integers(0, 4), min_size=0, max_size=3)))
        tensors[f"t{i}"] = torch.zeros(shape, dtype=draw(st.sampled_from(dtypes)))
    meta = draw(st.one_of(st.none(), st.just({"format": "pt"})))
    return save(tensors, metadata=meta)


def _json_value() -> st.SearchStrategy:
    leaf = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                     st.text(max_size=8), st.sampled_from(["F32", "BF16", "I8", "F8_E4M3", "U64", "X"]))
    return st.recursive(leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                        max_leaves=6)


@st.composite
def _corrupted(draw: st.DrawFn) -> bytes:
    raw = draw(_small_valid())
    (n,) = struct.unpack("<Q", raw[:8])
    kind = draw(st.sampled_from(["truncate", "flip", "length", "json-edit", "append", "header-bytes"]))
    if kind == "truncate":
        return raw[:draw(st.integers(0, len(raw) - 1))]
    if kind == "flip":
        i = draw(st.integers(0, len(raw) - 1))
        return raw[:i] + bytes([raw[i] ^ draw(st.integers(1, 255))]) + raw[i + 1:]
    if kind == "length":
        return struct.pack("<Q", draw(st.integers(0, 2**64 - 1))) + raw[8:]
    if kind == "append":
        return raw + draw(st.binary(min_size=1, max_size=16))
    if kind == "header-bytes":
        i = draw(st.integers(8, 8 + n - 1))
        new = raw[:i] + draw(st.binary(min_size=1, max_size=4)) + raw[i + 1:8 + n]
        return struct.pack("<Q", len(new) - 8) + new[8:] + raw[8 + n:]
    header = json.loads(raw[8:8 + n])
    names = [k for k in header if k != "__metadata__"]
    target = draw(st.sampled_from(names))
    field = draw(st.sampled_from(["dtype", "shape", "data_offsets", "__metadata__", "extra"]))
    value = draw(_json_value())
    if field == "__metadata__":
        header["__metadata__"] = value
    elif field == "extra":
        header[target]["extra"] = value
    else:
        header[target][field] = value
    hb = json.dumps(header).encode()
    hb += b" " * (-len(hb) % 8)
    return struct.pack("<Q", len(hb)) + hb + raw[8 + n:]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_corrupted())
def test_reader_matches_safe_open_on_generated_corruptions(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "x.safetensors"
        path.write_bytes(data)
        assert ours_accepts(path) == safe_open_accepts(path), data[:200]


@pytest.mark.parametrize("name", ["pytorch_model.bin", "clef_head/x.PT", "model.safetensors.incomplete"])
def test_a_fifo_is_special_file_whatever_its_name_in_every_command(name: str, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A FIFO named like a pickle (or an unfinished download) was reported as that (``unsafe-file``,
    ``partial-download``): the name was judged before the file type. Every command that walks the
    folder says what it is (a FIFO) and none opens it (that would block: the test would hang)."""
    root = fresh_copy(tmp_path / "ck")
    os.mkfifo(root / name)

    def findings(*argv: str) -> list[dict]:
        capsys.readouterr()
        rc = main([*argv, "--json"])
        out = json.loads(capsys.readouterr().out)
        assert rc == 1, out
        return out["findings"]

    for argv in (["verify", str(root)], ["verify", str(root), "--deep"], ["manifest", str(root)]):
        hits = [(f["code"], f["severity"]) for f in findings(*argv) if f.get("file") == name]
        assert hits == [("special-file", "error")], (argv, hits)
    rows = findings("scan", str(root))
    assert [f["code"] for f in rows] == ["copy-broken"] and "special-file" in rows[0]["message"], rows
    assert f"{name} is a FIFO" in rows[0]["message"], rows
    for to in ("layout-1", "layout-2"):
        refused = [f for f in findings("migrate", str(root), "--to", to, "--dry-run") if f["severity"] == "error"]
        assert refused[0]["code"] in ("special-file", "migrate-refused"), refused
        assert f"{name} is a FIFO" in refused[0]["message"], refused
        assert not {"unsafe-file", "partial-download"} & {f["code"] for f in refused}, refused
    assert not (root / "clef_manifest.json").exists()


@pytest.mark.parametrize("case", NOTE_CASES, ids=[c.name for c in NOTE_CASES])
def test_note_case_is_a_warning_with_exit_0(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _build(case, tmp_path)
    rc, report, _ = _verify(root, case.deep, capsys)
    found = [f for f in report["findings"] if f["code"] == case.code]
    assert rc == 0 and report["ok"] is True, report["findings"]
    assert found and {f["severity"] for f in found} == {"warning"}, report["findings"]
