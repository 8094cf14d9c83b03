"""The swap and the cleanup: the staged tree takes the target's name in one atomic step, then what
it replaced is deleted.

``renameat2(RENAME_EXCHANGE)`` swaps ``ws/new`` and ``T``, so ``T`` is at every instant either the
whole old checkpoint or the whole new one. (Where the filesystem cannot exchange, two renames with
the old tree parked in ``ws/old``; the journal finishes them.) Then the old tree is deleted, then the
journal, the workspace, the lock.
"""

from __future__ import annotations

import errno
import os
from typing import Callable

from clef_format.migrate import fsutil
from clef_format.migrate.crash import crashpoint
from clef_format.migrate.workspace import Journal, Phase, Target, remove_tree, write_journal


def _discard(target: Target, path: str) -> None:
    """Remove a parked tree: renamed aside first (one atomic step), then deleted, so a tree still at
    ``new`` or ``old`` is always complete and ``--abort`` can always put it back."""
    if not os.path.lexists(path):
        return
    doomed = os.path.join(target.ws, "discard")
    remove_tree(doomed)  # what an earlier, interrupted cleanup had begun to delete
    os.rename(path, doomed)
    fsutil.fsync_dir(target.ws)  # the rename is durable before any deletion: a tree at new/old stays whole
    remove_tree(doomed)


def _cleanup(target: Target) -> None:
    crashpoint("cleanup")
    _discard(target, target.new)
    crashpoint("cleanup")
    _discard(target, target.old)
    try:
        os.unlink(target.journal_path)
    except FileNotFoundError:
        pass
    crashpoint("cleanup")
    remove_tree(target.ws)
    try:
        fsutil.fsync_dir(target.parent)  # persists only the empty workspace's removal: the swap was fsynced
    except OSError:
        pass


def _inode(path: str) -> list[int] | None:
    """The path's own (device, inode): a symlink put where the new tree was is never that tree."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return [st.st_dev, st.st_ino]


def was_swapped(target: Target, journal: Journal) -> bool:
    """Whether the staged tree was swapped in: the target path holds it (its inode is the one the journal
    recorded), or ``ws/new`` holds another tree (the exchange put the target's there: the new tree may have
    been moved away from the target since, and the tree in ``ws/new`` is then the original, never litter)."""
    if journal.new_ino is None:
        return False
    parked = _inode(target.new)
    return _inode(target.path) == journal.new_ino or (parked is not None and parked != journal.new_ino)


def holds_new_tree(target: Target, journal: Journal) -> bool:
    """Whether the target path still holds the tree the run swapped in (not another folder put there
    since). True when the journal (an earlier clef-format's) records no inode: nothing tells."""
    return journal.new_ino is None or _inode(target.path) == journal.new_ino


class SwapFailed(OSError):
    """The swap did not happen and was undone: the target is exactly as it was, the workspace removed."""


class CleanupIncomplete(OSError):
    """The new tree is in place (the migration is done) but removing what it replaced failed; the
    journal says ``swapped`` so the next call finishes the cleanup."""


def _put_back(target: Target) -> None:
    """Undo half a fallback swap: the parked old tree goes back to ``T``."""
    if not os.path.lexists(target.path) and os.path.isdir(target.old):
        os.rename(target.old, target.path)
    elif not target.in_place and not os.path.lexists(target.path):
        os.mkdir(target.path)


def _exchange(target: Target) -> None:
    if os.path.isdir(target.path) and not os.path.islink(target.path):
        try:
            fsutil.exchange(target.new, target.path)
            return
        except OSError as exc:
            if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EPERM):
                raise
        if not target.in_place:
            os.rmdir(target.path)  # refused earlier unless empty
        else:
            os.rename(target.path, target.old)
            fsutil.fsync_dir(target.ws)  # the old tree is safe in the workspace before the new one takes its name
            crashpoint("swap")
    os.rename(target.new, target.path)


def swap_in(target: Target, journal: Journal, recheck: Callable[[], None] | None = None) -> None:
    """Swap the staged tree in. A failure before the new tree is in place is undone (``SwapFailed``);
    one after it (fsync, journal) leaves a finished migration whose cleanup the next call completes.
    ``recheck`` runs last before the exchange: when it raises, nothing was swapped and the workspace
    is removed (the target and the source are exactly as they are now)."""
    crashpoint("swap")
    if recheck is not None:
        try:
            recheck()
        except BaseException:
            try:
                remove_tree(target.ws)
            except OSError:
                pass  # the journal says staged: the next run decides about it
            raise
    try:
        _exchange(target)
    except OSError as exc:
        cause = exc.strerror or str(exc)
        try:
            _put_back(target)
        except OSError as undo:
            raise SwapFailed(exc.errno, f"swapping the new tree into {target.path} failed ({cause}) and putting the "
                                        f"old one back failed too ({undo.strerror}); the complete old tree is in "
                                        f"{target.old} and the new one in {target.new}: rerun clef-format migrate "
                                        "to finish, or --abort to restore the old one") from None
        try:
            remove_tree(target.ws)
        except OSError as rm:
            raise SwapFailed(exc.errno, f"swapping the new tree into {target.path} failed: {cause}; the checkpoint "
                                        f"is unchanged, but the workspace {target.ws} could not be removed "
                                        f"({rm.strerror}): rerun with --abort") from None
        raise SwapFailed(exc.errno, f"swapping the new tree into {target.path} failed: {cause}; nothing was changed "
                                    "and the new files were removed") from None
    try:
        fsutil.fsync_dir(target.parent)
        fsutil.fsync_dir(target.ws)  # an exchange renamed in both directories: both durable before the journal
        crashpoint("swap")
        journal.phase = Phase.SWAPPED
        write_journal(target, journal)
    except OSError as exc:
        raise CleanupIncomplete(exc.errno, f"the new tree is in place at {target.path}, but recording it failed "
                                           f"({exc.strerror or exc}): rerun clef-format migrate to finish") from None


def cleanup_or_say(target: Target) -> None:
    """Remove what the swap replaced; a failure is ``CleanupIncomplete`` (done, the next call cleans up)."""
    try:
        _cleanup(target)
    except OSError as exc:
        raise CleanupIncomplete(exc.errno, f"the migration is complete ({target.path} holds the new tree), but "
                                           f"removing the old files in {target.ws} failed: {exc.strerror or exc}; "
                                           "rerun clef-format migrate to finish the cleanup") from None
