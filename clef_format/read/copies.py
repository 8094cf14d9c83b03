"""Find every Clef copy on the machine: the revisions of a Hugging Face cache and folders under roots.

``clef-format scan`` asks "which of my copies are in which state"; this module only answers "where
are they". A *copy* is a folder holding ``config.json`` and a Clef head (``clef_head/`` or the original
release's root ``joint_head_config.json`` / ``joint_head.safetensors``), or any snapshot of a cached
model repo one of whose snapshots is such a folder (a weights-only pull of a Clef repo lacks the head
and is still a copy of it: the release card's "if you pulled only the weights that day").

The cache is read the way huggingface_hub lays it out (``models--ORG--NAME/{blobs,refs,snapshots}``;
``tests/verify/test_scan.py`` checks every repo, revision, ref and size against huggingface_hub's own
``scan_cache_dir``), but with ``os.scandir`` and ``lstat`` only, and only as deep as telling a Clef repo
needs: ``scan_cache_dir`` stats every file of every repo and aborts on a folder it cannot list, where a
scan must judge only Clef copies and report an unreadable folder as a row.

Never writes, never follows a symlinked folder (so never leaves a root through one, and never enters a
snapshot twice), walks iteratively with a depth and an entry cap (``MAX_DEPTH``, ``MAX_ENTRIES``).
"""

from __future__ import annotations

import os
import stat

from clef_format.records import Record
from clef_format.spec.layouts import CONFIG, HEAD_DIR, RELEASE_HEAD_CONFIG, RELEASE_HEAD_WEIGHTS
from clef_format.spec.workspace_names import is_workspace

#: Deepest folder a root walk enters (a checkpoint sits a few levels below a models folder).
MAX_DEPTH = 32
#: Most directory entries a scan looks at, over all roots (a hostile tree cannot make it walk forever).
MAX_ENTRIES = 1_000_000
#: Folders a root walk never enters: version control and Python caches hold no checkpoint.
SKIP = frozenset({".git", "__pycache__", "node_modules"})
_REPO_PREFIX = "models--"


class Copy(Record):
    """One copy to judge. ``display`` is how commands name it (a path, or ``org/name@commit`` in the
    configured cache); ``unreadable`` is the error of a folder that could not be listed (no copy was
    judged there)."""

    path: str
    display: str
    repo_id: str | None
    revision: str | None
    refs: tuple[str, ...]
    unreadable: str | None


class Walk(Record):
    """What discovery found: the copies, and the caps it hit (a note each)."""

    copies: tuple[Copy, ...]
    limits: tuple[str, ...]


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _names(path: str) -> set[str] | None:
    try:
        return set(os.listdir(path))
    except OSError:
        return None


def has_clef_head(path: str, names: set[str] | None = None) -> bool:
    """A folder with config.json and a Clef head (the split layouts' ``clef_head/``, or the release's files)."""
    names = _names(path) if names is None else names
    if not names or CONFIG not in names:
        return False
    if HEAD_DIR in names and os.path.isdir(os.path.join(path, HEAD_DIR)):
        return True
    return RELEASE_HEAD_CONFIG in names or RELEASE_HEAD_WEIGHTS in names


def repo_id_of(folder_name: str) -> str | None:
    """``models--org--name`` -> ``org/name`` (huggingface_hub's ``repo_folder_name`` reversed); else None."""
    if not folder_name.startswith(_REPO_PREFIX):
        return None
    parts = folder_name[len(_REPO_PREFIX):].split("--")
    return "/".join(parts) if all(parts) else None


def snapshot_identity(path: str) -> tuple[str | None, str]:
    """(repo id, revision folder) of a cached snapshot ``.../models--ORG--NAME/snapshots/<revision>``, read
    where ``path`` resolves; the repo id is ``None`` when its folder names none."""
    real = os.path.realpath(path)
    return repo_id_of(os.path.basename(os.path.dirname(os.path.dirname(real)))), os.path.basename(real)


def _refs(repo: str) -> dict[str, list[str]]:
    """commit -> the ref names pointing at it (``refs/main``, ``refs/pr/1``...), read like huggingface_hub."""
    out: dict[str, list[str]] = {}
    base = os.path.join(repo, "refs")
    stack = [""]
    while stack:
        rel = stack.pop()
        try:
            entries = list(os.scandir(os.path.join(base, rel) if rel else base))
        except OSError:
            continue
        for entry in entries:
            name = f"{rel}/{entry.name}" if rel else entry.name
            if _is_dir(entry):
                stack.append(name)
                continue
            try:
                with open(entry.path, "rb") as fh:
                    commit = fh.read(256).decode("ascii", "replace").strip()
            except OSError:
                continue
            out.setdefault(commit, []).append(name)
    return {commit: sorted(names) for commit, names in out.items()}


