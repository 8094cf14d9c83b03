"""Edit checkpoints at the header level: rewrite a safetensors header with ``read.safetensors.encode_header``
and leave the data a sparse hole (verify's structure path reads no tensor data beyond the table
scales, whose zeros are valid zero rows). Fast enough to mutate thousands of times in-process."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from clef_format.fixtures.sparse import fill_one_element_scales
from clef_format.read.safetensors import DTYPE_BITS, encode_header, read_header
from clef_format.spec import layouts as L

Entries = dict[str, tuple[str, tuple[int, ...]]]


def entries(path: Path) -> tuple[Entries, dict[str, str]]:
    h = read_header(path)
    return {n: (t.dtype, tuple(t.shape)) for n, t in h.tensors.items()}, dict(h.metadata)


def write_entries(path: Path, ents: Entries, metadata: dict[str, str] | None) -> None:
    order = sorted(ents.items(), key=lambda kv: (-DTYPE_BITS[kv[1][0]], kv[0]))
    header, size = encode_header([(n, d, s) for n, (d, s) in order], metadata or None)
    with open(path, "wb") as fh:
        fh.write(header)
        fh.truncate(len(header) + size)
    fill_one_element_scales(path)  # a hole reads as 0.0: a global or KV scale of 0 is itself an error


def sparsify(root: Path) -> None:
    """Rewrite every safetensors file of a checkpoint as header + hole (the baseline of the mutations)."""
    for p in sorted(root.rglob("*.safetensors")):
        ents, meta = entries(p)
        write_entries(p, ents, meta)
    index = root / L.BACKBONE_INDEX
    if index.exists():
        _fix_index(root)


def _fix_index(root: Path) -> None:
    index = root / L.BACKBONE_INDEX
    obj = json.loads(index.read_text())
    total, weight_map = 0, {}
    for rel in sorted(set(obj["weight_map"].values())):
        h = read_header(root / rel)
        total += h.file_size - h.data_start
        weight_map.update({n: rel for n in h.tensors})
    obj["weight_map"] = dict(sorted(weight_map.items()))
    obj["metadata"]["total_size"] = total
    index.write_text(json.dumps(obj, indent=2))


def edit_file(root: Path, rel: str, change: Callable[[Entries], None]) -> None:
    """Apply ``change`` to one file's entries; keep a sharded index consistent (a clean re-export)."""
    path = root / rel
    ents, meta = entries(path)
    change(ents)
    write_entries(path, ents, meta)
    if (root / L.BACKBONE_INDEX).exists() and rel != L.TABLES and not rel.startswith(L.HEAD_DIR):
        _fix_index(root)


def edit_json(root: Path, rel: str, change: Callable[[dict], None]) -> None:
    path = root / rel
    obj = json.loads(path.read_text())
    change(obj)
    path.write_text(json.dumps(obj, indent=2))


def file_of(root: Path, tensor: str) -> str:
    for p in sorted(root.rglob("*.safetensors")):
        rel = p.relative_to(root).as_posix()
        if tensor in read_header(p).tensors:
            return rel
    raise KeyError(tensor)


class Snapshot:
    """Every small file of a checkpoint in memory, to restore it between mutations."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
        self.sizes = {p: p.stat().st_size for p in self.files}

    def restore(self, rels: list[str] | None = None) -> None:
        """Put back every file (or only ``rels``, and the index, which header edits keep in step)."""
        if rels is None:
            for p in list(self.root.rglob("*")):
                if p.is_file() and p not in self.files:
                    os.unlink(p)
            paths = list(self.files)
        else:
            paths = [self.root / r for r in [*rels, L.BACKBONE_INDEX] if self.root / r in self.files]
        for p in paths:
            data = self.files[p]
            with open(p, "wb") as fh:
                fh.write(data)
                fh.truncate(self.sizes[p])


def poke(path: Path, name: str, offset: int, data: bytes) -> None:
    """Overwrite bytes of one tensor's data in place, ``offset`` bytes into the tensor."""
    h = read_header(path)
    with open(path, "r+b") as fh:
        fh.seek(h.data_start + h.tensors[name].begin + offset)
        fh.write(data)


def reseal_digests(path: Path) -> None:
    """Record the present bytes' digests in a tables file's ``digests`` metadata (same header length):
    the file as a writer would have written it with these values from the start."""
    import blake3

    from clef_format.spec import tables_format as TF

    h = read_header(path)
    recorded, _ = TF.read_digests(h.metadata)
    want = {}
    with open(path, "r+b") as fh:
        raw = fh.read(h.data_start)
        for name, old in recorded.items():
            t = h.tensors[name]
            fh.seek(h.data_start + t.begin)
            want[name] = new = blake3.blake3(fh.read(t.end - t.begin)).hexdigest()
            raw = raw.replace(f'{name}\\":\\"blake3:{old}'.encode(), f'{name}\\":\\"blake3:{new}'.encode(), 1)
        fh.seek(0)
        fh.write(raw)
    assert TF.read_digests(read_header(path).metadata)[0] == want
