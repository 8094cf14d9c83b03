"""What to do about an interrupted run, decided from its journal and the disk, then done.

The next call on ``T`` reads the journal first: staging -> resume (or roll back with ``abort``),
staged -> finish the swap if the source is unchanged, swapped -> finish the cleanup. An ``--abort``
after the swap puts the original back only while the tree at ``T`` is the one the run swapped in, as
its journal recorded it: a tree changed since (a file added, edited, removed) is someone's work, and
the rollback, which deletes that tree, is refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from enum import Enum

from clef_format.errors import MigrateRefused
from clef_format.migrate import fsutil
from clef_format.migrate.swap import cleanup_or_say, holds_new_tree, swap_in, was_swapped
from clef_format.migrate.tree_state import changed_since, snapshot
from clef_format.migrate.workspace import (
    NOT_READ,
    Journal,
    NotRead,
    Phase,
    RUN_ENTRIES,
    Target,
    fingerprint,
    foreign_entries,
    read_journal,
    remove_tree,
    write_journal,
)
from clef_format.read.checkpoint import Checkpoint
from clef_format.shell import quote_path


#: ``wanted`` when the caller does not say which step it is about to run (it resumes any staging).
ANY_STEP = ("*", "*")


class Action(str, Enum):
    """What ``recover`` does about an interrupted run."""

    REMOVE = "remove"  # delete the workspace: the target was never changed
    UNSWAP = "unswap"  # put the original tree back (--abort after the swap, while it is still whole)
    CLEANUP = "cleanup"  # the new tree is in place: finish deleting what it replaced
    FINISH_FALLBACK = "finish-fallback"  # killed between the two renames of the fallback swap: do the second
    SWAP = "swap"  # staged and verified, the source unchanged: swap it in
    RESUME = "resume"  # go on staging where the interrupted run stopped
    REFUSE = "refuse"  # --abort would delete a new tree changed since the swap: nothing is done


@dataclass(frozen=True)
class Decision:
    """The recovery of an interrupted run: what is done, what the run says about it, its journal; for
    ``REFUSE`` the note says why and ``fix`` what to run instead."""

    action: Action
    note: str
    journal: Journal | None
    fix: str | None = None


def _changes_at_target(target: Target, journal: Journal) -> list[str] | None:
    """What changed in the tree at the target since the run recorded it staged (empty: nothing, or no
    tree is there: moved away, nothing of it is lost). None: the journal records no state (an older
    clef-format's), so nothing proves the tree unchanged."""
    if not os.path.lexists(target.path) or os.path.islink(target.path):  # a link put there: the tree is elsewhere
        return []
    if journal.new_tree is None:
        return None
    try:
        now = snapshot(target.path)
    except OSError as exc:  # not looked at, never deleted
        where = os.path.relpath(exc.filename, target.path) if isinstance(exc.filename, str) else "."
        return [f"{where} cannot be read ({exc.strerror or exc})"]
    return changed_since(journal.new_tree, now)


def _refusal(target: Target, journal: Journal, what: str, changed: list[str] | None) -> Decision:
    """``--abort`` refused: the rollback would delete the tree at the target, which holds changes made
    since the swap (or may: ``changed`` None). The fix keeps that tree in both of its ways."""
    path = target.path
    if changed is None:
        why = (f"{path} holds the new tree of the interrupted migration {what}, and its journal (written by an "
               "earlier clef-format) records nothing that proves the tree unchanged since it was swapped in: "
               "rolling the migration back could delete changes made to it")
    else:
        shown = "; ".join(changed[:5]) + (f"; and {len(changed) - 5} more" if len(changed) > 5 else "")
        why = (f"{path} holds the new tree of the interrupted migration {what}, changed since it was swapped in "
               f"({shown}): rolling the migration back would delete those changes")
    q = quote_path(path)
    if journal.in_place is False:
        back = f"removes what the run left beside it (the source {journal.source} was only read)"
        finish = f"clef-format migrate {quote_path(journal.source or 'SOURCE')} --to {journal.to_layout} --output {q}"
    else:
        back = f"puts the original tree back at {path}"
        finish = f"clef-format migrate {q} --to {journal.to_layout}"
    fix = (f"to keep {path} as it is now, move it away (mv {q} {quote_path(path + '.kept')}), then clef-format "
           f"migrate {q} --abort {back}; or finish the migration instead: {finish}")
    return Decision(Action.REFUSE, why, journal, fix)


def _replaced(target: Target, journal: Journal, what: str) -> Decision:
    """Refused: the tree swapped in was moved away from the target and another put there. Finishing the
    cleanup would delete the original parked in the workspace (its only exact copy: the int8 tables are
    lossy), and rolling back would take the target's tree for the new one."""
    q = quote_path(target.path)
    there = "a symlink" if os.path.islink(target.path) else "another folder"
    why = (f"{target.path} no longer holds the new tree the interrupted migration {what} swapped in ({there} "
           f"is there now): finishing its cleanup would delete the original tree parked in {target.ws}, and "
           "rolling it back would take that folder for the new tree")
    fix = (f"move {q} away (mv {q} {quote_path(target.path + '.kept')}), then clef-format migrate {q} --abort puts "
           "the original tree back; both are kept")
    return Decision(Action.REFUSE, why, journal, fix)


def _decide(target: Target, source_ck: Checkpoint | None, abort: bool, wanted: tuple[str, str] | None = ANY_STEP,
            journal: Journal | None | NotRead = NOT_READ) -> Decision | None:
    """What ``recover`` will do about an interrupted run, or None when there is none.
    ``wanted``: the (revision, direction) this run is about to stage, None when it has nothing to do: a
    staging of another step, or of a source that changed since, is rolled back, never "resumed".

    Pure (it only reads): ``--dry-run`` reports the same decision that a real run carries out.
    """
    if not os.path.lexists(target.ws):
        return None
    if isinstance(journal, NotRead):
        journal = read_journal(target)
    if journal is None:
        foreign = foreign_entries(target.ws) if os.path.isdir(target.ws) and not os.path.islink(target.ws) else ["."]
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise MigrateRefused(f"{target.ws} is where migrate keeps its workspace, but it holds what no "
                                 f"migrate run leaves there ({shown}) and no journal: nothing was changed "
                                 "or removed", f"move {target.ws} away (it may be your data), then run "
                                               "clef-format migrate again")
        return Decision(Action.REMOVE, "removed an interrupted run's workspace (it held no journal, so nothing in it "
                                       "was needed)", None)
    try:  # beside what a run keeps there, anything is someone's: every recovery ends by removing the workspace
        stray = sorted(set(os.listdir(target.ws)) - RUN_ENTRIES)
    except OSError:
        stray = []
    if stray:
        shown = ", ".join(stray[:3]) + (f" and {len(stray) - 3} more" if len(stray) > 3 else "")
        return Decision(Action.REFUSE, f"the workspace {target.ws} of the interrupted migration {journal.revision} "
                                       f"{journal.direction} holds what no migrate run leaves there ({shown}): finishing "
                                       "or rolling back that run removes the workspace", journal,
                        f"move {shown} out of {target.ws} (it may be your data), then run the same command again")
    phase = journal.phase
    what = f"{journal.revision} {journal.direction}"
    other = wanted != ANY_STEP and wanted != journal.step
    if other and phase != "staging" and not abort:
        # this run goes elsewhere (e.g. back to the layout the interrupted one started from): finishing
        # the interrupted step first would discard the original tree only to rebuild it from the result
        # (int8 tables decoded, not the original BF16); undo it instead, exactly as --abort does
        decided = _decide(target, source_ck, True, ANY_STEP, journal)
        if decided is not None and decided.action is not Action.CLEANUP:
            return replace(decided, note=f"{decided.note} (this run goes to another layout)")
        return decided
    swapped = phase is Phase.SWAPPED or (phase is Phase.STAGED and was_swapped(target, journal))
    parked = os.path.isdir(target.new) or os.path.isdir(target.old)  # complete by construction (_discard)
    made_output = journal.in_place is False and not parked  # an --output that did not exist before
    if swapped and abort and parked and os.path.lexists(target.path) and not holds_new_tree(target, journal):
        return _replaced(target, journal, what)  # another tree is there: as a run finishing it would say
    if swapped and abort and (parked or made_output):  # the rollback deletes the tree at the target
        changed = _changes_at_target(target, journal)
        if changed != []:
            return _refusal(target, journal, what, changed)
    linked = os.path.islink(target.path)  # a symlink the user put there: never the new tree, never touched
    moved = ("" if os.path.lexists(target.path) and not linked else
             " (the new tree had been moved away from it, and is left where it is)")
    if swapped and abort and parked:
        return Decision(Action.UNSWAP, f"rolled back the interrupted migration {what}: it had swapped its new tree in, "
                                       f"and the original tree, still complete in the workspace, is back at "
                                       f"{target.path}{moved}", journal)
    if swapped and abort and made_output and moved:
        left = " (a symlink is at its path now, kept as it is)" if linked else ""
        return Decision(Action.UNSWAP, f"rolled back the interrupted migration {what}: removed its workspace; the "
                                       f"output {target.path} it had created had been moved away, and is left where it is"
                                       f"{left} (the source was never changed)", journal)
    if swapped and abort and made_output:
        return Decision(Action.UNSWAP, f"rolled back the interrupted migration {what}: removed the output "
                                       f"{target.path} it had created (the source was never changed)", journal)
    if swapped and parked and os.path.lexists(target.path) and not holds_new_tree(target, journal):
        return _replaced(target, journal, what)
    if swapped:
        note = f"the interrupted migration {what} had completed; finished its cleanup"
        if abort:
            note += (" (it cannot be rolled back: its cleanup had already removed the original tree; "
                     "migrate --to the previous layout goes back)")
        return Decision(Action.CLEANUP, note, journal)
    if phase is Phase.STAGED and not os.path.lexists(target.path) and os.path.isdir(target.old):
        if abort:
            return Decision(Action.UNSWAP, f"rolled back the interrupted migration {what}: the original tree is back "
                                           f"at {target.path}", journal)
        return Decision(Action.FINISH_FALLBACK, f"finished the interrupted migration {what} (its new tree was "
                                                "complete)", journal)
    if abort:
        return Decision(Action.REMOVE, f"rolled back the interrupted migration {what}; the checkpoint was never "
                                       "changed", journal)
    filled = fsutil.output_written(target) if journal.in_place is False else []
    if phase is Phase.STAGED and filled:  # the exchange would move what is there now into the workspace
        return Decision(Action.REMOVE, f"rolled back the interrupted migration {what}: its --output {target.path} was "
                                       f"made or filled since ({filled[0]}), and is kept as it is", journal)
    if phase is Phase.STAGED and source_ck is not None and journal.fingerprint == fingerprint(source_ck):
        return Decision(Action.SWAP, f"finished the interrupted migration {what} (its new tree was complete and "
                                     "verified)", journal)
    if phase is Phase.STAGING and source_ck is not None and journal.fingerprint != fingerprint(source_ck):
        return Decision(Action.REMOVE, f"rolled back the interrupted migration {what}: the checkpoint changed since",
                        journal)
    if phase is Phase.STAGING and wanted != ANY_STEP and wanted != journal.step:
        now = "has nothing to do" if wanted is None else f"runs {wanted[0]} {wanted[1]}"
        return Decision(Action.REMOVE, f"rolled back the interrupted migration {what}: this run {now}, so none of it "
                                       "was needed", journal)
    if phase is Phase.STAGING:
        return Decision(Action.RESUME, f"resuming the interrupted migration {what}", journal)
    return Decision(Action.REMOVE, f"rolled back the interrupted migration {what}: the checkpoint changed since", journal)


def can_roll_back(target: Target, journal: Journal | None | NotRead = NOT_READ) -> bool:
    """Whether ``--abort`` would undo the interrupted run at ``target`` (not once its cleanup began
    removing the original tree: then it can only be finished)."""
    decided = _decide(target, None, True, ANY_STEP, journal)
    return decided is None or decided.action is not Action.CLEANUP


def pending_decision(target: Target, source_ck: Checkpoint | None, abort: bool = False,
                     wanted: tuple[str, str] | None = ANY_STEP, journal: Journal | None | NotRead = NOT_READ
                     ) -> Decision | None:
    """What the next run (with ``abort``) will do about an interrupted one, decided and not done
    (``--dry-run``, ``--current``): the same decision ``carry_out`` carries out."""
    return _decide(target, source_ck, abort, wanted, journal)


def foretold(decided: Decision | None) -> str | None:
    """``decided`` said before it is done (None: nothing to say; a resume is no recovery to announce)."""
    if decided is None or decided.action is Action.RESUME:
        return None
    if decided.action is Action.REFUSE:
        return f"would be refused: {decided.note} (fix: {decided.fix})"
    return decided.note


def phase_said(target: Target, journal: Journal) -> str:
    """The phase of an interrupted run as ``--current`` and ``--dry-run`` say it: the journal's, except that a
    run killed between its exchange and the journal's next write is said as swapped (its new tree is at
    the target, which is what its recovery goes by)."""
    if journal.phase is Phase.STAGED and was_swapped(target, journal):
        return f"{Phase.SWAPPED.value}; its journal still said {Phase.STAGED.value}"
    return journal.phase_name


def pending_said(target: Target, journal: Journal | None) -> str | None:
    """``REVISION DIRECTION (PHASE)``: what waits (None: nothing), the phase as ``phase_said`` says it."""
    return None if journal is None else f"{journal.revision} {journal.direction} ({phase_said(target, journal)})"


def would_do(command: str, said: str | None, otherwise: str) -> str:
    """``command`` and what it would do about an interrupted run (``said``, from ``foretold``), said before it
    is done: the notes are written as done, so they are introduced as what it would do."""
    if said is None:
        return f"{command} {otherwise}"
    return f"{command} {said}" if said.startswith("would ") else f"{command} would do this: {said}"


def pending_recovery(target: Target, source_ck: Checkpoint | None, abort: bool = False,
                     wanted: tuple[str, str] | None = ANY_STEP, journal: Journal | None | NotRead = NOT_READ) -> str | None:
    """What the next run (with ``abort``) will do about an interrupted one, said before doing it."""
    return foretold(pending_decision(target, source_ck, abort, wanted, journal))


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
    elif os.path.isdir(target.new):  # exchanged, and the new tree was moved away from the target since
        os.rename(target.new, target.path)
        fsutil.fsync_dir(target.parent)
    elif os.path.lexists(target.path) and not os.path.islink(target.path):  # an output that did not exist before
        os.rename(target.path, target.new)
        fsutil.fsync_dir(target.parent)
    remove_tree(target.ws)
    fsutil.fsync_dir(target.parent)


def recover(target: Target, source_ck: Checkpoint | None, abort: bool = False,
            wanted: tuple[str, str] | None = ANY_STEP) -> str | None:
    """Deal with an interrupted run before anything else (the lock is held). Returns what was done."""
    decided = carry_out(target, source_ck, abort, wanted)
    return None if decided is None else decided.note


def carry_out(target: Target, source_ck: Checkpoint | None, abort: bool = False,
              wanted: tuple[str, str] | None = ANY_STEP, journal: Journal | None | NotRead = NOT_READ
              ) -> Decision | None:
    """``recover``, given the journal the caller read under the lock: returns the decision carried out
    (None: no interrupted run was there, nothing was done)."""
    decided = _decide(target, source_ck, abort, wanted, journal)
    if decided is None:
        return None
    action, journal = decided.action, decided.journal
    if action is Action.REFUSE:
        raise MigrateRefused(f"{decided.note}; nothing was changed", decided.fix)
    if action is Action.REMOVE:
        remove_tree(target.ws)
    elif action is Action.UNSWAP:
        _unswap(target)
    elif action is Action.CLEANUP:
        assert journal is not None
        if journal.phase is Phase.STAGED:
            journal.phase = Phase.SWAPPED
            write_journal(target, journal)
        cleanup_or_say(target)
    elif action is Action.FINISH_FALLBACK:
        assert journal is not None
        os.rename(target.new, target.path)  # killed between the two renames of the fallback swap
        fsutil.fsync_dir(target.parent)
        journal.phase = Phase.SWAPPED
        write_journal(target, journal)
        cleanup_or_say(target)
    elif action is Action.SWAP:
        assert journal is not None
        swap_in(target, journal)
        cleanup_or_say(target)
    return decided
