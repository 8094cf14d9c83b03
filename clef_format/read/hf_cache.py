"""Everything clef-format knows about Hugging Face's on-disk layouts, in one place.

- the cache: ``models--ORG--NAME/{blobs,refs,snapshots}``; a repo id is found offline in it
  (``locate_checkpoint``, ``cached_snapshot``), a snapshot's entries are symlinks to ``blobs/<etag>``;
- unfinished downloads: ``blobs/<etag>.incomplete``, or ``.cache/huggingface/download/*.incomplete``
  in a ``snapshot_download(local_dir=...)`` folder, whose ``<path>.metadata`` files hold each etag;
- what an etag is: the sha256 of an LFS file, the git blob sha1 of a small one.

Never downloads and never writes.
"""

from __future__ import annotations

import os
import re
import stat

from clef_format.errors import PathNotFound
from clef_format.read.walk import walk

# Patterns are compiled on first use (re caches them): verify of a plain folder needs few of them.
_SHA256 = r"^[0-9a-f]{64}$"
_SHA1 = r"^[0-9a-f]{40}$"
#: Where ``snapshot_download(local_dir=...)`` keeps its per-file metadata and unfinished downloads.
LOCAL_DIR_DOWNLOAD = ".cache/huggingface/download"
#: Largest ``.metadata`` file read (the real ones are ~100 bytes).
_MAX_METADATA = 4096
_MAX_LISTED = 10_000  # a hostile blob store cannot make verify walk forever
_REPO_ID = r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$"


#: The fix of a PATH that names nothing, for every command that takes a checkpoint.
NOT_FOUND_FIX = ("give the checkpoint's directory, or org/name[@revision] of a download in the Hugging Face cache "
                 "(clef-format scan lists the copies it finds)")


def locate_checkpoint(path: str, cache_dir: str | None = None) -> str:
    """The directory ``path`` names: a folder, or the cached snapshot of ``org/name[@revision]``."""
    if os.path.isdir(path):
        from clef_format.read.paths import a_part_of_a_checkpoint

        refused = a_part_of_a_checkpoint(path)
        if refused is not None:
            raise refused
        return path
    if os.path.exists(path):
        from clef_format.read.paths import not_a_folder

        raise not_a_folder(path)
    try:
        os.stat(path)
    except PermissionError as exc:  # there, or maybe there, but not ours to look at: not "no such directory"
        from clef_format.errors import CouldNotRun

        raise CouldNotRun(f"{path}: {exc.strerror}", code="unreadable",
                          fix="check the permissions of the path and its parent folders (run as a user who can "
                              "read them)") from None
    except OSError:
        pass
    if not re.match(_REPO_ID, path):
        raise PathNotFound(f"{path}: no such directory", fix=NOT_FOUND_FIX)
    repo_id, _, revision = path.partition("@")
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)  # huggingface_hub's own rule: what it refuses is no cached repo either
    except HFValidationError as exc:
        raise PathNotFound(f"{path}: no such directory, nor a Hugging Face repo id ({exc})", fix=NOT_FOUND_FIX) from None
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


_REPO_DIR_RE = r"^(models|datasets|spaces)--.+$"
_CACHE_PARTS = ("snapshots", "blobs", "refs")


def _resolved(path: str) -> str:
    """Where ``path`` really is: symlinks followed, for a path that may not exist yet (its nearest
    existing parent is resolved, the rest appended)."""
    path = os.path.abspath(path)
    rest: list[str] = []
    while not os.path.lexists(path):
        head, tail = os.path.split(path)
        if head == path:
            break
        rest.insert(0, tail)
        path = head
    return os.path.join(os.path.realpath(path), *rest)


def hub_cache() -> str:
    """The hub cache folder ``org/name`` resolves in (huggingface_hub's own ``HF_HUB_CACHE``)."""
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def cache_roots() -> list[str]:
    """The Hugging Face hub cache folders configured here (env vars as huggingface_hub reads them),
    resolved; read without importing huggingface_hub."""
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface")
    roots = [env.get("HF_HUB_CACHE"), env.get("HUGGINGFACE_HUB_CACHE"), os.path.join(home, "hub")]
    return sorted({os.path.realpath(r) for r in roots if r})


def _is_repo_dir(path: str) -> bool:
    return bool(re.match(_REPO_DIR_RE, os.path.basename(path))) and any(
        os.path.isdir(os.path.join(path, part)) for part in _CACHE_PARTS)


