"""Path containment and member names (read/paths.py), and byte sizes of odd-bit dtypes (read/safetensors.py)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from clef_format.read.checkpoint import read_checkpoint
from clef_format.read.paths import inside, safe_member
from clef_format.read.safetensors import HeaderError, read_header, tensor_nbytes


@pytest.mark.parametrize("path, base, expected", [
    ("/data/ck", "/data/ck", True),
    ("/data/ck/model.safetensors", "/data/ck", True),
    ("/data/ck/clef_head/t.safetensors", "/data/ck/", True),
    ("/data/ck-evil/model.safetensors", "/data/ck", False),  # a sibling sharing the prefix is outside
    ("/data/ckx", "/data/ck", False),
    ("/data", "/data/ck", False),
    ("/", "/data/ck", False),
])
def test_inside_is_by_whole_components(path: str, base: str, expected: bool) -> None:
    assert inside(path, base) is expected


def test_a_symlink_into_a_sibling_with_the_same_prefix_is_an_escape(tmp_path: Path, built) -> None:
    import shutil

    ck = tmp_path / "ck"
    shutil.copytree(built(), ck, symlinks=True)
    evil = tmp_path / "ck-evil"
    evil.mkdir()
    (evil / "tokenizer.json").write_text("{}")
    (ck / "tokenizer.json").unlink()
    (ck / "tokenizer.json").symlink_to(evil / "tokenizer.json")
    found = read_checkpoint(str(ck))
    assert [f.code for f in found.findings if f.file == "tokenizer.json"] == ["path-escape"]


def test_a_symlinked_parent_is_followed_where_it_leads(tmp_path: Path, built) -> None:
    """The checkpoint reached through a symlinked parent folder is read as itself, with no escapes."""
    real = tmp_path / "real"
    real.mkdir()
    import shutil

    shutil.copytree(built(), real / "ck", symlinks=True)
    (tmp_path / "link").symlink_to(real)
    found = read_checkpoint(str(tmp_path / "link" / "ck"))
    assert not [f for f in found.findings if f.code == "path-escape"]
    assert str(found.layout) == "layout-2"


@pytest.mark.parametrize("rel, expected", [
    ("model-00001-of-00002.safetensors", "model-00001-of-00002.safetensors"),
    ("sub/./x.safetensors", "sub/x.safetensors"),
    ("sub/../x.safetensors", "x.safetensors"),  # stays inside: not an escape (vLLM's own rule is vllm_globs)
    ("a/b/../../x", "x"),
    ("../x.safetensors", None),
    ("sub/../../x.safetensors", None),
    ("..", None),
    ("a/../../x", None),
    ("/etc/passwd", None),
    ("a\\..\\b", None),
    ("a\x00b", None),
    ("", None),
])
def test_safe_member_refuses_every_way_out(rel: str, expected: str | None) -> None:
    assert safe_member(rel) == expected


@pytest.mark.parametrize("dtype, shape, expected", [
    ("F4", (4,), 2), ("F4", (3,), None), ("F4", (2, 3), 3), ("F6_E2M3", (4,), 3), ("F6_E2M3", (3,), None),
    ("BF16", (3, 5), 30), ("I8", (), 1), ("F8_E4M3", (0, 7), 0),
])
def test_tensor_bytes_are_whole_or_refused(dtype: str, shape: tuple[int, ...], expected: int | None) -> None:
    if expected is None:
        with pytest.raises(ValueError, match="not a whole number of bytes"):
            tensor_nbytes(dtype, shape)
    else:
        assert tensor_nbytes(dtype, shape) == expected


@pytest.mark.parametrize("dtype, shape, nbytes", [("F4", [3], 1), ("F4", [3], 2), ("F6_E3M2", [3], 2), ("F4", [4], 2)])
def test_odd_bit_headers_agree_with_safetensors(tmp_path: Path, dtype: str, shape: list[int], nbytes: int) -> None:
    """A tensor whose bits are not whole bytes: our reader and safetensors' own refuse or accept alike."""
    safetensors = pytest.importorskip("safetensors")
    header = json.dumps({"t": {"dtype": dtype, "shape": shape, "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * nbytes)
    try:
        with safetensors.safe_open(str(path), "np") as fh:
            fh.keys()
        theirs = True
    except Exception:
        theirs = False
    try:
        read_header(str(path))
        ours = True
    except HeaderError:
        ours = False
    assert ours == theirs, (dtype, shape, nbytes, ours, theirs)
    if dtype == "F4" and shape == [3]:
        assert not ours  # 12 bits never fit a whole number of bytes


def test_os_sep_is_posix_here() -> None:
    assert os.sep == "/"  # the containment rule above is written for POSIX paths
