"""Hugging Face download state: unfinished downloads in the repo's blob store or a local_dir's metadata.

A snapshot folder only gets its symlink once a blob is complete, so the snapshot scan alone cannot
see a half-downloaded file: it sits in ``blobs/<etag>.incomplete`` (cache) or
``.cache/huggingface/download/*.incomplete`` (``local_dir``). Only file names are listed; nothing is read.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from clef_format.verify.vllm_build import VllmBuild
    from typing import Iterator

from clef_format.read.checkpoint import Checkpoint
from clef_format.verify.options import DEFAULTS, VerifyOptions
from clef_format.read.hf_cache import LOCAL_DIR_DOWNLOAD, blobs_dir, incomplete_downloads
from clef_format.spec import layouts as L
from clef_format.spec.findings import Finding, error, warning


def _snapshot_incomplete(ck: Checkpoint) -> bool:
    """Whether the snapshot lacks something it needs (then an unfinished blob is likely one of its files)."""
    if any(f.code == "missing-file" and f.severity == "error" for f in ck.findings):
        return True
    return any(not ck.has(rel) and rel not in ck.bad_headers for rel in L.required_files(ck.layout))


def check_cache(ck: Checkpoint, opts: VerifyOptions = DEFAULTS, vllm: VllmBuild | None = None) -> Iterator[Finding]:
    places: list[tuple[str, str, bool]] = []
    if ck.hf_snapshot:
        places.append((blobs_dir(ck.root), "the repository's blobs/", False))
    places.append((os.path.join(ck.root, *LOCAL_DIR_DOWNLOAD.split("/")), LOCAL_DIR_DOWNLOAD + "/", True))
    for folder, where, recursive in places:
        if not os.path.isdir(folder):
            continue
        names = incomplete_downloads(folder, recursive)
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
