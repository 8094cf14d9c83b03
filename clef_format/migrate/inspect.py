"""Read-only checks migrate needs beyond verify's structural ones (no writes, no torch)."""

from __future__ import annotations

from clef_format.read.checkpoint import Checkpoint
from clef_format.spec import layouts as L

CHUNK = 16 * 1024 * 1024


def int8_out_of_range(ck: Checkpoint) -> list[str]:
    """Tables whose I8 values hold -128, which the format never writes (a sign of a corrupted file)."""
    header = ck.headers.get(L.TABLES)
    if header is None:
        return []
    bad = []
    with open(ck.path(L.TABLES), "rb") as fh:
        for name in ck.tables:
            info = header.tensors.get(name)
            if info is None or info.dtype != "I8":
                continue
            fh.seek(header.data_start + info.begin)
            left = info.nbytes
            while left:
                chunk = fh.read(min(CHUNK, left))
                if not chunk:
                    break
                left -= len(chunk)
                if b"\x80" in chunk:
                    bad.append(name)
                    break
    return bad
