"""Checks of ``clef_head/tables_int8.safetensors`` against the format and the config."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Iterator

from clef_format.read.checkpoint import Checkpoint
from clef_format.read.safetensors import Header
from clef_format.spec import layouts as L
from clef_format.spec import tables_format as TF
from clef_format.spec.findings import Finding, error
from clef_format.spec.model_spec import table_shape

_FIX = "re-download clef_head/tables_int8.safetensors, or re-create it with clef-format migrate from a layout-1 copy"


_LOW_BYTES = bytes(range(0x80))


def bad_f32_indexes(data: bytes, limit: int = 5) -> tuple[int, list[int]]:
    """Count and first indexes of little-endian F32 values that are NaN, infinite or negative.

    Works on the sign and exponent bits, so a 248320-row scale costs a millisecond and no
    numeric import: bit 31 set is negative (or -0/-NaN), exponent bits all set is Inf or NaN.
    """
    high = data[3::4]
    bad_sign = len(high.translate(None, _LOW_BYTES)) > 0
    maybe_nonfinite = b"\x7f" in high
    if not bad_sign and not maybe_nonfinite:
        return 0, []
    bad = []
    for i, (b2, b3) in enumerate(zip(data[2::4], high)):
        if b3 >= 0x80 and not (b3 == 0x80 and b2 == 0 and data[4 * i: 4 * i + 2] == b"\0\0"):
            bad.append(i)
        elif b3 == 0x7F and b2 >= 0x80:
            bad.append(i)
    return len(bad), bad[:limit]


def bad_scale_rows(ck: Checkpoint, header: Header, name: str, limit: int = 5) -> tuple[int, list[int]]:
    """Read one F32 scale tensor of the tables file (only it) and find its bad rows."""
    info = header.tensors[name]
    with open(ck.path(L.TABLES), "rb") as fh:
        fh.seek(header.data_start + info.begin)
        return bad_f32_indexes(fh.read(info.nbytes), limit)


def check_tables(ck: Checkpoint) -> Iterator[Finding]:
    header = ck.headers.get(L.TABLES)
    if header is None or ck.model is None:
        return
    vocab, hidden = table_shape(ck.model)
    expected = TF.expected_entries(ck.tables, vocab, hidden)
    for name, (dtype, shape) in expected.items():
        info = header.tensors.get(name)
        if info is None:
            yield error("table-shape", f"{L.TABLES} lacks {name}", file=L.TABLES, tensor=name, fix=_FIX)
        elif info.dtype != dtype or info.shape != shape:
            yield error("table-shape",
                        f"{name} is {info.dtype}{list(info.shape)}, expected {dtype}{list(shape)} (vocab {vocab}, hidden {hidden})",
                        file=L.TABLES, tensor=name, fix=_FIX)
    for name in sorted(set(header.tensors) - set(expected)):
        yield error("table-shape", f"{L.TABLES} holds {name}, which the format does not define",
                    file=L.TABLES, tensor=name, fix=_FIX)
    for problem in TF.metadata_problems(header.metadata):
        yield error("tables-metadata", f"{L.TABLES}: {problem}", file=L.TABLES, fix=_FIX)
    for table in ck.tables:
        scale = TF.scale_name(table)
        info = header.tensors.get(scale)
        if info is None or info.dtype != TF.SCALE_DTYPE:
            continue
        count, first = bad_scale_rows(ck, header, scale)
        if count:
            yield error("nonfinite-scale", f"{scale}: {count} row scale(s) NaN, infinite or negative (rows {first})",
                        file=L.TABLES, tensor=scale, fix=_FIX)
