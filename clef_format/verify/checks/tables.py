"""Checks of ``clef_head/tables_int8.safetensors`` against the format and the config."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from clef_format.verify.vllm_build import VllmBuild
    from typing import Callable, Iterator

from clef_format.read.checkpoint import Checkpoint
from clef_format.verify.options import DEFAULTS, VerifyOptions
from clef_format.read.safetensors import Header
from clef_format.spec import layouts as L
from clef_format.spec import tables_format as TF
from clef_format.spec.findings import Finding, error, warning
from clef_format.spec.model_spec import table_shape

_FIX = ("re-download clef_head/tables_int8.safetensors, or re-create it from a layout-1 copy of the same revision: "
        "clef-format migrate COPY --to layout-2")


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
        want = min(step, nbytes - done)
        fh.seek(start + done)  # type: ignore[attr-defined]
        data = fh.read(want)  # type: ignore[attr-defined]
        if len(data) < want:  # short only at its end: cut or rewritten since its header was read
            from clef_format.read.hashing import ChangedWhileRead

            raise ChangedWhileRead.cut("a table was read")
        out.merge(rule(data), done // width)
        done += len(data)
    return out


class _naming:
    """An ``OSError`` raised while ``rel`` is read names it (``filename``): the caller says which file it was.
    (A class, not ``contextlib.contextmanager``: this module is on verify's fast path, which imports no contextlib.)"""

    def __init__(self, rel: str) -> None:
        self.rel = rel

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, OSError) and not exc.filename:
            exc.filename = self.rel


def table_content_findings(ck: Checkpoint) -> list[Finding]:
    """The value rules of ``spec.tables_format``, reading the tables in full, and the digests the
    tables file records: the int8 file's values (no -128; a zero scale only on a zero row), each
    tensor against its recorded ``digests`` entry, and every float table the backbone holds
    (layout-1, the release: all finite). What ``verify --deep``, the serving gate, the marker repair
    and migrate add to ``check_tables``, which applies the scale rule on every path (it reads only
    the scales). One pass over the file (``read.table_scan``)."""
    from clef_format.read.table_scan import scan_tables  # the full read: deep, gate and migrate only

    out: list[Finding] = []
    header = ck.headers.get(L.TABLES)
    if header is not None:
        recorded, _ = TF.read_digests(header.metadata)  # a malformed entry: check_tables' note
        with _naming(L.TABLES):
            scan = scan_tables(ck.path(L.TABLES), header, ck.tables, recorded)
        for table, p in scan.problems.items():
            out += _value_findings(table, p)
        for name, digest in sorted(recorded.items()):
            actual = scan.digests.get(name)
            if actual is not None and actual != digest:
                out.append(error(
                    "digest-mismatch",
                    f"{name}: its bytes are not the ones recorded when the file was written ({TF.DIGEST_ALGORITHM} "
                    f"expected {digest}, actual {actual}): a table edited, swapped with the other or replaced "
                    "by another of the same shape would be served as wrong embeddings or logits, with no error",
                    file=L.TABLES, tensor=name, fix=_FIX))
    for table in ck.tables:
        info = ck.backbone.get(table)
        rel = ck.tensor_file.get(table)
        hdr = ck.headers.get(rel) if rel else None
        if info is None or rel is None or hdr is None or info.dtype not in TF.FLOAT_TABLE_DTYPES:
            continue
        width = 4 if info.dtype == "F32" else 2
        with _naming(rel), open(ck.path(rel), "rb") as fh:
            p = _scan(fh, hdr.data_start + info.begin, info.nbytes, width, lambda d: TF.float_problems(info.dtype, d))
        if p:
            rows = sorted({i // max(info.shape[-1], 1) for i in p.first["nonfinite"]})
            out.append(error("table-nonfinite", f"{table}: {p.counts['nonfinite']} value(s) NaN or infinite "
                                                f"(rows {rows}): it cannot be served nor quantized faithfully",
                             file=rel, tensor=table, fix="re-download the backbone; a healthy table has no NaN/Inf"))
    return out


def _value_findings(table: str, p: TF.Problems) -> list[Finding]:
    """The value kinds of one table's ``Problems`` (its scale kinds are ``check_tables``' findings)."""
    out = []
    if "out-of-range" in p.counts:
        out.append(error("table-value-range",
                         f"{table}: {p.counts['out-of-range']} value(s) -128, outside the format's "
                         f"[-{TF.QMAX}, {TF.QMAX}] (rows {p.first['out-of-range']}): the file is corrupted (the "
                         "gather decodes -128 as a value no quantized row holds)",
                         file=L.TABLES, tensor=table, fix=_FIX))
    if "zero-scale" in p.counts:
        out.append(error("table-zero-scale",
                         f"{table}: {p.counts['zero-scale']} row(s) with scale 0 but values not all 0 (rows "
                         f"{p.first['zero-scale']}): the format gives scale 0 to a zero row alone; these rows "
                         "would be served as zeros, erasing their tokens", file=L.TABLES, tensor=table, fix=_FIX))
    return out


def _scale_finding(scale: str, p: TF.Problems) -> list[Finding]:
    if not p:
        return []
    code = "scale-range" if set(p.counts) == {"too-large"} else "nonfinite-scale"
    return [error(code, f"{scale}: {sum(p.counts.values())} row scale(s) invalid: {p.describe()}",
                  file=L.TABLES, tensor=scale, fix=_FIX)]


def check_tables(ck: Checkpoint, opts: VerifyOptions = DEFAULTS, vllm: VllmBuild | None = None) -> Iterator[Finding]:
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
                        f"{name} is {info.dtype}{list(info.shape)}, expected {dtype}{list(shape)} "
                        f"(vocab {vocab}, hidden {hidden})",
                        file=L.TABLES, tensor=name, fix=_FIX)
    for name in sorted(set(header.tensors) - set(expected)):
        yield warning("table-shape", f"{L.TABLES} holds {name}, which the format does not define: the plugin reads "
                      "the tables by name and ignores it (it only costs disk space)",
                      file=L.TABLES, tensor=name, fix=f"remove {name} from {L.TABLES}, or leave it")
    for problem in TF.metadata_problems(header.metadata, tuple(ck.tables)):
        yield error("tables-metadata", f"{L.TABLES}: {problem}: the file says it is not int8 tables of this "
                    "format, so its rows would be decoded with the wrong rule", file=L.TABLES, fix=_FIX)
    for note in TF.metadata_notes(header.metadata, tuple(ck.tables), tuple(header.tensors)):
        yield warning("tables-metadata", f"{L.TABLES}: {note} (provenance only: no loader reads it)",
                      file=L.TABLES, fix="nothing to do to serve: no loader reads it (the tables file a migration "
                                         "from a layout-1 copy writes records it)")
    for table in ck.tables:
        scale = TF.scale_name(table)
        info = header.tensors.get(scale)
        if info is None or info.dtype != TF.SCALE_DTYPE:
            continue
        yield from _scale_finding(scale, bad_scale_rows(ck, header, scale))
