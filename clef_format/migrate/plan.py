"""Pure planning: what a migration step reads, writes, carries over and drops. No I/O here.

A step (a module of ``migrations/``) turns a ``Checkpoint`` (structure only) into a list of
output files, each described by where its bytes come from. ``apply`` is the only code that
acts on a plan; it never has to decide anything the plan did not say, so ``--dry-run``
prints exactly what a real run would do.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Union

from clef_format.read.safetensors import DTYPE_BITS, encode_header, tensor_nbytes

#: Header bytes reserved for metadata filled in after the data is written (the quality report).
METADATA_RESERVE = 4096


# ---- where the bytes of one output tensor come from ---------------------------------------

@dataclass(frozen=True)
class FileBytes:
    """Bytes copied verbatim from a source file (untouched tensors: byte-identical by construction)."""

    rel: str
    offset: int  # absolute offset in the source file
    nbytes: int


@dataclass(frozen=True)
class QuantValues:
    """The I8 rows of a table, quantized block by block from its source rows."""

    table: str
    rel: str
    offset: int
    dtype: str  # source dtype: BF16 | F16 | F32
    rows: int
    hidden: int


@dataclass(frozen=True)
class QuantScales:
    """The F32 ``[rows, 1]`` scales produced while quantizing ``table`` (same output file)."""

    table: str
    rows: int


@dataclass(frozen=True)
class Decoded:
    """A table decoded from the int8 tables file back to ``dtype`` (downgrade: not the original bytes)."""

    table: str
    rel: str
    values_offset: int
    scales_offset: int
    rows: int
    hidden: int
    dtype: str


Source = Union[FileBytes, QuantValues, QuantScales, Decoded]


@dataclass(frozen=True)
class TensorOut:
    name: str
    dtype: str
    shape: tuple[int, ...]
    source: Source

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.dtype, self.shape)


# ---- output files ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Safetensors:
    """A safetensors file written by streaming: header first, then each tensor's bytes in order.

    ``quality_metadata`` names the metadata key filled after the data (header space reserved).
    """

    rel: str
    tensors: tuple[TensorOut, ...]
    metadata: Mapping[str, str]
    quality_metadata: bool = False
    mode_from: str | None = None  # copy permission bits from this source file

    @property
    def size(self) -> int:
        return len(header_bytes(self)) + sum(t.nbytes for t in self.tensors)


@dataclass(frozen=True)
class JsonFile:
    rel: str
    obj: Any
    mode_from: str | None = None

    def text(self) -> bytes:
        return (json.dumps(self.obj, indent=2) + "\n").encode()

    @property
    def size(self) -> int:
        return len(self.text())


@dataclass(frozen=True)
class IndexFile:
    """``model.safetensors.index.json`` rewritten: the source JSON with weight_map entries dropped/added."""

    rel: str
    drop: tuple[str, ...]
    add: tuple[tuple[str, str], ...]
    size_delta: int
    size_hint: int

    @property
    def size(self) -> int:
        return self.size_hint


OutFile = Union[Safetensors, JsonFile, IndexFile]


@dataclass
class Plan:
    """One step: source, target, every output file, every file dropped; figures for --dry-run."""

    revision: str
    direction: str  # "upgrade" | "downgrade"
    from_layout: str
    to_layout: str
    source: str
    outputs: list[OutFile] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)  # source files not carried into the result
    carried: dict[str, int] = field(default_factory=dict)  # unchanged files (rel -> size), linked or copied
    reads: dict[str, int] = field(default_factory=dict)  # source file -> bytes read
    notes: list[str] = field(default_factory=list)
    fixes: frozenset[str] = frozenset()  # finding codes this step repairs (not a reason to refuse)

    @property
    def bytes_written(self) -> int:
        return sum(o.size for o in self.outputs)

    @property
    def bytes_read(self) -> int:
        return sum(self.reads.values())

    @property
    def bytes_carried(self) -> int:
        return sum(self.carried.values())

    def space_needed(self, carried_by_link: bool) -> int:
        """Bytes of free space the run needs on the target filesystem (plus a journal's worth)."""
        return self.bytes_written + (0 if carried_by_link else self.bytes_carried) + 1_000_000

    def to_dict(self, carried_by_link: bool | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "revision": self.revision,
            "direction": self.direction,
            "from": self.from_layout,
            "to": self.to_layout,
            "read": dict(sorted(self.reads.items())),
            "written": {o.rel: o.size for o in self.outputs},
            "removed": sorted(self.removed),
            "carried": len(self.carried),
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "bytes_carried": self.bytes_carried,
            "notes": list(self.notes),
        }
        if carried_by_link is not None:
            out["carried_by"] = "link" if carried_by_link else "copy"
            out["space_needed"] = self.space_needed(carried_by_link)
        return out


# ---- the safetensors header, computed the same way at plan time and at write time ------------

def header_bytes(out: Safetensors, metadata: Mapping[str, str] | None = None) -> bytes:
    """8-byte length + JSON padded with spaces to a multiple of 8 (plus the reserve, when asked)."""
    entries = [(t.name, t.dtype, t.shape) for t in out.tensors]
    meta = dict(out.metadata if metadata is None else metadata)
    if not out.quality_metadata:
        return encode_header(entries, meta)[0]
    # the quality figures are written after the data: their room is reserved when the header is planned
    reserve = len(encode_header(entries, dict(out.metadata))[0]) - 8 + METADATA_RESERVE
    planned = len(encode_header(entries, dict(out.metadata), reserve)[0])
    raw, _ = encode_header(entries, meta, reserve)
    if len(raw) != planned:
        raise ValueError("metadata outgrew the reserved header space")
    return raw


def aligned_insert_index(tensors: list[TensorOut]) -> int:
    """Where added 16-bit tensors keep every tensor aligned: before the first tensor narrower than 16 bits."""
    for i, t in enumerate(tensors):
        if DTYPE_BITS[t.dtype] < 16:
            return i
    return len(tensors)
