"""Interrupted runs found by their target's path, where that path does not exist (yet).

A run for target ``T`` keeps its workspace ``.T.clef-migrate`` and lock beside ``T``, so an
interrupted ``migrate SRC --output T`` into a new folder leaves them where ``T`` never appeared (and
an interrupted fallback swap in place leaves ``T`` absent for a moment). ``migrate T --current`` and
``migrate T --abort`` find them here; ``migrate SRC --current`` lists the ``--output`` runs from
``SRC`` whose workspace lies in ``SRC``'s own folder. The rollback itself is ``apply.recover``.
"""

from __future__ import annotations

import os

from clef_format.errors import MigrateRefused, PathNotFound, Refused
from clef_format.migrate.details import MigrateDraft
from clef_format.migrate.recovery import (
    Action,
    foretold,
    pending_decision,
    pending_said,
    phase_said,
    recover,
    would_do,
)
from clef_format.migrate.workspace import (
    Lock,
    Target,
    foreign_entries,
    foreign_lock,
    Journal,
    Phase,
    make_target,
    output_filled,
    read_journal,
)
from clef_format.spec.workspace_names import workspace_owner
from clef_format.read.checkpoint import read_checkpoint
from clef_format.report import Report, ReportDraft
from clef_format.shell import quote_path
from clef_format.spec.findings import error, info

def interrupted_at(path: str) -> tuple[Target, Journal | None] | None:
    """The interrupted run whose target is ``path`` (which need not exist): its workspace or lock lies
    beside it. (the target, its journal or None); None when there is neither."""
    from clef_format.read.paths import as_the_kernel_resolves

    out = as_the_kernel_resolves(path)
    if not os.path.isdir(os.path.dirname(out)):
        return None
    # beside the name as given first: an --output that became a symlink after its run was killed still
    # has the run's workspace beside that name, not beside where the link leads
    named = Target(os.path.join(os.path.realpath(os.path.dirname(out)), os.path.basename(out)), out, False)
    target = named if os.path.islink(out) and (os.path.lexists(named.ws) or os.path.lexists(named.lock_path)) \
        else make_target(out, out)
    if not (os.path.lexists(target.ws) or os.path.lexists(target.lock_path)):
        return None
    journal = read_journal(target)
    source = journal.source if journal else None
    return Target(target.path, source if source is not None else target.path, False), journal


def interrupted_beside_link(path: str) -> tuple[Target, Journal | None] | None:
    """The interrupted run into ``path`` when ``path`` has become a symlink since (its workspace lies beside
    the link's name, where every run into a link's target would never look), else None."""
    from clef_format.read.paths import as_the_kernel_resolves

    out = as_the_kernel_resolves(path)  # OUT/ (as tab completion writes it) is OUT
    if not os.path.islink(out):
        return None
    found = interrupted_at(path)
    named = os.path.join(os.path.realpath(os.path.dirname(out)), os.path.basename(out))
    return found if found is not None and found[0].path == named else None


def link_refusal(path: str, found: tuple[Target, Journal | None]) -> MigrateRefused:
    """A run into ``path``, now a symlink, while the run interrupted before it became one still waits: the
    new run would write where the link leads and leave that run's workspace beside the link forever."""
    return MigrateRefused(f"{path} is now a symlink (to {os.path.realpath(path)}) and the interrupted migrate into "
                          f"it still waits beside it ({what(*found)}); nothing was written", link_fix(path))


def link_fix(path: str) -> str:
    """What to run about a run interrupted into ``path`` before it became a symlink."""
    return (f"clef-format migrate {quote_path(path)} --abort removes what that run left (the link and what it "
            "leads to are kept), then run the command again")


def refused_now(target: Target) -> str:
    """What ``--current`` adds when the resume and the abort of the run waiting at ``target`` would both be
    refused now (a read-only parent or workspace folder: the preflight both meet first), else ""."""
    from clef_format.migrate.preflight import preflight

    blocked = preflight(target, None, False, check_lock=False) if os.path.isdir(target.ws) else []
    return f"; but both would be refused now: {blocked[0].message} (fix: {blocked[0].fix})" if blocked else ""


def outputs_beside(source: str) -> list[tuple[Target, Journal]]:
    """Interrupted ``--output`` runs from ``source`` whose workspace lies in the folder beside it (an
    output elsewhere is found by ``migrate OUT --current``)."""
    parent, out = os.path.dirname(source), []
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return []
    for name in names:
        owner = workspace_owner(name)
        if owner is not None and not name.endswith(".lock"):
            found = interrupted_at(os.path.join(parent, owner))
            if found and found[1] and found[1].source == source and found[1].in_place is False:
                out.append((found[0], found[1]))
    return out


