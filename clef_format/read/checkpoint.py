"""Read a checkpoint's structure: files, configs and safetensors headers. No tensor data, no torch.

``read_checkpoint`` does all the reading once and returns a ``Checkpoint`` that every check
works from, plus the findings that reading itself produced (unreadable headers, unsafe files,
paths that leave the checkpoint). Nothing outside the checkpoint is ever opened: symlinks are
followed only when they stay inside it (or, in a Hugging Face cache snapshot, inside the
repository's ``blobs/``), and index entries are never used as paths before they are checked.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any

from clef_format.read.hf_cache import blobs_dir, is_hf_snapshot
from clef_format.read.paths import inside, safe_member
from clef_format.read.safetensors import Header, HeaderError, TensorInfo, read_header
from clef_format.read.walk import MAX_DEPTH, walk
from clef_format.spec import layouts as L
from clef_format.spec.findings import Finding, error, warning
from clef_format.spec.layouts import Layout, LayoutFacts
from clef_format.spec.model_spec import ConfigError, ModelConfig, parse_config, table_names

#: Largest JSON config read (the real ones are a few KB; the index is ~100 KB).
MAX_JSON_BYTES = 16 * 1024 * 1024
#: Pickle-based weight files: never loaded, always reported.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
SKIP_DIRS = {".git", ".cache"}
#: Entries the backbone index may hold (the 9B's has ~1,300, the largest published MoE checkpoints
#: under 200,000): more is refused before the JSON is parsed (docs/SECURITY.md).
MAX_INDEX_ENTRIES = 200_000


class Checkpoint:
    """Everything verify knows about a checkpoint after reading its structure.

    ``root`` is a plain string path (``pathlib`` stays off the fast path); ``path(rel)`` joins.
    ``name`` is what a printed command calls the checkpoint (``shell.quote_path`` quotes it): the PATH
    the user gave (a folder as typed, or ``org/name[@revision]``), or for a tree migrate staged the folder
    it becomes (the ``--output`` as typed, or the source); ``root`` when nothing else was given.
    """

    def __init__(self, root: str, name: str | None = None) -> None:
        self.root = root
        self.name = root if name is None else name
        self.hf_snapshot = False
        self.files: dict[str, int] = {}  # readable regular files: rel path -> size
        self.headers: dict[str, Header] = {}  # valid safetensors headers
        self.bad_headers: set[str] = set()
        self.unreadable: set[str] = set()  # files or folders that could not be read or listed
        self.special: set[str] = set()  # FIFOs, sockets, devices: reported (special-file), never opened
        self.escaped: set[str] = set()  # symlinks leading outside the checkpoint: reported (path-escape), never read
        self.parsed: set[str] = set()  # files whose content the reader opened (JSON configs, headers)
        #: The file whose content decides the layout but could not be read as JSON (the backbone index,
        #: or the head config with its marker, when not valid JSON, empty, a directory...): then no layout
        #: is asserted and only the reading findings are reported (``verify.run.verify_checkpoint``, the
        #: gate). A key written twice is read on as Python reads it: that content was read. ``None``: none.
        self.layout_unread: str | None = None
        self.config: dict[str, Any] | None = None
        self.model: ModelConfig | None = None
        self.head_config: dict[str, Any] | None = None
        #: The bytes of joint_schema_model.py (read, never run), at most ``MAX_SOURCE_BYTES`` + 1 of them
        #: (one more tells a file over the limit); ``None`` when absent or unreadable.
        self.head_code: bytes | None = None
        self.backbone_files: list[str] = []
        self.backbone: dict[str, TensorInfo] = {}
        self.tensor_file: dict[str, str] = {}
        self.layout: Layout = Layout.UNKNOWN
        self.findings: list[Finding] = []

    def path(self, rel: str) -> str:
        return os.path.join(self.root, *rel.split("/"))

    def reported(self, rel: str) -> bool:
        """Whether ``rel`` is there but was never read, a reading finding saying why (a symlink out of the
        checkpoint, a FIFO or device): a check that finds it absent must not call it missing."""
        return rel in self.escaped or rel in self.special

    def has(self, rel: str) -> bool:
        return rel in self.files

    @property
    def tables(self) -> tuple[str, str]:
        """HF names of (embed_tokens, lm_head) for this checkpoint's config."""
        return table_names(self.model) if self.model else (L.EMBED_TOKENS, L.LM_HEAD)


