"""Read and validate a safetensors header without touching tensor data or importing torch.

The rules are those of the safetensors Rust reader (``safetensors::tensor::SafeTensors::read_metadata``),
plus one it does not enforce reliably: duplicate JSON keys. Only the first ``8 + N`` bytes are read,
and ``N`` is checked against the limit and the file size before anything is read, so a file that
claims a huge header costs nothing.
"""

from __future__ import annotations

import json
import os

from clef_format.errors import FormatError
from clef_format.records import Record

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any

#: Header length above which the reader refuses (safetensors' ``MAX_HEADER_SIZE``).
MAX_HEADER_SIZE = 100_000_000

#: Bits per element of every dtype safetensors knows.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}

#: Tensors one file may hold. safetensors' own limit is the header size (100 MB: ~1.2 million tiny
#: tensors, ~3 GB of memory to read); a 9B checkpoint holds ~1,300 and the shards of the largest
#: published MoE checkpoints a few thousand each, so more is refused before the JSON is parsed
#: (docs/SECURITY.md states what the limit costs).
MAX_TENSORS = 100_000

_U64_MAX = 2**64 - 1


class HeaderError(FormatError):
    """The file is not a valid safetensors file; ``reason`` is a short machine-friendly tag."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def numel(shape: tuple[int, ...] | list[int]) -> int:
    """Elements of a tensor of this shape (1 for a 0-dim scalar)."""
    n = 1
    for d in shape:
        n *= d
    return n


def tensor_nbytes(dtype: str, shape: tuple[int, ...] | list[int]) -> int:
    """Bytes a tensor takes in a safetensors file; ``ValueError`` when its bits are not whole bytes
    (safetensors refuses an F4 ``[3]``: 12 bits)."""
    bits = numel(shape) * DTYPE_BITS[dtype]
    if bits % 8:
        raise ValueError(f"{dtype}{list(shape)} is {bits} bits, not a whole number of bytes")
    return bits // 8


def encode_header(entries: list[tuple[str, str, tuple[int, ...]]], metadata: dict[str, str] | None = None,
                  min_json_bytes: int = 0) -> tuple[bytes, int]:
    """The bytes of a safetensors header for tensors stored in this order, and the data size after it.

    8-byte little-endian length, then compact JSON padded with spaces to ``min_json_bytes`` and to a
    multiple of 8 (what the Rust writer does, so every tensor stays aligned)."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, dtype, shape in entries:
        size = tensor_nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * max(0, min_json_bytes - len(raw))
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw, offset


class TensorInfo(Record):
    """One header entry (a NamedTuple: thousands are built per file, so construction must be cheap)."""

    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def numel(self) -> int:
        return numel(self.shape)

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


class Header(Record):
    """A validated header: tensors in file order, the string metadata, where data starts."""

    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_start: int
    file_size: int


