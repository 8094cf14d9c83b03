"""Checks of ``clef_head/tables_int8.safetensors`` against the format and the config."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Callable, Iterator

from clef_format.read.checkpoint import Checkpoint
from clef_format.read.safetensors import Header
from clef_format.spec import layouts as L
from clef_format.spec import tables_format as TF
from clef_format.spec.findings import Finding, error
from clef_format.spec.model_spec import table_shape

_FIX = "re-download clef_head/tables_int8.safetensors, or re-create it with clef-format migrate from a layout-1 copy"


def bad_scale_rows(ck: Checkpoint, header: Header, name: str) -> TF.Problems:
    """Read one F32 scale tensor of the tables file (only it) and apply the format's scale rule."""
    info = header.tensors[name]
    with open(ck.path(L.TABLES), "rb") as fh:
        fh.seek(header.data_start + info.begin)
        return TF.scale_problems(fh.read(info.nbytes))


CHUNK = 16 * 1024 * 1024


def _scan(fh: object, start: int, nbytes: int, width: int, rule: Callable[[bytes], TF.Problems]) -> TF.Problems:
    out = TF.Problems()
    step = CHUNK - CHUNK % width
    done = 0
    while done < nbytes:
        fh.seek(start + done)  # type: ignore[attr-defined]
        data = fh.read(min(step, nbytes - done))  # type: ignore[attr-defined]
        if not data:
            raise OSError("file shrank while reading a table")
        out.merge(rule(data), done // width)
        done += len(data)
    return out


def table_content_findings(ck: Checkpoint) -> list[Finding]:
    """The value rules of ``spec.tables_format``, reading the tables in full: the int8 file's values
    (no -128) and every float table the backbone holds (layout-1, the release: all finite). What
    ``verify --deep``, the marker repair and migrate add to ``check_tables``, which applies the scale
    rule on every path (it reads only the scales)."""
    out: list[Finding] = []
    header = ck.headers.get(L.TABLES)
    if header is not None:
        with open(ck.path(L.TABLES), "rb") as fh:
            for table in ck.tables:
                info = header.tensors.get(table)
                if info is not None and info.dtype == TF.VALUE_DTYPE:
                    p = _scan(fh, header.data_start + info.begin, info.nbytes, 1, TF.int8_problems)
                    if p:
                        rows = sorted({i // max(info.shape[-1], 1) for i in p.first["out-of-range"]})
                        out.append(error("table-value-range",
                                         f"{table}: {p.counts['out-of-range']} value(s) -128, outside the format's "
                                         f"[-{TF.QMAX}, {TF.QMAX}] (rows {rows}): the file is corrupted",
                                         file=L.TABLES, tensor=table, fix=_FIX))
    for table in ck.tables:
        info = ck.backbone.get(table)
        rel = ck.tensor_file.get(table)
        hdr = ck.headers.get(rel) if rel else None
        if info is None or hdr is None or info.dtype not in TF.FLOAT_TABLE_DTYPES:
            continue
        width = 4 if info.dtype == "F32" else 2
        with open(ck.path(rel), "rb") as fh:
            p = _scan(fh, hdr.data_start + info.begin, info.nbytes, width, lambda d: TF.float_problems(info.dtype, d))
        if p:
            rows = sorted({i // max(info.shape[-1], 1) for i in p.first["nonfinite"]})
            out.append(error("table-nonfinite", f"{table}: {p.counts['nonfinite']} value(s) NaN or infinite "
                                                f"(rows {rows}): it cannot be served nor quantized faithfully",
                             file=rel, tensor=table, fix="re-download the backbone; a healthy table has no NaN/Inf"))
    return out


def _scale_finding(scale: str, p: TF.Problems) -> list[Finding]:
    if not p:
        return []
    code = "scale-range" if set(p.counts) == {"too-large"} else "nonfinite-scale"
    return [error(code, f"{scale}: {sum(p.counts.values())} row scale(s) invalid: {p.describe()}",
                  file=L.TABLES, tensor=scale, fix=_FIX)]


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
    for problem in TF.metadata_problems(header.metadata, tuple(ck.tables)):
        yield error("tables-metadata", f"{L.TABLES}: {problem}", file=L.TABLES, fix=_FIX)
    for table in ck.tables:
        scale = TF.scale_name(table)
        info = header.tensors.get(scale)
        if info is None or info.dtype != TF.SCALE_DTYPE:
            continue
        yield from _scale_finding(scale, bad_scale_rows(ck, header, scale))