def _escape_target(link: str, allowed: list[str]) -> str | None:
    """Where a symlink resolves, if that is outside every allowed folder; ``None`` when it stays inside."""
    target = os.path.realpath(link)
    return None if any(inside(target, a) for a in allowed) else target


_UNREADABLE_FIX = "make it readable (chmod / chown), or run as a user who can read the whole checkpoint"


def _unreadable(ck: Checkpoint, rel: str, what: str, exc: OSError) -> None:
    """Record a file or folder that could not be read: a statement about access, never about content."""
    ck.unreadable.add(rel)
    ck.findings.append(error("unreadable", f"{rel} {what}: {exc.strerror or exc}", file=rel, fix=_UNREADABLE_FIX))


_BLOCKS = "an engine opening it would block forever, waiting for a writer"
_NOT_A_FILE = "an engine would fail to open it or read bytes that are not the file"


def _special_kind(mode: int) -> tuple[str, str] | None:
    """What a non-regular, non-directory entry is and what an engine would do with it; ``None`` for a directory."""
    for test, kind, effect in ((stat.S_ISFIFO, "a FIFO (named pipe)", _BLOCKS), (stat.S_ISSOCK, "a socket", _NOT_A_FILE),
                               (stat.S_ISCHR, "a character device", _NOT_A_FILE),
                               (stat.S_ISBLK, "a block device", _NOT_A_FILE)):
        if test(mode):
            return kind, effect
    return None if stat.S_ISDIR(mode) else ("a special file", _NOT_A_FILE)


def _scan_files(ck: Checkpoint) -> None:
    root_real = os.path.realpath(ck.root)

    def unlistable(exc: OSError) -> None:
        rel = os.path.relpath(exc.filename, ck.root).replace(os.sep, "/") if exc.filename else "."
        _unreadable(ck, rel, "cannot be listed", exc)

    allowed = [root_real]
    if ck.hf_snapshot:
        allowed.append(os.path.realpath(blobs_dir(ck.root)))
    def too_deep(path: str) -> None:
        rel = os.path.relpath(path, ck.root).replace(os.sep, "/")
        ck.findings.append(error(
            "tree-too-deep", f"{rel.split('/', 1)[0]}/... nests more than {MAX_DEPTH} folders deep; "
            f"not read below {MAX_DEPTH} levels", file=rel,
            fix="remove the deeply nested folders: a checkpoint nests a few levels at most"))

    for dirpath, dirnames, filenames in walk(ck.root, onerror=unlistable, too_deep=too_deep):
        rel_dir = os.path.relpath(dirpath, ck.root)
        keep = []
        for d in sorted(dirnames):
            full = os.path.join(dirpath, d)
            rel = os.path.normpath(os.path.join(rel_dir, d)).replace(os.sep, "/")
            if d in SKIP_DIRS and rel_dir == ".":
                continue
            if os.path.islink(full):
                target = _escape_target(full, allowed)
                if target is not None:
                    ck.findings.append(error(
                        "path-escape", f"directory symlink {rel} leads outside the checkpoint (to {target}); not followed",
                        file=rel, fix="replace the symlink with the directory it should contain"))
                else:
                    ck.findings.append(warning(
                        "path-escape", f"directory symlink {rel} is not followed", file=rel,
                        fix="replace the symlink with a real directory"))
                continue
            keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            rel = os.path.normpath(os.path.join(rel_dir, name)).replace(os.sep, "/")
            if os.path.islink(full):
                target = _escape_target(full, allowed)
                if target is not None:
                    ck.findings.append(error(
                        "path-escape", f"{rel} is a symlink leading outside the checkpoint (to {target}); never read",
                        file=rel, fix="replace the symlink with the real file"))
                    ck.escaped.add(rel)
                    continue
            try:
                st = os.stat(full)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):  # a link to nothing: the file is missing
                    ck.findings.append(error("missing-file", f"{rel} is a broken symlink: {exc.strerror}", file=rel,
                                             fix="restore the file (re-download it)"))
                else:
                    _unreadable(ck, rel, "cannot be read", exc)
                continue
            if not stat.S_ISREG(st.st_mode):  # the type before the name: a FIFO named x.bin is no pickle
                special = _special_kind(st.st_mode)
                if special is not None:  # never opened: opening a FIFO blocks until a writer comes
                    ck.special.add(rel)
                    ck.findings.append(error(
                        "special-file", f"{rel} is {special[0]}, not a regular file: {special[1]}; never opened here",
                        file=rel, fix=f"replace {rel} with the real file (re-download it), or delete it"))
                continue
            if name.endswith(".incomplete"):
                ck.findings.append(error(
                    "partial-download", f"{rel} is an unfinished download", file=rel,
                    fix="re-run the download (huggingface-cli download / snapshot_download) to finish it"))
                continue
            if name.lower().endswith(PICKLE_SUFFIXES):  # x.PT, model.Bin: torch.load reads them alike
                ck.findings.append(error(
                    "unsafe-file", f"{rel} is a pickle-based weight file; clef-format never loads it", file=rel,
                    fix="delete it: Clef checkpoints ship safetensors only"))
                continue
            ck.files[rel] = st.st_size


