"""Read an int8 tables file once: the complete table rule and each tensor's BLAKE3 digest, together.

One function serves every reader that looks at the tables' content: ``verify --deep``, the serving
gate at start-up (``vllm.gate``), the marker repair and migrate's check of its source
(``verify.checks.tables.table_content_findings``), and migrate's writer, which scans the file it
has just written to record its digests and to prove its own output follows the rule. The rule is
``spec.tables_format.TableRule`` (stdlib); this module only streams the bytes to it.

Memory is bounded: whole rows, ``CHUNK`` bytes at a time. The -128 test is a ``memchr`` and
BLAKE3 hashes on every core with the GIL released, so the pass runs at about the speed of the
read itself (benchmarks/RESULTS.md, "The table rule at start-up").
"""

from __future__ import annotations

import os

from clef_format.read.safetensors import Header
from clef_format.spec import tables_format as TF

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Iterable

#: Bytes read at a time (rounded down to whole rows): big enough for BLAKE3 to use every core.
CHUNK = 16 * 1024 * 1024


class TablesScan:
    """What one pass over a tables file found: per table, its rule's ``Problems`` (tables whose
    names, dtypes or shapes are wrong are not judged: ``check_tables`` reports them); per tensor
    asked for, the hex BLAKE3 of its raw bytes."""

    def __init__(self) -> None:
        self.problems: dict[str, TF.Problems] = {}
        self.digests: dict[str, str] = {}


def _hasher() -> "object":
    import blake3

    return blake3.blake3(max_threads=blake3.blake3.AUTO)


def _stream(fd: int, start: int, nbytes: int, step: int) -> "Iterable[tuple[int, bytes]]":
    """(offset within the tensor, bytes), ``step`` bytes at a time; ``ChangedWhileRead`` when the file is short."""
    done = 0
    while done < nbytes:
        want = min(step, nbytes - done)
        data = os.pread(fd, want, start + done)
        if len(data) < want:  # a regular file reads short only at its end: cut or rewritten since its header was read
            from clef_format.read.hashing import ChangedWhileRead

            raise ChangedWhileRead.cut("a table was read")
        yield done, data
        done += len(data)


def judged_tables(header: Header, tables: "Iterable[str]") -> dict[str, int]:
    """The tables whose values and scales have the format's dtypes and agreeing shapes: name -> hidden.
    (A row longer than ``CHUNK`` is no model's: ``check_tables`` reports its shape; memory stays bounded.)"""
    out = {}
    for name in tables:
        q, s = header.tensors.get(name), header.tensors.get(TF.scale_name(name))
        if (q is not None and s is not None and q.dtype == TF.VALUE_DTYPE and s.dtype == TF.SCALE_DTYPE
                and len(q.shape) == 2 and tuple(s.shape) == (q.shape[0], 1) and q.shape[1] <= CHUNK):
            out[name] = q.shape[1]
    return out


def scan_tables(path: str, header: Header, tables: "Iterable[str]", digest_names: "Iterable[str]" = ()) -> TablesScan:
    """Apply the table rule to ``tables`` and hash ``digest_names`` (names absent from the header are
    skipped), reading each tensor once. Raises ``OSError`` when the file cannot be read in full."""
    result = TablesScan()
    judged = judged_tables(header, tables)
    wanted = {n for n in digest_names if n in header.tensors}
    with open(path, "rb", buffering=0) as fh:
        fd = fh.fileno()
        scales: dict[str, bytes] = {}
        for table in judged:  # the scales first (4 bytes a row): the rule needs them before the rows
            name = TF.scale_name(table)
            info = header.tensors[name]
            data = b"".join(d for _, d in _stream(fd, header.data_start + info.begin, info.nbytes, CHUNK))
            scales[table] = data
            if name in wanted:
                h = _hasher()
                h.update(data)  # type: ignore[attr-defined]
                result.digests[name] = h.hexdigest()  # type: ignore[attr-defined]
                wanted.discard(name)
        for name in sorted({*judged, *wanted}, key=lambda n: header.tensors[n].begin):
            info = header.tensors[name]
            hidden = judged.get(name)
            rule = TF.TableRule(scales[name], hidden) if hidden is not None else None
            h = _hasher() if name in wanted else None
            step = CHUNK - CHUNK % hidden if hidden else CHUNK
            step = max(step, hidden or 1)
            for offset, data in _stream(fd, header.data_start + info.begin, info.nbytes, step):
                if h is not None:
                    h.update(data)  # type: ignore[attr-defined]
                if rule is not None:
                    rule.feed(offset // hidden, data)  # type: ignore[operator]
            if h is not None:
                result.digests[name] = h.hexdigest()  # type: ignore[attr-defined]
            if rule is not None:
                result.problems[name] = rule.problems
    return result
