"""What to do about an interrupted run, decided from its journal and the disk, then done.

The next call on ``T`` reads the journal first: staging -> resume (or roll back with ``abort``),
staged -> finish the swap if the source is unchanged, swapped -> finish the cleanup.
"""

from __future__ import annotations

import os
from typing import Any

from clef_format.errors import Refused
from clef_format.migrate import fsutil
from clef_format.migrate.swap import _cleanup_or_say, _swap, _swapped
from clef_format.migrate.workspace import Target, _rmtree, fingerprint, foreign_entries, read_journal, write_journal
from clef_format.read.checkpoint import Checkpoint


#: ``wanted`` when the caller does not say which step it is about to run (it resumes any staging).
ANY_STEP = ("*", "*")


def _decide(target: Target, source_ck: Checkpoint | None, abort: bool, wanted: tuple[str, str] | None = ANY_STEP
            ) -> tuple[str, str, dict[str, Any] | None] | None:
    """What ``recover`` will do about an interrupted run: (action, what it says, journal), or None.
    ``wanted``: the (revision, direction) this run is about to stage, None when it has nothing to do: a
    staging of another step, or of a source that changed since, is rolled back, never "resumed".

    Pure (it only reads): ``--dry-run`` reports the same decision that a real run carries out.
    """
    if not os.path.lexists(target.ws):
        return None
    journal = read_journal(target)
    if journal is None:
        foreign = foreign_entries(target.ws) if os.path.isdir(target.ws) and not os.path.islink(target.ws) else ["."]
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise Refused("migrate-refused", f"{target.ws} is where migrate keeps its workspace, but it holds what no "
                                             f"migrate run leaves there ({shown}) and no journal: nothing was changed "
                                             "or removed", f"move {target.ws} away (it may be your data), then run "
                                                           "clef-format migrate again")
        return "remove", "removed an interrupted run's workspace (it held no journal, so nothing in it was needed)", None
    phase = journal.get("phase")
    what = f"{journal.get('revision')} {journal.get('direction')}"
    other = wanted != ANY_STEP and wanted != (journal.get("revision"), journal.get("direction"))
    if other and phase != "staging" and not abort:
        # this run goes elsewhere (e.g. back to the layout the interrupted one started from): finishing
        # the interrupted step first would discard the original tree only to rebuild it from the result
        # (int8 tables decoded, not the original BF16); undo it instead, exactly as --abort does
        decided = _decide(target, source_ck, True, ANY_STEP)
        if decided is not None and decided[0] != "cleanup":
            return decided[0], f"{decided[1]} (this run goes to another layout)", decided[2]
        return decided
    swapped = phase == "swapped" or (phase == "staged" and _swapped(target, journal))
    parked = os.path.isdir(target.new) or os.path.isdir(target.old)  # complete by construction (_discard)
    made_output = journal.get("in_place") is False and not parked  # an --output that did not exist before
    if swapped and abort and parked:
        return "unswap", (f"rolled back the interrupted migration {what}: it had swapped its new tree in, and the "
                          f"original tree, still complete in the workspace, is back at {target.path}"), journal
    if swapped and abort and made_output:
        return "unswap", (f"rolled back the interrupted migration {what}: removed the output {target.path} it had "
                          "created (the source was never changed)"), journal
    if swapped:
        note = f"the interrupted migration {what} had completed; finished its cleanup"
        if abort:
            note += (" (it cannot be rolled back: its cleanup had already removed the original tree; "
                     "migrate --to the previous layout goes back)")
        return "cleanup", note, journal
    if phase == "staged" and not os.path.lexists(target.path) and os.path.isdir(target.old):
        if abort:
            return "unswap", (f"rolled back the interrupted migration {what}: the original tree is back at "
                              f"{target.path}"), journal
        return "finish-fallback", f"finished the interrupted migration {what} (its new tree was complete)", journal
    if abort:
        return "remove", f"rolled back the interrupted migration {what}; the checkpoint was never changed", journal
    if phase == "staged" and source_ck is not None and journal.get("fingerprint") == fingerprint(source_ck):
        return "swap", f"finished the interrupted migration {what} (its new tree was complete and verified)", journal
    if phase == "staging" and source_ck is not None and journal.get("fingerprint") != fingerprint(source_ck):
        return "remove", f"rolled back the interrupted migration {what}: the checkpoint changed since", journal
    if phase == "staging" and wanted != ANY_STEP and wanted != (journal.get("revision"), journal.get("direction")):
        now = "has nothing to do" if wanted is None else f"runs {wanted[0]} {wanted[1]}"
        return "remove", f"rolled back the interrupted migration {what}: this run {now}, so none of it was needed", journal
    if phase == "staging":
        return "resume", f"resuming the interrupted migration {what}", journal
    return "remove", f"rolled back the interrupted migration {what}: the checkpoint changed since", journal


def can_roll_back(target: Target) -> bool:
    """Whether ``--abort`` would undo the interrupted run at ``target`` (not once its cleanup began
    removing the original tree: then it can only be finished)."""
    decided = _decide(target, None, True)
    return decided is None or decided[0] != "cleanup"


def pending_recovery(target: Target, source_ck: Checkpoint | None, abort: bool = False,
                     wanted: tuple[str, str] | None = ANY_STEP) -> str | None:
    """What the next run (with ``abort``) will do about an interrupted one, said before doing it."""
    decided = _decide(target, source_ck, abort, wanted)
    return None if decided is None or decided[0] == "resume" else decided[1]


def _unswap(target: Target) -> None:
    """Put the original tree back where it was, the new one into the workspace (then removed)."""
    if os.path.isdir(target.new) and os.path.lexists(target.path):
        fsutil.exchange(target.new, target.path)  # the exchange of the swap, done again
        fsutil.fsync_dir(target.parent)
        fsutil.fsync_dir(target.ws)
    elif os.path.isdir(target.old):  # the fallback swap: the original was renamed aside
        if os.path.lexists(target.path):
            os.rename(target.path, target.new)
            fsutil.fsync_dir(target.ws)
        os.rename(target.old, target.path)
        fsutil.fsync_dir(target.parent)
    elif os.path.lexists(target.path):  # an output that did not exist before (the journal says out of place)
        os.rename(target.path, target.new)
        fsutil.fsync_dir(target.parent)
    _rmtree(target.ws)
    fsutil.fsync_dir(target.parent)


def recover(target: Target, source_ck: Checkpoint | None, abort: bool = False,
            wanted: tuple[str, str] | None = ANY_STEP) -> str | None:
    """Deal with an interrupted run before anything else (the lock is held). Returns what was done."""
    decided = _decide(target, source_ck, abort, wanted)
    if decided is None:
        return None
    action, note, journal = decided
    if action == "remove":
        _rmtree(target.ws)
    elif action == "unswap":
        _unswap(target)
    elif action == "cleanup":
        assert journal is not None
        if journal.get("phase") == "staged":
            journal["phase"] = "swapped"
            write_journal(target, journal)
        _cleanup_or_say(target)
    elif action == "finish-fallback":
        assert journal is not None
        os.rename(target.new, target.path)  # killed between the two renames of the fallback swap
        fsutil.fsync_dir(target.parent)
        journal["phase"] = "swapped"
        write_journal(target, journal)
        _cleanup_or_say(target)
    elif action == "swap":
        assert journal is not None
        _swap(target, journal)
        _cleanup_or_say(target)
    return note