def _read_json(ck: Checkpoint, rel: str, max_entries: int | None = None) -> Any:
    """Parse a JSON file of the checkpoint; a finding (and ``None``) when it is not usable.

    ``max_entries`` bounds the string pairs (``"key": "value"``) the file may hold, counted in its bytes
    before parsing: every pair needs four literal '"' (an escaped one only adds to the count)."""
    size = ck.files[rel]
    if size > MAX_JSON_BYTES:
        ck.findings.append(error("bad-config", f"{rel} is {size} bytes, over the {MAX_JSON_BYTES} limit; not read",
                                 file=rel, fix="restore the file from the original download"))
        return None
    ck.parsed.add(rel)
    try:
        with open(ck.path(rel), "rb") as fh:
            data = fh.read()
    except OSError as exc:
        _unreadable(ck, rel, "cannot be read", exc)
        return None
    pairs = data.count(b'"') // 4
    if max_entries is not None and pairs > max_entries:
        ck.findings.append(error("bad-config", f"{rel} holds up to {pairs} entries, over the limit of {max_entries}; "
                                 "not read", file=rel, fix="restore the file from the original download"))
        return None
    try:
        equal: list[str] = []
        obj = loads_unique(data, equal)
        for key in sorted(set(equal)):
            ck.findings.append(warning(
                "bad-config", f"{rel} holds the key {key!r} twice with the same value: every loader reads that value, "
                "but a strict JSON reader (one that refuses a field written twice) would refuse the file",
                file=rel, fix=f"keep one {key!r} in {rel}"))
        return obj
    except DuplicateKey as exc:
        ck.findings.append(error("bad-config", duplicate_key_message(rel, exc.key), file=rel,
                                 fix=f"keep one {exc.key!r} in {rel} (restore the file from the original download)"))
        return json.loads(data.decode("utf-8"))  # read on as Python does: the error above already refuses it
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        ck.findings.append(error("bad-config", f"{rel} is not valid JSON: {exc}", file=rel,
                                 fix="restore the file from the original download"))
        return None


class DuplicateKey(ValueError):
    """A JSON object holds one key twice, with different values."""

    def __init__(self, key: str) -> None:
        super().__init__(f"duplicate key {key!r}")
        self.key = key


