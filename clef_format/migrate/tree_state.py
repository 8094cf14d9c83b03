"""What a checkpoint tree is at one instant, to prove before the swap that nothing changed since.

Migrate stages a new tree while anything else may still write the source (an editor's save, a
copy, ``clef-format manifest`` from another shell). The swap then throws the old tree away, so a
change made meanwhile would be lost without a word. ``snapshot`` records every entry's identity
(type and mode, device, inode, size, mtime_ns, ctime_ns, owner) and every folder's listing;
``changes`` names what differs. ``ctime_ns`` is left out for files migrate itself hard-links into
the staged tree (a new link sets the inode's ctime): for those the inode is the file, so an edit of
its bytes or mode shows in size, mtime or mode, and a replacement in its inode.

Cost: one ``lstat`` per entry and one listing per folder, twice per step (about 50 ms per state
of 1,000 entries, docs/MIGRATION.md).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass

#: (st_mode, st_dev, st_ino, st_size, st_mtime_ns, st_ctime_ns, st_uid, st_gid)
Identity = tuple[int, int, int, int, int, int, int, int]


@dataclass(frozen=True)
class TreeState:
    """Every entry under ``root`` (rel path -> identity; ``"."`` is the root) and every folder's listing."""

    root: str
    entries: dict[str, Identity]
    listings: dict[str, tuple[str, ...]]


def identity(st: os.stat_result) -> Identity:
    """What ``changes`` compares of one entry (its ``lstat``)."""
    return (st.st_mode, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_uid, st.st_gid)


def snapshot(root: str, skip_top: frozenset[str] = frozenset()) -> TreeState:
    """The state of the tree at ``root`` (symlinks recorded, never followed; top-level names in
    ``skip_top`` left out: out of place, ``.cache`` is not carried). Raises ``OSError`` when an entry
    cannot be looked at (one that vanished while the tree was read included): a state is never
    guessed. ``root`` is resolved first: a symlink to the
    checkpoint is the folder it leads to, whichever of the two names a caller holds."""
    from clef_format.migrate.fsutil import TreeTooDeep
    from clef_format.read.walk import MAX_DEPTH

    root = os.path.realpath(root)
    entries: dict[str, Identity] = {".": identity(os.lstat(root))}
    listings: dict[str, tuple[str, ...]] = {}
    stack = [(root, "", 0)]  # iterative: a folder nested ~1,000 deep is a finding, never a RecursionError
    while stack:
        path, rel, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise TreeTooDeep(path, root)
        names = sorted(os.listdir(path))
        if not rel:
            names = [n for n in names if n not in skip_top]
        listings[rel or "."] = tuple(names)
        for name in reversed(names):
            child_rel = f"{rel}/{name}" if rel else name
            child = os.path.join(path, name)
            st = os.lstat(child)
            entries[child_rel] = identity(st)
            if stat.S_ISDIR(st.st_mode):
                stack.append((child, child_rel, depth + 1))
    return TreeState(root, entries, listings)


def changes(before: TreeState, after: TreeState, linked: frozenset[str] = frozenset()) -> list[str]:
    """What differs between two states of one tree, in words, sorted (empty: nothing changed).
    ``linked``: files hard-linked by migrate itself, whose ctime it changed."""
    out: list[str] = []
    for rel in sorted(set(before.entries) | set(after.entries)):
        old, new = before.entries.get(rel), after.entries.get(rel)
        if old is None:
            out.append(f"{rel} was created")
        elif new is None:
            out.append(f"{rel} was removed")
        elif old != new:
            if rel in linked and old[:5] + old[6:] == new[:5] + new[6:]:
                continue
            if old[1] != new[1]:
                out.append(f"{rel} is now on another filesystem (a mount)")
            elif stat.S_IFMT(old[0]) != stat.S_IFMT(new[0]) or old[2] != new[2]:
                out.append(f"{rel} was replaced")
            elif old[3:5] != new[3:5]:
                out.append(f"{rel} was written")
            elif old[0] != new[0]:
                out.append(f"{rel} changed mode")
            elif stat.S_ISDIR(new[0]) and before.listings.get(rel) == after.listings.get(rel):
                continue  # a folder's ctime: its entries say what happened (each is compared)
            else:
                out.append(f"{rel} changed (metadata)")
    for rel in sorted(set(before.listings) & set(after.listings)):
        if before.listings[rel] != after.listings[rel] and not any(o.startswith(f"{rel}/") or rel == "." for o in out):
            out.append(f"the listing of {rel} changed")
    return out


def folders(state: TreeState) -> list[str]:
    """The folders of the tree (rel paths, ``"."`` the root)."""
    return [rel for rel, ident in state.entries.items() if stat.S_ISDIR(ident[0])]


