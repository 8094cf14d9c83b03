"""Find a checkpoint: a directory, or a Hugging Face repo id resolved offline in the local cache.

Never downloads and never writes: the snapshot folder for the revision (default ``main``;
``org/name@rev`` picks another) is found by huggingface_hub's cache rules (``cached_snapshot``).
"""

from __future__ import annotations

import os
import re

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")


class PathNotFound(FileNotFoundError):
    """PATH is neither a directory nor a repo id present in the local cache."""


def resolve(path: str, cache_dir: str | None = None) -> str:
    """The directory to verify for ``path`` (a folder or ``org/name[@revision]``)."""
    if os.path.isdir(path):
        return path
    if os.path.exists(path):
        raise PathNotFound(f"{path} is not a directory")
    if not _REPO_ID.match(path):
        raise PathNotFound(f"{path}: no such directory")
    repo_id, _, revision = path.partition("@")
    snapshot = cached_snapshot(repo_id, revision or "main", cache_dir)
    if snapshot is None:
        raise PathNotFound(
            f"{path}: no directory of that name, and no cached snapshot of {repo_id}"
            f"{'@' + revision if revision else ''} in the Hugging Face cache "
            f"(download it first: hf download {repo_id})")
    return snapshot


def cached_snapshot(repo_id: str, revision: str, cache_dir: str | None = None) -> str | None:
    """The snapshot folder of ``repo_id`` at ``revision`` (a ref or a commit), by huggingface_hub's rules.

    Unlike ``try_to_load_from_cache`` this needs no particular file in the snapshot, so a snapshot
    that lacks config.json is verified (and reported) instead of being "not found". A revision is a
    ref name or commit hash, never a path: ``..`` and absolute forms are refused, and the commit a
    ref holds must name an existing folder under ``snapshots/``.
    """
    from huggingface_hub import constants  # only for repo ids: keeps the dir path fast
    from huggingface_hub.file_download import repo_folder_name

    parts = revision.split("/")
    if not revision or revision.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return None
    repo = os.path.join(cache_dir or constants.HF_HUB_CACHE, repo_folder_name(repo_id=repo_id, repo_type="model"))
    commit = revision
    ref = os.path.join(repo, "refs", *parts)
    if os.path.isfile(ref):
        with open(ref, "rb") as fh:
            commit = fh.read(256).decode("ascii", "replace").strip()
    snapshots = os.path.join(repo, "snapshots")
    try:
        names = os.listdir(snapshots)
    except OSError:
        return None
    if commit not in names:  # a listed name: never a path built from the ref's content
        return None
    snapshot = os.path.join(snapshots, commit)
    return snapshot if os.path.isdir(snapshot) else None
