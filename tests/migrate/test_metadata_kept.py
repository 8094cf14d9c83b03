"""What a file is besides its bytes survives migrate: holes of sparse files, extended attributes, POSIX ACLs.

Real files on this filesystem (ext4 under /tmp on the dev VM and CI: user xattrs and ACLs, no reflink).
A checkpoint carries a 64 MiB sparse extra file (two data blocks), the backbone migrate rewrites has a
hole in the middle of a tensor it copies byte for byte, and files and folders carry ``user.*`` xattrs
and access / default ACLs. After migrate in place and with ``--output``, the allocated size
(``st_blocks``) of each sparse file is what its data needs, and every attribute is where it was.
Measured before this suite: ``copy_file_range`` filled every hole (the 64 MiB file of 24 blocks came
out 131,072 blocks), and a rewritten file lost every xattr and ACL.
"""

from __future__ import annotations

import errno
import hashlib
import os
import struct
from pathlib import Path

import pytest

from tests.support.migrate import run_json, verified

BLOCK = 4096
SPARSE_SIZE = 64 << 20
#: POSIX ACL xattr tags (linux/posix_acl_xattr.h), version 2, and the "no id" of the owner/mask/other entries.
USER_OBJ, USER, GROUP_OBJ, MASK, OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
NO_ID = 0xFFFFFFFF


def _acl(*entries: tuple[int, int, int]) -> bytes:
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, perm, uid) for tag, perm, uid in entries)


#: rw- for the owner, r-- for uid 4242, r-- for the group (the mask), nothing for others.
ACCESS_ACL = _acl((USER_OBJ, 6, NO_ID), (USER, 4, 4242), (GROUP_OBJ, 4, NO_ID), (MASK, 4, NO_ID), (OTHER, 0, NO_ID))
DEFAULT_ACL = _acl((USER_OBJ, 7, NO_ID), (USER, 5, 4242), (GROUP_OBJ, 5, NO_ID), (MASK, 5, NO_ID), (OTHER, 0, NO_ID))