def what(target: Target, journal: Journal | None) -> str:
    """The interrupted run in a few words."""
    if journal is None:
        if not os.path.lexists(target.ws):
            return f"only its lock {target.lock_path} is left"
        foreign = foreign_entries(target.ws) if os.path.isdir(target.ws) else ["."]
        if foreign:
            return (f"{target.ws} holds no journal but holds what no migrate run leaves there "
                    f"({', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''})")
        return "its workspace holds no journal: nothing in it was needed"
    return f"{journal.revision} {journal.direction} from {journal.source}, {phase_said(target, journal)}"


def running_message(target: Target, journal: Journal | None, display: str, holder: str) -> str:
    """``--current`` while a migrate holds the lock on ``target``: it is running, not interrupted; nothing
    is to be resumed or rolled back (``--abort`` is refused while it runs)."""
    doing = f" ({journal.revision} {journal.direction} from {journal.source}, {journal.phase_name})" if journal else ""
    return (f"a clef-format migrate (pid {holder}) is running on {display} now{doing}: wait for it to finish, "
            f"then clef-format migrate {quote_path(display)} --current shows the result")


def litter_message(target: Target, display: str) -> str:
    """``--current`` about a workspace or lock with no journal: migrate's litter, or someone's folder."""
    lock = foreign_lock(target.lock_path)
    if lock:
        return (f"{target.lock_path}: {lock}: migrate refuses to run on {display} until it is moved away (it may "
                "be your data); nothing removes it for you")
    foreign = os.path.lexists(target.ws) and (not os.path.isdir(target.ws) or bool(foreign_entries(target.ws)))
    if foreign:
        return (f"{what(target, None)}: migrate refuses to run on {display} until it is moved away "
                "(it may be your data); nothing removes it for you")
    return (f"a migrate run left litter beside {display} ({what(target, None)}): clef-format migrate "
            f"{quote_path(display)} --abort removes it")


def resume_fix(target: Target, journal: Journal | None, display: str) -> str:
    """What to run about it: the command that resumes it (an --output run), and the one that rolls it back."""
    if journal is not None and not journal.in_place and os.path.islink(target.path):  # the output became a link
        return link_fix(display)
    if journal is not None and journal.in_place:  # PATH is gone: the fallback swap's two renames, or moved away
        undo = pending_decision(target, None, abort=True, journal=journal)
        if undo is not None and undo.action is Action.UNSWAP:  # the original is parked in the workspace
            return (f"clef-format migrate {quote_path(display)} --abort puts the original tree back (it is complete "
                    f"in {target.ws})")
        return (f"clef-format migrate {quote_path(display)} --abort removes its workspace (it holds only the run's "
                "staged work; the checkpoint, wherever it is now, was never changed)")
    back = f"clef-format migrate {quote_path(display)} --abort rolls it back"
    refused = pending_decision(target, None, abort=True, journal=journal) if journal is not None else None
    if refused is not None and refused.action is Action.REFUSE:  # the new tree at the output changed since
        back = would_do(f"clef-format migrate {quote_path(display)} --abort", foretold(refused), "rolls it back")
    if journal is None:  # before its journal was first written, or after its cleanup removed it
        done = os.path.isdir(target.path) and bool(os.listdir(target.path))
        return (f"clef-format migrate {quote_path(display)} --abort removes what it left (nothing in it is needed); "
                + (f"{display} holds the finished result" if done else "then run the migration again"))
    if journal.source is None:
        return f"{back}; then run the migration again"  # nothing of it can be resumed
    from clef_format.migrate.swap import was_swapped

    if journal.phase in (Phase.STAGING, Phase.STAGED) and not was_swapped(target, journal) and output_filled(target):
        # someone put files at the --output since: a resumed run is refused for them (session's filled-output rule)
        folder = os.path.isdir(target.path) and not os.path.islink(target.path)
        return (f"{display} {'holds files' if folder else 'is a file'} now, so resuming it would be refused: {back} "
                f"(the --output and {'its files' if folder else 'that file'} are kept); or "
                f"{'empty' if folder else 'move away'} {display}, then clef-format migrate {quote_path(journal.source)} "
                f"--to {journal.to_layout} --output {quote_path(display)} resumes it")
    return (f"clef-format migrate {quote_path(journal.source)} --to {journal.to_layout} --output {quote_path(display)} "
            f"resumes it; {back}")