def _same_json(a: Any, b: Any) -> bool:
    """Equal as JSON text (``1``, ``1.0`` and ``true`` differ, as they do to a typed config class)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _unique_keys(pairs: list[tuple[str, Any]], equal: list[str] | None = None) -> dict[str, Any]:
    """``object_pairs_hook`` refusing a key written twice with different values (as the safetensors header
    reader does); one written twice with the same value is appended to ``equal`` when given (every
    reader agrees on it), else refused too."""
    out = dict(pairs)
    if len(out) != len(pairs):
        first: dict[str, Any] = {}
        for key, value in pairs:
            if key in first:
                if equal is None or not _same_json(first[key], value):
                    raise DuplicateKey(key)
                equal.append(key)
            else:
                first[key] = value
    return out


def loads_unique(data: bytes, equal: list[str] | None = None) -> Any:
    """The one JSON parser for every JSON file of a checkpoint (configs, index, head config, manifest):
    UTF-8, and a key written twice raises ``DuplicateKey`` (a ``ValueError``) instead of the last one
    silently winning, unless ``equal`` is given and the values are the same: the key is appended
    there (the reader's note). Raises ``UnicodeDecodeError`` / ``ValueError`` / ``RecursionError`` on bad input."""
    if equal is None:
        return json.loads(data.decode("utf-8"), object_pairs_hook=_unique_keys)
    return json.loads(data.decode("utf-8"), object_pairs_hook=lambda pairs: _unique_keys(pairs, equal))


def duplicate_key_message(rel: str, key: str) -> str:
    return (f"{rel} holds the key {key!r} twice: JSON readers disagree on which one counts (Python's keeps the "
            "last, others the first)")


def _read_headers(ck: Checkpoint) -> None:
    for rel in ck.files:
        if not rel.endswith(".safetensors"):
            continue
        try:
            ck.headers[rel] = read_header(ck.path(rel))
        except HeaderError as exc:
            ck.bad_headers.add(rel)
            ck.findings.append(error("bad-header", f"{rel}: {exc}", file=rel,
                                     fix="re-download this file; a truncated or corrupted download looks like this"))
        except OSError as exc:
            ck.bad_headers.add(rel)
            _unreadable(ck, rel, "cannot be read", exc)




def _read_backbone(ck: Checkpoint) -> None:
    if ck.has(L.BACKBONE_INDEX):
        index = _read_json(ck, L.BACKBONE_INDEX, MAX_INDEX_ENTRIES)
        if index is None:
            ck.layout_unread = L.BACKBONE_INDEX  # the backbone is whatever the index names: not known
            return
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            ck.findings.append(error("bad-config", f"{L.BACKBONE_INDEX} has no weight_map of tensor -> file",
                                     file=L.BACKBONE_INDEX, fix="restore the file from the original download"))
            ck.layout_unread = L.BACKBONE_INDEX
            return
        shards: dict[str, str] = {}
        for value in sorted(set(weight_map.values())):
            member = safe_member(value)
            if member is None:
                ck.findings.append(error("path-escape", f"index entry {value!r} leads outside the checkpoint; never read",
                                         file=L.BACKBONE_INDEX, fix="restore the index from the original download"))
                continue
            if not L.vllm_globs(value):
                names = sorted(n for n, v in weight_map.items() if v == value)
                plain = member.rsplit("/", 1)[-1]
                move = "" if member == plain else f" and move {member} to the checkpoint's top level"
                ck.findings.append(error(
                    "index-mismatch", f"index entry {value!r} (for {names[0]}" + (
                        f" and {len(names) - 1} more tensor(s)" if len(names) > 1 else "") + "): vLLM refuses to "
                    "load the checkpoint: it compares os.path.join(folder, entry) with the top-level *.safetensors "
                    "files it globbed, as strings, and this entry is no plain, non-hidden top-level .safetensors "
                    "file name (FileNotFoundError: Weight files referenced in index but missing)",
                    file=L.BACKBONE_INDEX, tensor=names[0],
                    fix=f"write the plain file name {plain!r} for these entries in {L.BACKBONE_INDEX}{move}"))
            if member not in ck.files:
                if member not in ck.bad_headers:
                    ck.findings.append(error("missing-file", f"shard {member} named by the index is missing",
                                             file=member, fix="re-download the missing shard"))
            else:
                shards[value] = member
        ck.backbone_files = sorted(set(shards.values()))
        # vLLM reads every tensor of every file the index names, whatever entry maps it: an entry that
        # is missing or names another indexed file changes nothing it loads (a note); an entry for a
        # tensor no indexed file holds is an error (loaders that follow the index look for it)
        stored = {n for m in ck.backbone_files for n in (ck.headers[m].tensors if m in ck.headers else ())}
        note = ("vLLM loads it anyway (it reads every tensor of every file the index names), but transformers' "
                "from_pretrained lists the checkpoint's keys from the index entries and may report it missing")
        for name, value in weight_map.items():
            member = shards.get(value)
            header = ck.headers.get(member) if member else None
            if header is not None and name not in header.tensors:
                if name in stored:
                    continue  # reported below, once, where it is stored
                ck.findings.append(error("index-mismatch", f"index maps {name} to {member}, whose header lacks it, "
                                         "and no file the index names holds it: a loader that follows the index "
                                         "fails on it", file=member, tensor=name,
                                         fix="re-download the shard and the index"))
        for member in ck.backbone_files:
            header = ck.headers.get(member)
            for name in header.tensors if header else ():
                if weight_map.get(name) is not None and shards.get(weight_map[name]) != member:
                    ck.findings.append(warning("index-mismatch", f"{name} is in {member} but the index maps it to "
                                               f"{weight_map[name]}: {note}", file=member, tensor=name,
                                               fix="re-download the index"))
                elif name not in weight_map:
                    ck.findings.append(warning("index-mismatch", f"{name} is in {member} but not in the index: {note}",
                                               file=member, tensor=name, fix="re-download the index"))
    elif ck.has(L.BACKBONE_SINGLE) or L.BACKBONE_SINGLE in ck.bad_headers:
        ck.backbone_files = [L.BACKBONE_SINGLE]
    else:
        shards_found = sorted(f for f in ck.files if re.fullmatch(r"model-\d+-of-\d+\.safetensors", f))
        if shards_found:
            ck.findings.append(error("missing-file", f"{len(shards_found)} backbone shards but no {L.BACKBONE_INDEX}",
                                     file=L.BACKBONE_INDEX, fix="re-download model.safetensors.index.json"))
            ck.backbone_files = shards_found
    for member in ck.backbone_files:
        header = ck.headers.get(member)
        if header is None:
            continue
        for name, info in header.tensors.items():
            if name in ck.backbone:
                ck.findings.append(error("index-mismatch", f"{name} is stored in both {ck.tensor_file[name]} and {member}",
                                         file=member, tensor=name, fix="re-download the backbone shards"))
                continue
            ck.backbone[name] = info
            ck.tensor_file[name] = member


def _check_readable(ck: Checkpoint) -> None:
    """Every listed file the reader did not open (tokenizer files, joint_schema_model.py, ...) is opened
    and closed, nothing read: one that cannot be opened is ``unreadable`` (exit 2), as it would be for
    the engine that loads it. No content is read, so the structure path stays a few syscalls per file."""
    for rel in ck.files:
        if rel in ck.parsed or rel in ck.headers or rel in ck.bad_headers or rel in ck.unreadable:
            continue
        try:
            os.close(os.open(ck.path(rel), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)))
        except OSError as exc:
            _unreadable(ck, rel, "cannot be read", exc)


