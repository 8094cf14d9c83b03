"""Hugging Face download state: unfinished downloads in the repo's blob store or a local_dir's metadata.

A snapshot folder only gets its symlink once a blob is complete, so the snapshot scan alone cannot
see a half-downloaded file: it sits in ``blobs/<etag>.incomplete`` (cache) or
``.cache/huggingface/download/*.incomplete`` (``local_dir``). Only file names are listed; nothing is read.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Iterator

from .. import layouts as L
from ..checkpoint import Checkpoint, hf_blobs_dir
from ..findings import Finding, error, warning

_MAX_LISTED = 10_000  # a hostile blob store cannot make verify walk forever


def _incomplete(folder: str, recursive: bool) -> list[str]:
    out: list[str] = []
    seen = 0
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        if not recursive:
            dirnames[:] = []
        for name in filenames:
            seen += 1
            if name.endswith(".incomplete"):
                out.append(os.path.relpath(os.path.join(dirpath, name), folder).replace(os.sep, "/"))
        if seen > _MAX_LISTED:
            break
    return sorted(out)


def _snapshot_incomplete(ck: Checkpoint) -> bool:
    """Whether the snapshot lacks something it needs (then an unfinished blob is likely one of its files)."""
    if any(f.code == "missing-file" and f.severity == "error" for f in ck.findings):
        return True
    return any(not ck.has(rel) and rel not in ck.bad_headers for rel in L.required_files(ck.layout))


def check_cache(ck: Checkpoint) -> Iterator[Finding]:
    places: list[tuple[str, str, bool]] = []
    if ck.hf_snapshot:
        places.append((hf_blobs_dir(ck.root), "the repository's blobs/", False))
    places.append((os.path.join(ck.root, ".cache", "huggingface", "download"), ".cache/huggingface/download/", True))
    for folder, where, recursive in places:
        if not os.path.isdir(folder):
            continue
        names = _incomplete(folder, recursive)
        if not names:
            continue
        message = (f"{len(names)} unfinished download(s) in {where}: {', '.join(names[:3])}"
                   + (" ..." if len(names) > 3 else ""))
        fix = "re-run the download (hf download / snapshot_download) to finish it, then verify again"
        if _snapshot_incomplete(ck):
            yield error("partial-download", message + "; files of this checkpoint are missing", fix=fix)
        else:
            yield warning("partial-download", message + " (this checkpoint itself looks complete: "
                          "perhaps another revision)", fix=fix + "; or delete the .incomplete files")