def not_found(path: str, exc: PathNotFound, found: tuple[Target, Journal | None] | None) -> PathNotFound:
    """The ``path-not-found`` of migrate, saying what to run."""
    if found is None:
        return PathNotFound(f"{exc}; no interrupted migrate into it either (nothing beside it)", fix=exc.fix)
    return PathNotFound(f"{path} does not exist: an interrupted migrate into it waits beside it "
                        f"({what(*found)})", fix=resume_fix(found[0], found[1], path))


def report_interrupted(target: Target, journal: Journal | None, display: str, *, current: bool,
                       dry_run: bool) -> Report:
    """``migrate T --current`` / ``--abort [--dry-run]`` for an absent ``T`` (or one that became a symlink
    since the run was killed): say what waits beside it, or
    roll it back (the source of an --output run is never touched: it was only read)."""
    details = MigrateDraft(journal.from_layout if journal else None, journal.to_layout if journal else None, dry_run,
                           None)
    report = ReportDraft(display, None, details)
    if current:
        from clef_format.migrate.workspace import lock_holder

        details.revision = None
        details.pending = pending_said(target, journal)
        holder = lock_holder(target)
        if holder is not None:  # running, not interrupted: nothing pending
            details.message = running_message(target, journal, display, holder)
            details.pending = None
        elif os.path.lexists(target.ws) and os.path.islink(os.path.abspath(display)):
            undo = pending_decision(target, None, abort=True, journal=journal)
            then = (f"clef-format migrate {quote_path(display)} --abort would be refused: {undo.note} (fix: {undo.fix})"
                    if undo is not None and undo.action is Action.REFUSE else link_fix(display))
            details.message = (f"{display} is now a symlink (to {os.path.realpath(display)}): an interrupted "
                               f"migrate into it waits beside it ({what(target, journal)}); {then}")
        elif os.path.lexists(target.ws) and os.path.lexists(display):  # a file put where the output was to be
            details.message = (f"{display} is a file now, not a folder: an interrupted migrate into it waits beside it "
                               f"({what(target, journal)}); {resume_fix(target, journal, display)}"
                               f"{refused_now(target)}")
        elif os.path.lexists(target.ws):
            details.message = (f"{display} does not exist: an interrupted migrate into it waits beside it "
                               f"({what(target, journal)}); {resume_fix(target, journal, display)}"
                               f"{refused_now(target)}")
        else:
            details.message = (f"{display} does not exist; only the lock of a killed migrate into it is left "
                               f"({target.lock_path}): clef-format migrate {quote_path(display)} --abort removes it")
        return report.freeze("migrate")
    from clef_format.migrate.preflight import preflight

    # the rollback deletes the workspace beside T: a read-only folder refuses it before anything is removed
    problems = preflight(target, None, False, check_lock=False) if os.path.lexists(target.ws) else []
    if dry_run:
        decided = pending_decision(target, None, abort=True)
        will = foretold(decided)
        details.recovery = will
        details.message = f"--abort would do this: {will}" if will else "no interrupted migration to roll back"
        if decided is not None and decided.action is Action.REFUSE:  # as the --abort itself refuses: an error
            details.message = f"--abort would be refused: {decided.note}"  # as session's dry run says it
            report.findings.append(error("migrate-refused", details.message, fix=decided.fix))
        for problem in problems[:1]:  # as the --abort itself stops
            report.findings.append(error(problem.code, problem.message, fix=problem.fix))
            details.message = f"--abort would be refused: {problem.message}"
        return report.freeze("migrate")
    if problems:
        report.findings.append(error(problems[0].code, problems[0].message, fix=problems[0].fix))
        return report.freeze("migrate")
    stale_lock = not os.path.lexists(target.ws)
    try:
        with Lock(target):  # refused while the run is still alive; removes a killed run's lock on the way out
            note = recover(target, None, abort=True)
    except Refused as exc:
        report.findings.append(error(exc.code, exc.message, fix=exc.fix))
        return report.freeze("migrate")
    except OSError as exc:
        report.findings.append(error("migrate-failed", f"rolling back the interrupted migration failed: "
                                                       f"{exc.strerror or exc}", fix=f"clef-format migrate {quote_path(display)} "
                                                       "--abort (after freeing the cause above)"))
        return report.freeze("migrate")
    if note:
        details.recovered.append(note)
        report.findings.append(info("migrate-recovered", note))
    details.message = note or ("no interrupted migration to roll back" +
                                       ("; removed the lock a killed run had left" if stale_lock else ""))
    if os.path.isdir(target.path):
        report.layout = str(read_checkpoint(target.path).layout)
    return report.freeze("migrate")
