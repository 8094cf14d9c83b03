"""Find a checkpoint: a directory, or a Hugging Face repo id resolved offline in the local cache.

Never downloads and never writes: huggingface_hub's own ``try_to_load_from_cache`` finds the
snapshot folder for the revision (default ``main``; ``org/name@rev`` picks another).
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
    from huggingface_hub import try_to_load_from_cache  # only for repo ids: keeps the dir path fast

    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache_dir, revision=revision or None)
    if not isinstance(found, str):
        raise PathNotFound(
            f"{path}: no directory of that name, and no cached snapshot of {repo_id}"
            f"{'@' + revision if revision else ''} with a config.json in the Hugging Face cache "
            f"(download it first: hf download {repo_id})")
    return os.path.dirname(found)
