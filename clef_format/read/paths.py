"""Path rules shared by every reader: containment by whole components, and member names from indexes.

A path is inside a folder only component by component (``ck-evil/`` is not inside ``ck/``); an
index entry is used as a path only after ``safe_member`` has checked it cannot leave the checkpoint.
"""

from __future__ import annotations

import os
import posixpath


def inside(path: str, base: str) -> bool:
    """Whether ``path`` is ``base`` or below it (both already absolute and normalised)."""
    return path == base or path.startswith(base.rstrip(os.sep) + os.sep)


def safe_member(rel: str) -> str | None:
    """Normalise a path named inside the checkpoint (index or manifest entry); ``None`` if it could leave it.

    Normalising is lexical (``sub/../x`` is ``x``, never resolved through a link): the result is only
    ever looked up among the files the scan listed, so a ``..`` that stays inside leads nowhere else.
    Whether vLLM accepts the string itself is another rule (``spec.layouts.vllm_globs``)."""
    if not isinstance(rel, str) or not rel or "\\" in rel or "\x00" in rel:
        return None
    if rel.startswith("/"):
        return None
    norm = posixpath.normpath(rel)
    if norm.startswith("../") or norm == "..":
        return None
    return norm