def looked_at_again(state: TreeState, rels: list[str]) -> TreeState:
    """``state`` with the entries ``rels`` looked at again (one ``lstat`` each, no listing): what the
    caller itself changed since it took the state (the staged tree's folder modes)."""
    entries = dict(state.entries)
    for rel in rels:
        entries[rel] = identity(os.lstat(state.root if rel == "." else os.path.join(state.root, *rel.split("/"))))
    return TreeState(state.root, entries, state.listings)


def record(state: TreeState, linked: frozenset[str] = frozenset()) -> dict[str, list[int | None]]:
    """The state of a staged tree as its journal keeps it, so that an ``--abort`` after the swap can prove
    the tree at the target is still the one migrate put there (``changed_since``): every entry's
    identity, less what changes while the tree does not. A folder's size and times are None (the swap
    renames the tree, which sets its root's ctime; what changes in a folder shows in its entries, each
    recorded), and so is the ctime of a file migrate hard-linked (a link or unlink of it elsewhere sets it)."""
    out: dict[str, list[int | None]] = {}
    for rel, ident in state.entries.items():
        kept: list[int | None] = list(ident)
        if stat.S_ISDIR(ident[0]):
            kept[3:6] = [None, None, None]
        elif rel in linked:
            kept[5] = None
        out[rel] = kept
    return out


def is_record(value: object) -> bool:
    """Whether ``value`` (read from a journal) has the shape ``record`` gives: rel path -> 8 ints or None."""
    return isinstance(value, dict) and all(
        isinstance(rel, str) and isinstance(kept, list) and len(kept) == 8
        and all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in kept)
        for rel, kept in value.items())


def changed_since(recorded: dict[str, list[int | None]], now: TreeState) -> list[str]:
    """What differs between a tree's ``recorded`` state and its state ``now``, in the words of ``changes``
    (empty: the same tree). A field recorded as None is compared in neither."""
    def state(entries: dict[str, Identity]) -> TreeState:
        listings: dict[str, list[str]] = {rel: [] for rel, ident in entries.items() if stat.S_ISDIR(ident[0])}
        for rel in entries:
            if rel != ".":
                parent, _, name = rel.rpartition("/")
                listings.setdefault(parent or ".", []).append(name)
        return TreeState(now.root, entries, {rel: tuple(sorted(names)) for rel, names in listings.items()})

    def masked(ident: tuple[int, ...] | list[int | None], mask: list[int | None] | None) -> Identity:
        kept = [0 if mask is not None and mask[i] is None else ident[i] or 0 for i in range(8)]
        return (kept[0], kept[1], kept[2], kept[3], kept[4], kept[5], kept[6], kept[7])

    before = {rel: masked(kept, kept) for rel, kept in recorded.items()}
    after = {rel: masked(ident, recorded.get(rel)) for rel, ident in now.entries.items()}
    return changes(state(before), state(after))


def _mountinfo() -> list[str]:
    """Every mount point of this process's mount namespace (``/proc/self/mountinfo``; a bind mount of
    a folder of the same filesystem shares its device number, so only this list tells it)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        fields = line.split(" ")
        if len(fields) > 4:
            out.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return out


def is_mount_point(path: str) -> bool:
    """Whether ``path`` (resolved) is where a filesystem, or a bind mount, is mounted."""
    real = os.path.realpath(path)
    return os.path.ismount(real) or real in _mountinfo()


def mount_table(real: str) -> set[str]:
    """The mount points the mount table lists strictly below the resolved folder ``real``."""
    return {m for m in _mountinfo() if m.startswith(real.rstrip("/") + "/")}


def mount_points(root: str) -> list[str]:
    """Mount points below ``root`` (rel paths, sorted; ``root`` itself is not listed): a folder on
    another filesystem, or any path the mount table lists (a bind mount). Never crossed, so never
    searched below."""
    real = os.path.realpath(root)
    try:
        dev = os.lstat(real).st_dev
    except OSError:
        return []
    table = mount_table(real)
    out: list[str] = sorted(os.path.relpath(m, real) for m in table)
    from clef_format.read.walk import walk

    for dirpath, dirnames, _ in walk(real):  # iterative and depth-limited; what lies deeper is refused elsewhere
        keep = []
        for name in dirnames:
            full = os.path.join(dirpath, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if full in table:
                continue
            if stat.S_ISDIR(st.st_mode) and (st.st_dev != dev or os.path.ismount(full)):
                out.append(os.path.relpath(full, real))
            else:
                keep.append(name)
        dirnames[:] = keep
    return sorted(set(out))