def _pairs_to_dict(pairs: Any, where: str) -> dict[str, Any]:
    """A JSON object decoded as a list of pairs (``object_pairs_hook=tuple``, which runs in C; arrays stay lists) -> dict."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise HeaderError("duplicate-key", f"duplicate key {key!r} in {where}")
            seen.add(key)
    return out


def _no_constant(name: str) -> None:
    """NaN, Infinity and -Infinity are Python's JSON extensions; safetensors' reader (serde_json) refuses them."""
    raise ValueError(f"{name} is not a JSON value")


_DECODER = json.JSONDecoder(object_pairs_hook=tuple, parse_constant=_no_constant)


def parse_header(raw: bytes, file_size: int) -> Header:
    """Validate header bytes (without the 8-byte prefix) against a file of ``file_size`` bytes."""
    data_start = 8 + len(raw)
    # Every entry is a JSON object, and an object needs a literal '{' (no escape makes one outside a
    # string): the count bounds the entries from above, at the cost of one pass over the bytes.
    objects = raw.count(b"{") - 2  # less the header itself and __metadata__
    if objects > MAX_TENSORS:
        raise HeaderError("too-many-tensors", f"header holds up to {objects} entries, over the limit of {MAX_TENSORS} "
                          "tensors per file; not parsed")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderError("not-utf8", f"header is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    if not text.lstrip(" \t\n\r").startswith("{"):  # JSON whitespace may lead, as safetensors' reader allows
        raise HeaderError("not-json", "header does not start with '{'")
    try:
        pairs = _DECODER.decode(text)
    except (ValueError, RecursionError) as exc:
        raise HeaderError("not-json", f"header is not valid JSON: {exc}") from None
    if not isinstance(pairs, tuple):
        raise HeaderError("not-json", "header is not a JSON object")
    obj = _pairs_to_dict(pairs, "header")

    metadata_raw = obj.pop("__metadata__", None)
    metadata: dict[str, str] = {}
    if metadata_raw is not None:
        if isinstance(metadata_raw, tuple):
            metadata_raw = _pairs_to_dict(metadata_raw, "__metadata__")
        if not isinstance(metadata_raw, dict) or not all(isinstance(v, str) for v in metadata_raw.values()):
            raise HeaderError("bad-metadata", "__metadata__ must map strings to strings")
        metadata = dict(metadata_raw)

    entries: list[tuple[int, int, str, TensorInfo]] = []
    bits_of = DTYPE_BITS
    make = tuple.__new__  # TensorInfo(...) without a Python-level __new__ call per tensor
    info_cls = TensorInfo
    for name, entry in obj.items():
        # Hot loop (thousands of entries per 9B shard): inline checks, no helper calls.
        if type(entry) is not tuple:
            raise HeaderError("bad-entry", f"entry {name!r} is not an object")
        if len(entry) == 3 and entry[0][0] == "dtype" and entry[1][0] == "shape" and entry[2][0] == "data_offsets":
            (_, dtype), (_, shape), (_, offsets) = entry  # the order every safetensors writer uses
        else:
            fields = dict(entry)
            if len(fields) != len(entry):
                _pairs_to_dict(entry, f"entry {name!r}")
            dtype = fields.get("dtype")
            shape = fields.get("shape")
            offsets = fields.get("data_offsets")
        bits = bits_of.get(dtype) if type(dtype) is str else None
        if bits is None:
            raise HeaderError("bad-dtype", f"tensor {name!r} has unknown dtype {dtype!r}")
        if type(shape) is not list:
            raise HeaderError("bad-shape", f"tensor {name!r} has an invalid shape {shape!r}")
        numel = 1
        for d in shape:
            if type(d) is not int or d < 0 or d > _U64_MAX:
                raise HeaderError("bad-shape", f"tensor {name!r} has an invalid shape {shape!r}")
            numel *= d
        if type(offsets) is not list or len(offsets) != 2:
            raise HeaderError("bad-offsets", f"tensor {name!r} has invalid data_offsets {offsets!r}")
        begin, end = offsets
        if type(begin) is not int or type(end) is not int or begin < 0 or end > _U64_MAX:
            raise HeaderError("bad-offsets", f"tensor {name!r} has invalid data_offsets {offsets!r}")
        if end < begin:
            raise HeaderError("bad-offsets", f"tensor {name!r} ends before it begins ({begin}, {end})")
        if numel > _U64_MAX:
            raise HeaderError("overflow", f"tensor {name!r}: element count overflows")
        total_bits = numel * bits
        if total_bits > _U64_MAX or total_bits % 8:
            raise HeaderError("overflow", f"tensor {name!r}: byte size overflows or is not whole")
        if end - begin != total_bits >> 3:
            raise HeaderError(
                "size-mismatch",
                f"tensor {name!r}: {end - begin} bytes stored, {total_bits // 8} implied by {dtype}{shape}",
            )
        entries.append((begin, end, name, make(info_cls, (dtype, tuple(shape), begin, end))))

    entries.sort()
    expected_begin = 0
    for begin, end, name, _ in entries:  # (an empty tensor sorts before a full one at the same offset)
        if begin != expected_begin:
            kind = "overlap" if begin < expected_begin else "gap"
            raise HeaderError(
                "bad-offsets", f"tensor {name!r} starts at {begin}, expected {expected_begin} ({kind} in the data buffer)"
            )
        expected_begin = end

    buffer = file_size - data_start
    if expected_begin != buffer:
        raise HeaderError(
            "truncated" if expected_begin > buffer else "trailing-bytes",
            f"data buffer holds {buffer} bytes but the tensors cover {expected_begin}"
            + (" (file truncated?)" if expected_begin > buffer else ""),
        )
    return Header({name: info for _, _, name, info in entries}, metadata, data_start, file_size)


def read_header(path: str | os.PathLike[str]) -> Header:
    """Read and validate the header of one safetensors file; raise ``HeaderError`` if invalid."""
    with open(path, "rb") as fh:
        file_size = os.fstat(fh.fileno()).st_size
        prefix = fh.read(8)
        if len(prefix) < 8:
            raise HeaderError("truncated", f"file is {file_size} bytes, shorter than the 8-byte length prefix")
        n = int.from_bytes(prefix, "little")
        if n > MAX_HEADER_SIZE:
            raise HeaderError("header-too-large", f"header claims {n} bytes, over the {MAX_HEADER_SIZE} limit")
        if 8 + n > file_size:
            raise HeaderError("truncated", f"header claims {n} bytes but the file has {file_size - 8} after the prefix")
        raw = fh.read(n)
    if len(raw) != n:
        raise HeaderError("truncated", "file shrank while reading the header")
    return parse_header(raw, file_size)


#: dtypes ``read_scalars`` decodes (``memoryview.cast`` formats: no ``struct`` import on the structure path;
#: BF16 and F16 are widened to F32 bits by hand).
_SCALAR_FORMATS = {"F32": "f", "F64": "d", "BF16": "", "F16": ""}


def _half(bits: int) -> float:
    """IEEE binary16 bits -> float (memoryview.cast has no 'e')."""
    sign = -1.0 if bits & 0x8000 else 1.0
    exp, frac = (bits >> 10) & 0x1F, bits & 0x3FF
    if exp == 0x1F:
        return sign * float("inf") if frac == 0 else float("nan")
    if exp == 0:
        return sign * frac * 2.0 ** -24
    return sign * (1 + frac / 1024) * 2.0 ** (exp - 15)


def _scalar(dtype: str, raw: bytes) -> float:
    if dtype == "BF16":  # the high half of an F32
        return float(memoryview(b"\x00\x00" + raw).cast("f")[0])  # little-endian host, as the F32 cast
    if dtype == "F16":
        return _half(raw[0] | raw[1] << 8)
    return float(memoryview(raw).cast(_SCALAR_FORMATS[dtype])[0])  # type: ignore[call-overload]  # "f" or "d", from a table


def read_scalars(path: str | os.PathLike[str], header: Header, names: list[str]) -> dict[str, float]:
    """The values of one-element F32/F64/BF16/F16 tensors of one file, read at their header offsets (a few bytes
    each, one open): global scales and the like, without loading tensors. Other entries are left out."""
    out: dict[str, float] = {}
    wanted = [(header.tensors[n], n) for n in names if n in header.tensors]
    wanted = [(info, n) for info, n in wanted if info.dtype in _SCALAR_FORMATS and info.numel == 1]
    if not wanted:
        return out
    with open(path, "rb", buffering=0) as fh:  # one pread each: no 8 KiB buffer filled to take 4 bytes
        fd = fh.fileno()
        for info, name in sorted(wanted, key=lambda w: w[0].begin):
            raw = os.pread(fd, info.nbytes, header.data_start + info.begin)
            if len(raw) == info.nbytes:
                out[name] = _scalar(info.dtype, raw)
    return out
