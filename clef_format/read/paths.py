"""Path rules shared by every reader: containment by whole components, member names from indexes, the
one refusal of a path that is not a folder, and of a relative path from a working folder that is gone.

A path is inside a folder only component by component (``ck-evil/`` is not inside ``ck/``); an
index entry is used as a path only after ``safe_member`` has checked it cannot leave the checkpoint.
"""

from __future__ import annotations

import os
import posixpath

from clef_format.errors import CouldNotRun, PathNotFound


def inside(path: str, base: str) -> bool:
    """Whether ``path`` is ``base`` or below it (both already absolute and normalised)."""
    return path == base or path.startswith(base.rstrip(os.sep) + os.sep)


def as_the_kernel_resolves(path: str) -> str:
    """``path`` made absolute the way the kernel resolves it, its last component kept as named: a ``..``
    after a symlink goes up from where the link leads (``L/../out``, L a link to R/sub, is R/out, where
    ``mkdir`` and every other program put it), never lexically (``os.path.abspath`` says ./out)."""
    joined = os.path.join(os.getcwd(), path).rstrip(os.sep) or os.sep
    head, tail = os.path.split(joined)
    if tail in ("", ".", ".."):
        return os.path.realpath(joined)
    return os.path.join(os.path.realpath(head), tail)


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


def not_a_folder(path: str) -> PathNotFound:
    """The refusal of a PATH that exists but is no folder (``verify ck/config.json``), the same for every
    command that takes a checkpoint or a folder to search: it says what the path is, and the fix names the
    folder it lies in (the checkpoint itself when that folder holds a config.json)."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = 0
    kind = ("a file" if stat.S_ISREG(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "neither a file nor a folder")
    parent = os.path.dirname(os.path.abspath(path))
    led = os.path.dirname(os.path.realpath(path))  # a link to ck/config.json lies elsewhere; its target in ck
    if not os.path.isfile(os.path.join(parent, "config.json")) and os.path.isfile(os.path.join(led, "config.json")):
        parent = led
    parent = checkpoint_of_head(led) or parent  # ck/clef_head/joint_head_config.json: the checkpoint is ck
    if os.path.isfile(os.path.join(parent, "config.json")):
        fix = f"give the checkpoint's folder, {parent}, not {kind} in it"
    else:
        fix = f"give a folder (a checkpoint's is the one holding config.json), not {kind}; {path} lies in {parent}"
    return PathNotFound(f"{path} is {kind}, not a folder", fix=fix)


def a_part_of_a_checkpoint(path: str) -> PathNotFound | None:
    """The refusal of a folder that is a part of a checkpoint, not one (``verify ck/clef_head``), else None:
    read as a checkpoint it would be BROKEN for a missing backbone and config, and "download again" would
    not help; the fix names the checkpoint it belongs to."""
    from clef_format.spec.layouts import HEAD_DIR

    checkpoint = checkpoint_of_head(os.path.realpath(path))  # a link to ck/clef_head is the same folder
    if checkpoint is None:
        return None
    return PathNotFound(f"{path} is the {HEAD_DIR} folder of the checkpoint {checkpoint}, not a checkpoint",
                        fix=f"give the checkpoint's folder, {checkpoint}")


def checkpoint_of_head(folder: str) -> str | None:
    """The checkpoint whose ``clef_head/`` ``folder`` (absolute, resolved) is, else None."""
    from clef_format.spec.layouts import HEAD_DIR

    parent = os.path.dirname(folder)
    if os.path.basename(folder) != HEAD_DIR or os.path.lexists(os.path.join(folder, "config.json")):
        return None
    return parent if os.path.isfile(os.path.join(parent, "config.json")) else None


def cwd_gone(paths: list[str]) -> CouldNotRun | None:
    """The refusal of relative ``paths`` when the working folder no longer exists (deleted, or replaced by
    a new folder at its path: ``migrate .`` from inside the checkpoint does that), else None: nothing
    relative can be resolved then, and every command says so the same way (``unreadable``, as the OS
    does) instead of failing inside the first call that needs it."""
    relative = [p for p in paths if p and not os.path.isabs(p)]
    if not relative:
        return None
    try:
        os.getcwd()
    except FileNotFoundError:
        return CouldNotRun(f"{relative[0]}: the current folder no longer exists (deleted, or replaced by a new "
                           "folder at its path), so a relative path cannot be resolved", code="unreadable",
                           fix='cd "$PWD" to enter the folder now at that path, or give an absolute path')
    return None