def cache_area(path: str) -> str | None:
    """The part of a Hugging Face cache that ``path`` lies in, or ``None``: the one boundary.

    Decided on resolved paths: ``path`` as given and where it resolves (symlinks followed), and
    every parent of each. Returns ``"snapshot"``, ``"blobs"``, ``"refs"``, ``"repo"`` (a
    ``models--ORG--NAME`` folder itself or another entry in it) or ``"cache"`` (the cache root or
    anything else under it). Nothing in that area may ever be written.
    """
    from clef_format.read.paths import inside

    roots = cache_roots()
    for candidate in dict.fromkeys((os.path.normpath(os.path.abspath(path)), _resolved(path))):
        probe = candidate
        below: list[str] = []
        while True:
            if _is_repo_dir(probe):
                if not below:
                    return "repo"
                return {"snapshots": "snapshot", "blobs": "blobs", "refs": "refs"}.get(below[0], "repo")
            head, tail = os.path.split(probe)
            if head == probe:
                break
            below.insert(0, tail)
            probe = head
        if any(inside(candidate, r) for r in roots):
            return "cache"
    return None


def in_hf_cache(path: str) -> bool:
    """Whether ``path`` (or where it resolves, or any parent) is inside a Hugging Face cache."""
    return cache_area(path) is not None


def is_hf_snapshot(root: str) -> bool:
    """A folder ``.../models--ORG--NAME/snapshots/<revision>`` of a Hugging Face cache, decided where
    ``root`` resolves: a symlink to a snapshot is the snapshot it is."""
    real = os.path.realpath(root)
    parent = os.path.dirname(real)
    return os.path.basename(parent) == "snapshots" and _is_repo_dir(os.path.dirname(parent))


def blobs_dir(root: str) -> str:
    """The ``blobs/`` folder of the repository a snapshot belongs to (``root`` resolved)."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(root))), "blobs")


def etag_digest(etag: str) -> tuple[str, str] | None:
    """(algorithm, digest) an etag stands for: sha256 for LFS files, git-sha1 for small ones."""
    etag = etag.strip().strip('"').lower()
    if re.match(_SHA256, etag):
        return "sha256", etag
    if re.match(_SHA1, etag):
        return "git-sha1", etag
    return None


def snapshot_blob(root: str, full: str) -> str | None:
    """The blob a snapshot entry links to, when it is a file directly in this repo's ``blobs/``."""
    if not os.path.islink(full):
        return None
    target = os.path.realpath(full)
    return target if os.path.dirname(target) == os.path.realpath(blobs_dir(root)) else None


def local_dir_metadata(root: str, rel: str) -> str:
    """Where ``snapshot_download(local_dir=...)`` keeps the metadata of ``rel`` (whether or not it exists)."""
    return os.path.join(root, *f"{LOCAL_DIR_DOWNLOAD}/{rel}.metadata".split("/"))


def local_dir_etag(root: str, rel: str) -> str | None:
    """The etag ``snapshot_download(local_dir=...)`` recorded for ``rel``, if its metadata is present and sane.

    None when there is no metadata file (or it lies outside the checkpoint, or is not a regular file).
    Raises ``OSError`` whose ``filename`` (relative to ``root``) is the metadata file, or the folder on
    its way that cannot be searched, when the metadata may exist but cannot be read: nothing may be
    said about a file whose reference was never seen.
    """
    from clef_format.read.paths import inside

    meta_rel = f"{LOCAL_DIR_DOWNLOAD}/{rel}.metadata"
    meta = os.path.join(root, *meta_rel.split("/"))
    if not inside(os.path.realpath(meta), os.path.realpath(root)):
        return None
    try:
        st = os.stat(meta)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, _blocking_folder(root, meta_rel)) from None
    if not stat.S_ISREG(st.st_mode):
        return None
    try:
        with open(meta, "rb") as fh:
            lines = fh.read(_MAX_METADATA).decode("utf-8", "replace").splitlines()
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, meta_rel) from None
    return lines[1] if len(lines) >= 2 else None


def _blocking_folder(root: str, rel: str) -> str:
    """The first folder on the way to ``rel`` whose entries cannot be looked up (else ``rel`` itself)."""
    parts = rel.split("/")
    for i in range(1, len(parts)):
        try:
            os.lstat(os.path.join(root, *parts[:i + 1]))
        except PermissionError:
            return "/".join(parts[:i])
        except OSError:
            break
    return rel


def incomplete_downloads(folder: str, recursive: bool) -> list[str]:
    """Names of ``*.incomplete`` files under ``folder`` (relative, sorted); only names are listed."""
    out: list[str] = []
    seen = 0
    for dirpath, dirnames, filenames in walk(folder):  # iterative, depth-limited: a deep tree is no RecursionError
        if not recursive:
            dirnames[:] = []
        for name in filenames:
            seen += 1
            if name.endswith(".incomplete"):
                out.append(os.path.relpath(os.path.join(dirpath, name), folder).replace(os.sep, "/"))
        if seen > _MAX_LISTED:
            break
    return sorted(out)