def _allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def _blocks(size: int) -> int:
    """Bytes a dense file of ``size`` bytes allocates (whole blocks)."""
    return -(-size // BLOCK) * BLOCK


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _make_sparse(path: Path) -> None:
    """64 MiB of which two blocks hold data: the rest is holes (never written)."""
    with open(path, "wb") as fh:
        fh.truncate(SPARSE_SIZE)
        fh.seek(1 << 20)
        fh.write(b"x" * BLOCK)
        fh.seek(40 << 20)
        fh.write(b"y" * 2 * BLOCK)


def _punch_tensor_hole(path: Path) -> tuple[int, int]:
    """Zero the aligned blocks inside the largest tensor migrate copies byte for byte, and rewrite the file
    with those blocks as a hole (what a sparse download or ``cp --sparse`` leaves). Returns (start, end)."""
    from clef_format.read.safetensors import read_header
    from clef_format.spec import layouts as L

    header = read_header(path)
    name, info = max(((n, t) for n, t in header.tensors.items() if n not in L.TABLE_NAMES), key=lambda x: x[1].nbytes)
    begin = header.data_start + info.begin
    start, end = -(-begin // BLOCK) * BLOCK, (begin + info.nbytes) // BLOCK * BLOCK
    assert end - start >= 16 * BLOCK, (name, info.nbytes)
    data = bytearray(path.read_bytes())
    data[start:end] = bytes(end - start)
    tmp = path.with_suffix(".sparse")
    with open(tmp, "wb") as fh:
        fh.write(data[:start])
        fh.seek(end)
        fh.write(data[end:])
    os.replace(tmp, path)
    assert _allocated(path) <= _blocks(len(data)) - (end - start), "this filesystem keeps no holes"
    return start, end


def _can_xattr(path: Path, name: str, value: bytes) -> None:
    try:
        os.setxattr(path, name, value)
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            pytest.skip(f"{name} is not supported on the filesystem of {path} ({exc.strerror})")
        raise


def _attrs(path: Path) -> dict[str, bytes]:
    return {n: os.getxattr(path, n) for n in sorted(os.listxattr(path)) if not n.startswith("security.")}


@pytest.fixture
def source(fresh) -> Path:
    root = fresh("layout-1")
    (root / "extra").mkdir()
    _make_sparse(root / "extra" / "sparse.dat")
    (root / "notes.txt").write_bytes(b"kept beside the weights\n")
    return root


def _out(source: Path, where: str) -> tuple[Path, list[str]]:
    if where == "in-place":
        return source, []
    return source.parent / "out", ["--output", str(source.parent / "out")]


@pytest.mark.parametrize("where", ["in-place", "output"])
def test_sparse_files_stay_sparse(source: Path, capsys, where: str) -> None:
    """The extra file is carried (in place a hard link, out of place a copy), the backbone is rewritten
    with its tensors copied byte for byte: neither fills its holes."""
    start, end = _punch_tensor_hole(source / "model.safetensors")
    extra_blocks = _allocated(source / "extra" / "sparse.dat")
    extra_sha = _sha(source / "extra" / "sparse.dat")
    result, extra_args = _out(source, where)
    rc, out = run_json(capsys, str(source), "--to", "layout-2", *extra_args)
    assert rc == 0 and verified(result)[:2] == ("layout-2", True), [f for f in out["findings"] if f["severity"] == "error"]
    carried = result / "extra" / "sparse.dat"
    assert _sha(carried) == extra_sha and carried.stat().st_size == SPARSE_SIZE
    assert _allocated(carried) <= extra_blocks, f"{_allocated(carried)} bytes allocated, the source {extra_blocks}"
    backbone = result / "model.safetensors"
    hole = end - start
    # the hole moved with the tensor (the tables left the file): at most its two edge blocks are written
    assert _allocated(backbone) <= _blocks(backbone.stat().st_size) - hole + 2 * BLOCK, (_allocated(backbone), hole)


@pytest.mark.parametrize("where", ["in-place", "output"])
def test_xattrs_and_acls_of_rewritten_and_carried_files_and_folders_are_kept(source: Path, capsys, where: str) -> None:
    """model.safetensors and config.json are rewritten by the step, notes.txt and the sparse file carried,
    extra/ and the checkpoint folder itself rebuilt: each keeps its user xattrs and ACLs."""
    marked = ["model.safetensors", "config.json", "notes.txt", "extra/sparse.dat", "extra", "."]
    for rel in marked:
        _can_xattr(source / rel, "user.origin", f"kept:{rel}".encode())
    os.setxattr(source / "model.safetensors", "user.checksum.note", b"\x00binary\xff")
    for rel in ("model.safetensors", "notes.txt", "config.json"):
        _can_xattr(source / rel, "system.posix_acl_access", ACCESS_ACL)
    _can_xattr(source / "extra", "system.posix_acl_default", DEFAULT_ACL)
    before = {rel: _attrs(source / rel) for rel in marked}
    modes = {rel: (source / rel).stat().st_mode for rel in marked}
    assert before["model.safetensors"]["system.posix_acl_access"] and before["extra"]["system.posix_acl_default"]
    result, extra_args = _out(source, where)
    rc, out = run_json(capsys, str(source), "--to", "layout-2", *extra_args)
    assert rc == 0 and verified(result)[:2] == ("layout-2", True), [f for f in out["findings"] if f["severity"] == "error"]
    after = {rel: _attrs(result / rel) for rel in marked}
    assert after == before
    assert {rel: (result / rel).stat().st_mode for rel in marked} == modes
    if where == "in-place":  # a new file of the step takes what its folder passes on, as any new file there
        tables = result / "clef_head" / "tables_int8.safetensors"
        assert "user.origin" not in _attrs(tables)


def test_an_empty_output_folder_the_user_made_keeps_its_mode_and_xattrs(source: Path, capsys) -> None:
    """An empty --output the user made (0700, a user xattr): the new tree that replaces it came out with
    the source's mode (0755 here) and the source's xattrs; the folder it replaces is the one to follow."""
    out = source.parent / "out"
    out.mkdir()
    out.chmod(0o700)
    _can_xattr(out, "user.origin", b"made by me")
    _can_xattr(source, "user.origin", b"the source")
    before = _attrs(out)
    rc, report = run_json(capsys, str(source), "--to", "layout-2", "--output", str(out))
    assert rc == 0 and verified(out)[:2] == ("layout-2", True), report
    assert (out.stat().st_mode & 0o7777, _attrs(out)) == (0o700, before)


def test_a_rewritten_manifest_keeps_its_xattrs_and_acl(source: Path) -> None:
    from clef_format.migrate.manifest_writer import make_manifest

    assert make_manifest(str(source)).ok
    manifest = source / "clef_manifest.json"
    _can_xattr(manifest, "user.origin", b"signed-off")
    _can_xattr(manifest, "system.posix_acl_access", ACCESS_ACL)
    before = _attrs(manifest)
    (source / "notes.txt").write_bytes(b"edited\n")
    assert make_manifest(str(source), force=True).ok and _attrs(manifest) == before  # the edit, recorded on purpose