def _read_head_code(ck: Checkpoint) -> bytes | None:
    """joint_schema_model.py's bytes, for the head check's static reader (``spec.head_reference``)."""
    from clef_format.spec.head_reference import MAX_SOURCE_BYTES

    try:
        with open(ck.path(L.HEAD_CODE), "rb") as fh:
            data = fh.read(MAX_SOURCE_BYTES + 1)
    except OSError as exc:
        _unreadable(ck, L.HEAD_CODE, "cannot be read", exc)
        return None
    ck.parsed.add(L.HEAD_CODE)
    return data


def _marker_present(head_config: Any) -> bool:
    return isinstance(head_config, dict) and L.MARKER_KEY in head_config


def read_checkpoint(root: str | os.PathLike[str], name: str | None = None) -> Checkpoint:
    """Read files, configs and headers once; detect the layout. Never raises on bad content.
    ``name``: what printed commands call it (``Checkpoint.name``; default ``root``)."""
    ck = Checkpoint(os.fspath(root), name)
    ck.hf_snapshot = is_hf_snapshot(ck.root)
    _scan_files(ck)
    _read_headers(ck)
    if ck.has(L.CONFIG):
        ck.config = _read_json(ck, L.CONFIG)
        if ck.config is not None:
            try:
                ck.model = parse_config(ck.config)
            except ConfigError as exc:
                ck.findings.append(error("bad-config", str(exc), file=L.CONFIG,
                                         fix="restore config.json from the original download"))
    _read_backbone(ck)
    head_cfg_rel = L.HEAD_CONFIG if ck.has(L.HEAD_CONFIG) else (L.RELEASE_HEAD_CONFIG if ck.has(L.RELEASE_HEAD_CONFIG) else None)
    if head_cfg_rel:
        seen = len(ck.findings)
        ck.head_config = _read_json(ck, head_cfg_rel)
        if len(ck.findings) == seen and not isinstance(ck.head_config, dict):  # [], null, "x": read, but no
            shown = json.dumps(ck.head_config)  # config, marker or not
            ck.findings.append(error("bad-config", f"{head_cfg_rel} is not a JSON object: it holds "
                                     f"{shown if len(shown) <= 40 else shown[:37] + '...'}", file=head_cfg_rel,
                                     fix="restore the file from the original download"))
            ck.head_config = None
    elif os.path.lexists(ck.path(L.HEAD_CONFIG)) and not any(f.file == L.HEAD_CONFIG for f in ck.findings):
        ck.findings.append(error("missing-file", f"{L.HEAD_CONFIG} is not a regular file (a directory or another "
                                 "kind of entry is in its place)", file=L.HEAD_CONFIG,
                                 fix="restore the file from the original download"))
    marker_unread = ck.head_config is None and any(f.file == L.HEAD_CONFIG for f in ck.findings)
    if marker_unread:  # there, but never read: whether it holds the marker is not known
        ck.layout_unread = ck.layout_unread or L.HEAD_CONFIG
    if ck.has(L.HEAD_CODE):
        ck.head_code = _read_head_code(ck)
    _check_readable(ck)
    embed, lm_head = ck.tables
    facts = LayoutFacts(
        has_backbone=bool(ck.backbone_files),
        has_release_head=ck.has(L.RELEASE_HEAD_WEIGHTS),
        has_clef_head=any(f.startswith(L.HEAD_DIR + "/") for f in ck.files) or L.TABLES in ck.bad_headers,
        tables_in_backbone=embed in ck.backbone or lm_head in ck.backbone,
        has_tables_file=ck.has(L.TABLES) or L.TABLES in ck.bad_headers,
        has_marker=None if marker_unread else _marker_present(ck.head_config),
    )
    ck.layout = L.detect_layout(facts)
    return ck


def open_checkpoint(source: str | os.PathLike[str] | Checkpoint) -> Checkpoint:
    """The one way to open a checkpoint: a directory, a repo id in the local Hugging Face cache, or one
    already read (returned as it is). Raises ``PathNotFound`` when there is no such checkpoint."""
    if isinstance(source, Checkpoint):
        return source
    from clef_format.read.hf_cache import locate_checkpoint

    name = os.fspath(source)
    return read_checkpoint(locate_checkpoint(name), name)
