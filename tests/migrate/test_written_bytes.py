"""Every safetensors file clef-format writes, byte for byte against safetensors' own ``save_file``.

The files: what ``clef-format example`` writes (the fixture writer), and what ``migrate`` writes both
ways (layout-1 -> layout-2: the backbone without its tables and ``tables_int8.safetensors``; layout-2
-> layout-1: the backbone with the tables decoded back). Each is re-saved by ``safetensors.torch.save_file``
with the same tensors and metadata; the two files must be byte-equal, or differ only for a reason
stated in ``REASONS`` and checked there. Whatever the reason, every file keeps the format's invariants
safetensors' writer keeps: an 8-byte little-endian length, compact JSON padded with spaces to a
multiple of 8 (so every tensor stays aligned), data offsets contiguous from 0 in header order, the
same metadata, the same bytes per tensor.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from clef_format.read.safetensors import DTYPE_BITS  # noqa: E402
from clef_format.spec import layouts as L  # noqa: E402

# Why a written file may differ from save_file's, and what is checked instead. safetensors' writer
# sorts tensors by alignment (widest dtype first), then name, and writes metadata from a Rust HashMap
# (its key order is not even stable between runs of save_file itself).
REASONS = {
    L.TABLES: "the int8 tables come first and their scales after, in the tables format's order; the header "
              "reserves room (METADATA_RESERVE) for the quality figures, written once the data is",
    "model.safetensors@layout-1": "migrate keeps the source file's tensor order (unchanged tensors are copied as "
                                  "they are) and inserts the decoded tables where every tensor stays aligned",
}


def _split(raw: bytes) -> tuple[int, bytes, bytes]:
    (n,) = struct.unpack("<Q", raw[:8])
    return n, raw[8:8 + n], raw[8 + n:]


def _invariants(path: Path) -> list[str]:
    """The format's invariants as safetensors' writer keeps them; returns the tensor order."""
    n, header, data = _split(path.read_bytes())
    assert n % 8 == 0, f"{path}: header of {n} bytes is not padded to a multiple of 8"
    text = header.rstrip(b" ")
    assert set(header[len(text):]) <= {0x20}, "padding is spaces only"
    obj = json.loads(text)
    assert text == json.dumps(obj, separators=(",", ":")).encode(), "compact JSON, as the Rust writer's"
    offset = 0
    names = [k for k in obj if k != "__metadata__"]
    for name in names:
        entry = obj[name]
        begin, end = entry["data_offsets"]
        assert begin == offset, (path, name, "offsets must be contiguous in header order")
        n_el = 1
        for d in entry["shape"]:
            n_el *= d
        assert end - begin == n_el * DTYPE_BITS[entry["dtype"]] // 8
        offset = end
    assert offset == len(data), "no bytes after the last tensor"
    return names


def _against_save_file(path: Path, tmp: Path, reason_key: str) -> None:
    names = _invariants(path)
    with safe_open(str(path), "pt") as fh:
        metadata = fh.metadata()
    tensors = load_file(str(path))
    ref = tmp / "ref.safetensors"
    save_file(tensors, str(ref), metadata=metadata)
    ours, theirs = path.read_bytes(), ref.read_bytes()
    if reason_key not in REASONS:
        assert ours == theirs, f"{reason_key}: not byte-equal to safetensors' save_file and no reason is stated"
        return
    assert ours != theirs, f"{reason_key}: byte-equal now: drop its entry in REASONS"
    _, h_ours, d_ours = _split(ours)
    _, h_ref, d_ref = _split(theirs)
    a, b = json.loads(h_ours), json.loads(h_ref)
    assert a.get("__metadata__") == b.get("__metadata__")  # the same metadata, as a map
    assert {k: (v["dtype"], v["shape"]) for k, v in a.items() if k != "__metadata__"} == \
        {k: (v["dtype"], v["shape"]) for k, v in b.items() if k != "__metadata__"}
    for name in names:  # the same bytes per tensor, wherever each file keeps them
        (x0, x1), (y0, y1) = a[name]["data_offsets"], b[name]["data_offsets"]
        assert d_ours[x0:x1] == d_ref[y0:y1], name
    if reason_key == L.TABLES:
        from clef_format.migrate.plan import METADATA_RESERVE
        from clef_format.spec import tables_format as TF

        assert [a[n]["dtype"] for n in names] == ["I8"] * 2 + ["F32"] * 2
        assert names[2:] == [TF.scale_name(n) for n in names[:2]]
        reserved = len(a["__metadata__"]["quality"]) + len(a["__metadata__"].get("digests", ""))  # share the room
        assert len(h_ours) - len(h_ours.rstrip(b" ")) >= METADATA_RESERVE - reserved - 64
    else:  # the backbone's own order (save_file's, from the example), the tables inserted before the narrower
        widths = [DTYPE_BITS[a[n]["dtype"]] for n in names]
        assert widths == sorted(widths, reverse=True), "every tensor stays aligned"


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Relative name (with the layout where it differs) -> a file clef-format wrote."""
    base = tmp_path_factory.mktemp("written")
    cli = [sys.executable, "-m", "clef_format"]
    out: dict[str, Path] = {}
    subprocess.run([*cli, "example", str(base / "example"), "--layout", "layout-1", "--no-verify"], check=True,
                   capture_output=True)
    for p in sorted((base / "example").rglob("*.safetensors")):
        out[f"example:{p.relative_to(base / 'example')}"] = p
    shutil.copytree(base / "example", base / "l2")
    subprocess.run([*cli, "migrate", str(base / "l2"), "--to", "layout-2"], check=True, capture_output=True)
    out[L.TABLES] = base / "l2" / L.TABLES
    out["model.safetensors@layout-2"] = base / "l2" / "model.safetensors"
    shutil.copytree(base / "l2", base / "l1")
    subprocess.run([*cli, "migrate", str(base / "l1"), "--to", "layout-1"], check=True, capture_output=True)
    out["model.safetensors@layout-1"] = base / "l1" / "model.safetensors"
    return out


KEYS = ["example:model.safetensors", "example:clef_head/joint_head.safetensors", L.TABLES,
        "model.safetensors@layout-2", "model.safetensors@layout-1"]


def test_every_written_file_is_listed(written: dict[str, Path]) -> None:
    assert sorted(written) == sorted(KEYS)


@pytest.mark.parametrize("key", KEYS)
def test_written_file_against_safetensors_save_file(written: dict[str, Path], key: str, tmp_path: Path) -> None:
    _against_save_file(written[key], tmp_path, key)