def repo_copies(repo: str, configured: bool, seen: set[str]) -> list[Copy]:
    """The copies in one cached model repo: every snapshot, if any snapshot has a Clef head."""
    repo_id = repo_id_of(os.path.basename(repo))
    snapshots = os.path.join(repo, "snapshots")
    try:
        entries = sorted((e for e in os.scandir(snapshots) if _is_dir(e)), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    except OSError as exc:
        return [Copy(snapshots, snapshots, repo_id, None, (), exc.strerror or str(exc))]
    listed = {e.path: _names(e.path) for e in entries}
    if not any(has_clef_head(path, names) for path, names in listed.items() if names is not None):
        if not any(names is None for names in listed.values()):
            return []  # a repo that holds no Clef copy: not ours to judge
    refs = _refs(repo)
    out = []
    for entry in entries:
        real = os.path.realpath(entry.path)
        if real in seen:
            continue
        seen.add(real)
        names = listed[entry.path]
        display = f"{repo_id}@{entry.name}" if configured and repo_id else entry.path
        unreadable = None if names is not None else "the snapshot folder cannot be listed"
        out.append(Copy(entry.path, display, repo_id, entry.name, tuple(refs.get(entry.name, ())), unreadable))
    return out


def cache_copies(cache: str, configured: bool = True) -> Walk:
    """Every Clef copy in a Hugging Face hub cache folder (``configured``: the one ``org/name`` resolves in)."""
    seen: set[str] = set()
    try:
        repos = sorted(e.path for e in os.scandir(cache) if _is_dir(e) and e.name.startswith(_REPO_PREFIX))
    except FileNotFoundError:
        return Walk((), ())
    except OSError as exc:
        return Walk((Copy(cache, cache, None, None, (), exc.strerror or str(exc)),), ())
    copies: list[Copy] = []
    for repo in repos:
        copies.extend(repo_copies(repo, configured, seen))
    return Walk(tuple(copies), ())


def _folder_copy(folder: str) -> Copy:
    """A checkpoint folder found under a root. A cached snapshot given as (or met below) a ROOT keeps its
    repo, revision and refs, as ``repo_copies`` records them: scan names and fixes it as a cached copy."""
    from clef_format.read.hf_cache import is_hf_snapshot

    if not is_hf_snapshot(folder):
        return Copy(folder, folder, None, None, (), None)
    repo_id, revision = snapshot_identity(folder)
    refs = _refs(os.path.dirname(os.path.dirname(os.path.realpath(folder))))
    return Copy(folder, folder, repo_id, revision, tuple(refs.get(revision, ())), None)


def folder_copies(roots: list[str]) -> Walk:
    """Every Clef copy under ``roots``, at any depth up to ``MAX_DEPTH``: checkpoint folders, and the
    snapshots of any cached model repo met on the way. A found checkpoint is not entered further."""
    seen: set[str] = set()
    copies: list[Copy] = []
    limits: list[str] = []
    listed = 0
    for root in roots:
        stack = [(root, 0)]
        while stack:
            folder, depth = stack.pop()
            if repo_id_of(os.path.basename(folder)) and os.path.isdir(os.path.join(folder, "snapshots")):
                copies.extend(repo_copies(folder, False, seen))
                continue
            try:
                with os.scandir(folder) as it:
                    entries = list(it)
            except OSError as exc:
                copies.append(Copy(folder, folder, None, None, (), exc.strerror or str(exc)))
                continue
            listed += len(entries)
            names = {e.name for e in entries}
            if has_clef_head(folder, names):
                real = os.path.realpath(folder)
                if real not in seen:
                    seen.add(real)
                    copies.append(_folder_copy(folder))
                continue
            if listed > MAX_ENTRIES:
                limits.append(f"stopped after {MAX_ENTRIES:,} directory entries under {root}: give a narrower root")
                break
            # a migrate workspace holds an interrupted run's trees (its parked original, its staged work),
            # never a copy: listed, migrate's fix would convert the original
            below = sorted((e.path for e in entries if _is_dir(e) and e.name not in SKIP and not is_workspace(e.name)),
                           reverse=True)
            if below and depth >= MAX_DEPTH:
                limits.append(f"{folder}: not entered below depth {MAX_DEPTH}; scan it as a root to look deeper")
                continue
            stack.extend((p, depth + 1) for p in below)
        if listed > MAX_ENTRIES:
            break
    return Walk(tuple(copies), tuple(limits))


def files_on_disk(path: str) -> dict[tuple[int, int], int]:
    """(st_dev, st_ino) -> bytes of each file a copy holds: a blob or file counted once, as huggingface_hub's
    ``size_on_disk`` of a revision counts the unique blobs its entries point to (and revisions that share
    blobs are counted once in a total)."""
    out: dict[tuple[int, int], int] = {}
    stack = [path]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = list(it)
        except OSError:
            continue
        for entry in entries:
            if _is_dir(entry):
                stack.append(entry.path)
                continue
            try:
                st = os.stat(entry.path)  # a snapshot entry is a link to its blob: the blob's size
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                out[(st.st_dev, st.st_ino)] = st.st_size
    return out
