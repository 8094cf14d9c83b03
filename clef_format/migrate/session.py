"""One ``clef-format migrate`` call: refuse early, recover, plan, verify, apply -> a Report.

Each tree is read, walked and verified once: the source is read after its state is taken (the state
proves, right before the swap, that nothing changed since), surveyed and verified once, and the
journal is read once (under the lock); the verify of the staged tree is the final report.

The order of decisions, each of which ends the call with the checkpoint unchanged when it says no:
snapshot without --output; target not writable; lock held by another run; an interrupted run
(resumed, finished or rolled back first); no route between the layouts; verify errors the step
does not fix; a tables file that does not verify (repair); not enough free space.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from clef_format.errors import CouldNotRun, MigrateRefused, NonFiniteRows, PathNotFound, Refused, UsageError
from clef_format.migrate.apply import SourceChanged, run_plan
from clef_format.migrate.crash import check_crash_env
from clef_format.migrate.details import MigrateDraft, StepResult
from clef_format.migrate.fsutil import TreeTooDeep
from clef_format.migrate.preflight import carried_by_link, check_space, preflight, survey
from clef_format.migrate.recovery import ANY_STEP, Action, Decision, carry_out, pending_said
from clef_format.migrate.swap import CleanupIncomplete, SwapFailed
from clef_format.migrate.tree_state import TreeState, snapshot
from clef_format.migrate.workspace import (
    Journal,
    Lock,
    Phase,
    Target,
    make_target,
    output_filled,
    read_journal,
    workspace_holding,
)
from clef_format.spec.workspace_names import workspace_owner
from clef_format.migrate.plan import Plan
from clef_format.progress import Progress
from clef_format.read.checkpoint import Checkpoint, read_checkpoint
from clef_format.read.paths import inside
from clef_format.report import Report, ReportDraft
from clef_format.shell import quote_path
from clef_format.spec.findings import Finding, error, info, warning
from clef_format.spec.layouts import Layout

TYPE_CHECKING = False
if TYPE_CHECKING:
    from clef_format.migrations import Edge


@dataclass
class Options:
    to: str = Layout.LAYOUT_2
    output: str | None = None
    dry_run: bool = False
    abort: bool = False
    current: bool = False


def _blocking(ck: Checkpoint, plan: Plan, display: str) -> list[Finding]:
    """Verify errors the step cannot fix: reasons to refuse."""
    from clef_format.verify.run import verify_checkpoint

    report = verify_checkpoint(ck, display)
    return [f for f in report.findings if f.severity == "error" and f.code not in plan.fixes]


def _deep_refusal(ck: Checkpoint, edge: Edge, dry_run: bool) -> Refused | None:
    if not edge.step.deep_check:
        return None
    if not dry_run and edge.direction in edge.step.stream_checked:
        return None  # the step's writer refuses the same rows while streaming, before anything is swapped in
    from clef_format.migrate.inspect import table_content_problems

    bad = table_content_problems(ck)
    if bad:
        first = bad[0]
        if first.code == "table-nonfinite":  # a source table: quantizing it would hide the rows
            return Refused("table-nonfinite", f"{first.message}; nothing was changed", first.fix)
        return MigrateRefused(f"{first.message}: the tables do not follow the format; "
                              f"{edge.revision} would serve or decode them", first.fix)
    return None


def _check_output(target: Target, root: str, abort: bool = False) -> None:
    if target.in_place:
        return
    real_root = os.path.realpath(root)
    if inside(target.path, real_root):
        raise UsageError(f"--output {target.path} is inside the checkpoint", fix="pick a directory outside it")
    owner = workspace_owner(os.path.basename(target.path))
    if owner is not None:  # a later run on `owner` would take the folder for its own workspace or lock
        raise UsageError(f"--output {target.path}: the name is the one migrate keeps for the workspace or lock of "
                         f"{os.path.join(target.parent, owner)}", fix="pick an --output whose name does not start "
                                                                      "with '.' and end in .clef-migrate[.lock]")
    if not os.path.isdir(target.parent):  # a usage slip, like a path that does not exist: exit 2
        raise UsageError(f"--output {target.path}: its parent folder {target.parent} does not exist",
                         fix=f"create {target.parent} first, or pick an --output in an existing folder")
    if abort:  # --abort writes nothing at the --output: what is there is no reason to refuse it
        return
    if os.path.lexists(target.path) and read_journal(target) is None and not os.path.isdir(target.ws):
        _refuse_a_filled_output(target)


def _refuse_beside_an_in_place_run(target: Target, display: str) -> None:
    """An --output run from a source whose own in-place migrate waits interrupted: the tree at the source
    may be that run's new tree (its int8 tables decode only approximately), and the exact original is
    parked in the workspace. Reading it now would build the output from the wrong tree: finish or roll
    back the interrupted run first."""
    from clef_format.migrate import pending

    in_place = make_target(target.source, None)
    journal = read_journal(in_place)
    if journal is not None:
        q = quote_path(display)
        raise MigrateRefused(f"an interrupted in-place migrate of {display} waits ({pending.what(in_place, journal)}): "
                             f"until it is finished or rolled back, the tree at {display} may be its new tree (after "
                             "its swap the original is parked in its workspace); nothing was written",
                             f"clef-format migrate {q} --abort puts the original back (or clef-format migrate {q} "
                             f"--to {journal.to_layout} finishes it); then run this again")


def _never_swapped(decided: Decision | None) -> bool:
    """Whether the interrupted run's journal proves it never swapped a tree in (it was staging, or staged
    and rolled back): then nothing at its --output is its result."""
    return (decided is not None and decided.journal is not None and decided.action in (Action.RESUME, Action.REMOVE)
            and decided.journal.phase in (Phase.STAGING, Phase.STAGED))


def _refuse_a_filled_output(target: Target) -> None:
    """An --output must be new or an empty folder: what is there is someone's, and never the source."""
    if output_filled(target):
        raise UsageError(f"--output {target.path} exists and is not an empty directory", fix="pick a new or empty directory")


def _filled_output_refusal(target: Target, decided: Decision | None, display: str, output: str | None,
                           dry_run: bool = False) -> UsageError | None:
    """The refusal of a resumed --output run whose --output someone made or filled since the run was
    killed (None: none). The journal proves the run never swapped a tree in, so what is there is theirs.
    It says what became of the interrupted run's staged work (rolled back, or waiting in its workspace)
    and, with ``dry_run``, that this is what the run would do. ``display`` and ``output`` are PATH and
    --output as typed, for the fix."""
    if target.in_place or not _never_swapped(decided) or not output_filled(target):
        return None
    assert decided is not None  # _never_swapped
    if decided.action is Action.REMOVE:
        staged = f"; {'it would first have ' if dry_run else ''}{decided.note}"
        fix = "pick a new or empty directory"
    else:  # the staging waits in its workspace beside the --output: --abort removes it, the --output stays
        staged = "; the interrupted run's staged work waits in its workspace beside it"
        fix = (f"pick a new or empty directory; clef-format migrate {quote_path(display)} --abort --output "
               f"{quote_path(output or target.path)} removes the staged work (the --output is kept)")
    said = "this run would be refused: " if dry_run else ""
    return UsageError(f"{said}--output {target.path} exists and is not an empty directory{staged}", fix=fix)


def _refuse_cache(target: Target, ck: Checkpoint, display: str, opts: Options) -> None:
    """Nothing is ever written under a Hugging Face cache: not the result, not the lock or workspace."""
    from clef_format.read.hf_cache import cache_area

    if target.in_place and (ck.hf_snapshot or cache_area(target.path)):
        raise MigrateRefused(f"{display} is a Hugging Face cache snapshot: its files are shared blobs "
                             "and are never written", f"clef-format migrate {quote_path(display)} --to {opts.to} --output DIR")
    for place in (target.path, target.parent):
        area = cache_area(place)
        if area:
            raise MigrateRefused(f"--output {target.path} lies inside a Hugging Face cache ({area}), "
                                 "which clef-format never writes", "pick an --output outside the cache")


def migrate_path(path: str, opts: Options, progress: Progress | None = None) -> Report:
    """``clef-format migrate PATH``: find the checkpoint (a directory or a cached repo id), then ``migrate``.

    Raises ``PathNotFound`` or ``CouldNotRun`` (permission denied) before anything is read.
    """
    from clef_format.read.hf_cache import locate_checkpoint

    check_crash_env()
    from clef_format.migrate import pending

    beside = pending.interrupted_beside_link(path)  # PATH became a symlink after a run into it was killed
    if beside is not None and (opts.abort or opts.current):
        return pending.report_interrupted(*beside, path, current=opts.current, dry_run=opts.dry_run)
    try:
        root = locate_checkpoint(path)
    except PathNotFound as exc:  # an interrupted run into PATH keeps its workspace beside it: look there
        # (absent, or a file put where the run's --output was to be: --current and --abort still reach the run)
        found = None if os.path.isdir(path) else pending.interrupted_at(path)
        if found is not None and (opts.abort or opts.current):
            return pending.report_interrupted(*found, path, current=opts.current, dry_run=opts.dry_run)
        if os.path.exists(path):  # there, and not a folder: the refusal every command gives (read.paths.not_a_folder)
            raise
        raise pending.not_found(path, exc, found) from None
    if not os.access(root, os.R_OK | os.X_OK):
        raise CouldNotRun(f"{path}: permission denied", fix="run as a user who can read the checkpoint")
    return migrate(root, path, opts, progress)


def migrate(root: str, display: str, opts: Options, progress: Progress | None = None) -> Report:
    """Run (or plan) the migration of the checkpoint at ``root`` to ``opts.to``."""
    from clef_format import migrations
    from clef_format.migrate import pending

    target = make_target(root, opts.output)
    # the one walk of the source, before it is read: the state it records is what the run proves unchanged
    # right before the swap, so the read that follows serves the run (unless a recovery changes the tree);
    # what it finds is said where the survey belongs in the order of refusals (``Survey.check``)
    surveyed = None if opts.current else survey(root, target.in_place)
    ck = read_checkpoint(root, display)
    named = display if opts.output is None else opts.output  # what the fixes call the result: the --output as typed
    if ck.unreadable:
        first = next(f for f in ck.findings if f.code == "unreadable")
        raise CouldNotRun(f"{display}: {first.message}; nothing was written", fix=first.fix)
    details = MigrateDraft(str(ck.layout), opts.to, opts.dry_run, opts.output)
    report = ReportDraft(display, str(ck.layout), details)
    held = workspace_holding(root)
    if held is not None:  # a run's own tree, never a checkpoint: migrating it would convert the parked original
        ws, owner = held
        report.findings.append(error(
            "migrate-refused", f"{display} lies in {ws}, the workspace of an interrupted migrate of {owner}: the tree "
            "there is that run's (the original it parked, or its staged work), not a checkpoint to migrate (a shell "
            f"that was inside {owner} when the run swapped it is now there); nothing was written",
            fix=f"cd {quote_path(os.path.dirname(owner))}; clef-format migrate {quote_path(owner)} --current says "
                "what waits and the command that finishes or rolls it back"))
        return report.freeze("migrate")
    if opts.current:
        journal = read_journal(target)
        details.revision = migrations.revision_of(str(ck.layout))
        details.pending = pending_said(target, journal)

        from clef_format.verify.checks.layout import check_layout

        report.findings.extend(check_layout(ck))  # what the layout means for serving, as verify says it
        from clef_format.migrate.workspace import lock_holder

        holder = lock_holder(target)
        if holder is not None:  # not interrupted: running now (it holds its lock), so nothing to resume or abort
            details.message = pending.running_message(target, journal, display, holder)
            details.pending = None
        elif journal and journal.in_place is False:  # PATH is the output of an interrupted --output run
            details.message = (f"an interrupted migrate into {display} waits ({pending.what(target, journal)}): "
                               f"{pending.resume_fix(target, journal, display)}{pending.refused_now(target)}")
        elif journal:
            from clef_format.migrate.recovery import pending_recovery, would_do

            run = f"clef-format migrate {quote_path(display)}"
            will = would_do(f"{run} --to {journal.to_layout}", pending_recovery(target, ck, journal=journal),
                            "would resume its staging")
            back = would_do(f"{run} --abort", pending_recovery(target, ck, abort=True, journal=journal),
                            "would find nothing to roll back")
            details.message = (f"an interrupted migrate waits ({pending.what(target, journal)}): {will}; {back}"
                               f"{pending.refused_now(target)}")
        if holder is None and journal is None and (os.path.lexists(target.ws) or os.path.lexists(target.lock_path)):
            details.message = pending.litter_message(target, display)
        outputs = pending.outputs_beside(target.source) if target.in_place else []
        if outputs:  # an --output run from this checkpoint, interrupted, with its workspace in the same folder
            details.pending_outputs = [t.path for t, _ in outputs]
            details.message = "; ".join(
                f"an interrupted migrate from here into --output {t.path} waits ({pending.what(t, j)}): "
                f"{pending.resume_fix(t, j, t.path)}{pending.refused_now(t)}" for t, j in outputs)
        return report.freeze("migrate")
    try:
        for into in (display, opts.output):  # a run into a name that became a symlink after it was killed
            beside = pending.interrupted_beside_link(into) if into else None
            if into and beside is not None and opts.abort and into == opts.output:  # SRC --output OUT --abort
                return pending.report_interrupted(*beside, into, current=False, dry_run=opts.dry_run)
            if into and beside is not None:
                raise pending.link_refusal(into, beside)
        _check_output(target, root, opts.abort)
        if not target.in_place and not opts.abort:
            _refuse_beside_an_in_place_run(target, display)
        if not opts.abort and _nothing_to_do(ck, target, opts):
            return _already_there(ck, target, opts, report, display).freeze("migrate")
        _refuse_cache(target, ck, display, opts)
        assert surveyed is not None
        entries = surveyed.check()
        if opts.dry_run:
            return _dry_run(ck, target, opts, report).freeze("migrate")
        problems = preflight(target, None, ck.hf_snapshot, check_lock=False)
        if problems:
            raise problems[0]
        cwd = _cwd()
        with Lock(target):
            journal = read_journal(target)  # the one read of this call: what follows is given it
            try:
                _refuse_another_source(target, display, journal)
                decided = carry_out(target, ck, abort=opts.abort, wanted=_first_step(journal, opts.to), journal=journal)
            except OSError as exc:
                report.findings.append(error("migrate-failed", f"finishing the interrupted migration failed: "
                                                               f"{exc.strerror or exc}",
                                             fix=f"clef-format migrate {quote_path(display)} --abort (or free the cause above "
                                                 "and run it again)"))
                return report.freeze("migrate")
            note = decided.note if decided else None
            if note:
                details.recovered.append(note)
                report.findings.append(info("migrate-recovered", note))
            if opts.abort:
                details.message = note or _nothing_to_abort(target, display)
                # an --output the run had created is gone again: nothing is there to have a layout
                report.layout = str(read_checkpoint(root).layout) if os.path.isdir(root) else None
                return report.freeze("migrate")
            finished_output = False
            refusal = _filled_output_refusal(target, decided, display, opts.output)  # the run put nothing there: it is someone's
            if refusal is not None:
                raise refusal
            if not target.in_place and os.path.isdir(target.path) and os.listdir(target.path):
                target = Target(target.path, target.path, True)  # a recovered output: go on from there
                finished_output = True
            given = Given(entries=entries, journal=decided.journal if decided and decided.action is Action.RESUME
                          else None, preflighted=True)
            if decided is None and not finished_output and surveyed.state is not None and ck.root == target.source:
                before = surveyed.state  # no interrupted run: nothing changed the tree since it was surveyed and read
            else:  # a recovery changed it, or the read named it by another path: read it again
                try:
                    before = snapshot(target.source, frozenset() if target.in_place else frozenset({".cache"}))
                except TreeTooDeep as exc:  # nested past the limit since the survey: refused as the survey does
                    raise MigrateRefused(f"{exc.strerror} (tree-too-deep): migrate carries no folder below that; "
                                         "nothing was written", "remove the deeply nested folders, then run "
                                         "migrate again") from None
                # read after its state was taken: a change since is seen
                ck = read_checkpoint(target.source, named if finished_output else display)
                given = Given(journal=given.journal)  # surveyed and preflighted again, as a new source
            _run_steps(ck, target, opts, report, display, progress, before, given, named)
            if finished_output and not details.steps and note:
                details.message = (f"{note}: --output {target.path} holds the {report.layout} result; "
                                   f"{display} was only read")
        _say_cwd(cwd, target, report)
    except Refused as exc:  # a step's refusal may name no fix: the checkpoint itself is then what is wrong
        report.findings.append(error(exc.code, exc.message, fix=exc.fix or f"clef-format verify {quote_path(display)} names what "
                                     "is wrong with the checkpoint; repair or download it again, then migrate"))
    except OSError as exc:  # outside a step's own handling: say what failed and what to run
        where = f" ({exc.filename})" if exc.filename else ""
        report.findings.append(error("migrate-failed", f"migrate stopped: {exc.strerror or exc}{where}; any staged work "
                                                       "is kept in its journal", fix=f"clef-format migrate {quote_path(display)} "
                                                       f"--to {opts.to} (resumes or rolls back), or --abort"))
    return report.freeze("migrate")


@dataclass
class Given:
    """What the first step of a run is given rather than reading or checking again: the source's survey
    (taken since its state), the journal read under the lock after any recovery (None: no workspace is
    left) and whether the target's preflight is done."""

    entries: list[str] | None = None
    journal: Journal | None = None
    preflighted: bool = False  # the target's preflight (all but the space, which needs the plan) is done


def _details(report: ReportDraft) -> MigrateDraft:
    """migrate's own keys under construction (what ``migrate`` gave its draft)."""
    assert isinstance(report.details, MigrateDraft)
    return report.details


def _nothing_to_do(ck: Checkpoint, target: Target, opts: Options) -> bool:
    """The checkpoint is at ``opts.to`` and no interrupted run (workspace or lock) waits at the target:
    nothing is planned, locked or written, for the dry run and the real run alike."""
    from clef_format import migrations

    return migrations.path(str(ck.layout), opts.to) == [] and not os.path.lexists(target.ws) \
        and not os.path.lexists(target.lock_path)


def _first_step(journal: Journal | None, to: str) -> tuple[str, str] | None:
    """(revision, direction) of the first step from where the interrupted run of ``journal`` started (its
    ``from``) to ``to``: the step that run should be, if this run continues it. None: nothing to do from
    there; ``ANY_STEP`` when there is no journal or no route (decided as before)."""
    from clef_format import migrations

    start = journal.from_layout if journal else None
    route = migrations.path(start, to) if isinstance(start, str) else None
    if route is None:
        return ANY_STEP
    return (route[0].revision, route[0].direction) if route else None


def _refuse_another_source(target: Target, display: str, journal: Journal | None) -> None:
    """An interrupted --output run from another source waits at the target (``journal``, read there):
    never finish or resume it in this run's name (its result is that source's)."""
    if target.in_place or not journal or journal.source in (None, target.source):
        return
    raise MigrateRefused(f"an interrupted migrate from {journal.source} into --output {target.path} "
                         f"waits there, not one from {display}; nothing was changed",
      f"clef-format migrate {quote_path(journal.source)} --to {journal.to_layout} --output {quote_path(target.path)} "
      f"finishes it, or clef-format migrate {quote_path(target.path)} --abort rolls it back; then run this again")


def _nothing_to_abort(target: Target, display: str) -> str:
    """``--abort`` with nothing interrupted at its target, naming the interrupted runs of the same source
    elsewhere (in place beside PATH, or into an --output beside it): the ``--abort`` that rolls each back."""
    from clef_format.migrate import pending

    said = "no interrupted migration to roll back" + ("" if target.in_place else f" into --output {target.path}")
    waiting = [(t, j, f"clef-format migrate {quote_path(display)} --abort --output {quote_path(t.path)}")
               for t, j in pending.outputs_beside(target.source) if t.path != target.path]
    in_place = make_target(target.source, None)
    journal = None if target.in_place else read_journal(in_place)
    if journal is not None:
        waiting.insert(0, (in_place, journal, f"clef-format migrate {quote_path(display)} --abort"))
    return "; ".join([said] + [f"an interrupted migrate {'into ' + t.path if not t.in_place else 'in place'} waits "
                               f"({pending.what(t, j)}): {cmd} rolls it back" for t, j, cmd in waiting])


def _nothing_message(target: Target, opts: Options, display: str, recovered: bool = False) -> str:
    """Why no step ran. After a recovery (``recovered``) the recovery did write (its cleanup, a swap):
    the message then says no step is left, never that nothing was written."""
    if recovered:
        return f"already at {opts.to} after the recovery above: no step left to run"
    message = f"already at {opts.to}: nothing to do, nothing written"
    if not target.in_place and target.source != target.path:
        made = "was left as it was" if os.path.lexists(target.path) else "was not created"
        message += f" (--output {target.path} {made}: {display} itself is the {opts.to} checkpoint)"
    return message


def _already_there(ck: Checkpoint, target: Target, opts: Options, report: ReportDraft, display: str) -> ReportDraft:
    """Nothing to do: the report is the source's verify report, and the result is the source."""
    details = _details(report)
    from clef_format.verify.run import verify_checkpoint

    details.message = _nothing_message(target, opts, display)
    final = verify_checkpoint(ck, display)
    report.layout = final.layout
    report.findings.extend(final.findings)
    if opts.dry_run:
        details.recovery = None
    else:
        details.result = target.source
    return report


def _cwd() -> str | None:
    try:
        return os.path.realpath(os.getcwd())
    except OSError:
        return None


def _say_cwd(cwd: str | None, target: Target, report: ReportDraft) -> None:
    """``migrate .`` from inside the checkpoint: the shell still sits in the old, deleted tree. Say so,
    and move this process into the new one."""
    details = _details(report)
    if cwd is None or not details.steps or not inside(cwd, target.path):
        return
    try:
        os.chdir(cwd)
    except OSError:
        os.chdir(target.path)
    report.findings.append(warning("workdir-replaced", f"your working directory was inside {target.path}, which "
                                                       "was replaced by the new tree: your shell still shows the old, "
                                                       "deleted folder", fix=f"cd {quote_path(cwd)}"))


def _route(ck: Checkpoint, to: str) -> list[Any]:
    from clef_format import migrations

    route = migrations.path(str(ck.layout), to)
    if route is None and ck.layout is Layout.ORIGINAL_RELEASE:  # verify finds nothing wrong with it: no verify advice
        from clef_format.spec.compat import PLUGIN

        raise MigrateRefused(f"no migration leads from {ck.layout} to {to}: the original BF16 release is served "
                             f"with transformers, not {PLUGIN}, and no step makes a split build from it",
                             "download a quantized split build of clef-flash")
    if route is None:
        raise MigrateRefused(f"no migration leads from {ck.layout} to {to}",
          f"run clef-format verify {quote_path(ck.name)} and fix (or re-download) what it reports")
    return route


def _refuse_blocking(ck: Checkpoint, plan: Plan, display: str, edge: Any, dry_run: bool = False,
                     downloaded: bool = True, in_place: bool = True) -> None:
    blocking = _blocking(ck, plan, display)
    if blocking:
        summary = "; ".join(f"{f.code} ({f.message})" for f in blocking[:5])
        raise MigrateRefused(f"verify reports errors that {edge.revision} cannot fix: {summary}",
          blocking[0].fix or f"run clef-format verify {quote_path(display)}")
    deep = _deep_refusal(ck, edge, dry_run)
    if deep:
        raise deep
    if downloaded:  # the user's files (a later step's input is migrate's own, its references fresh)
        _refuse_unproven_replacements(ck, plan, display, edge, every_file=not in_place)


def _refuse_unproven_replacements(ck: Checkpoint, plan: Plan, display: str, edge: Any, every_file: bool = False) -> None:
    """A file migrate replaces or removes loses its reference (download metadata, manifest entry): it is
    first checked against it, or a corrupted download would come out vouched for by a fresh manifest.
    ``every_file`` (out of place): download metadata and cache blob names stay with the source, so every
    file is checked, and the output's manifest then vouches only for bytes that matched."""
    from clef_format.read.manifest import MANIFEST_NAME, read_manifest
    from clef_format.verify.deep import reference_findings

    entries, problems = read_manifest(ck)
    broken = [f for f in problems if f.severity == "error"] if entries is None else []
    if broken:  # it could not be checked against, and would be left describing the files replaced
        raise MigrateRefused(f"{MANIFEST_NAME} cannot be used ({broken[0].message}): the files migrate "
                             "replaces cannot be checked against it; nothing was changed",
          f"restore {MANIFEST_NAME} from the download, or remove it (clef-format manifest {quote_path(display)} "
          "writes a new one), then run clef-format migrate again")
    replaced = {o.rel for o in plan.outputs if o.rel in ck.files} | set(plan.removed)
    checked = replaced | (set(ck.files) if every_file else set())
    bad = [f for f in reference_findings(ck, sorted(checked)) if f.severity == "error"]
    unreadable = [f for f in bad if f.code == "unreadable"]
    if unreadable:
        raise CouldNotRun(f"{display}: {unreadable[0].message}; nothing was written", fix=unreadable[0].fix)
    if bad:
        what = (f"replace {bad[0].file} and drop the record it fails" if bad[0].file in replaced else
                f"copy {bad[0].file} to an output that keeps no record of the download")
        raise Refused("hash-mismatch", f"{bad[0].message}: {edge.revision} would {what}, so nothing could find the "
                                       "damage later; nothing was changed",
                      f"re-download {bad[0].file} (clef-format verify --deep {quote_path(display)} lists every file that fails)")


def _dry_run(ck: Checkpoint, target: Target, opts: Options, report: ReportDraft) -> ReportDraft:
    details = _details(report)
    from clef_format.migrate.recovery import foretold, pending_decision

    assert report.path is not None  # migrate's report always names the PATH it was given
    journal = read_journal(target)
    _refuse_another_source(target, report.path, journal)
    decided = pending_decision(target, ck, abort=opts.abort, wanted=_first_step(journal, opts.to), journal=journal)
    will = details.recovery = foretold(decided)
    if decided is not None and decided.action is Action.REFUSE:  # the run would stop there: nothing else to plan
        said = f"{'--abort' if opts.abort else 'this run'} would be refused: {decided.note}"
        report.findings.append(error("migrate-refused", said, fix=decided.fix))
        if opts.abort:
            details.message = said
        return report
    if opts.abort:  # --abort only deals with an interrupted run: say what it would do, and nothing else
        details.message = f"--abort would do this: {will}" if will else _nothing_to_abort(target, report.path)
        problems = preflight(target, None, ck.hf_snapshot, check_lock=True) if will else []
        for problem in problems[:1]:  # the abort stops at the first, as the run does
            report.findings.append(error(problem.code, problem.message, fix=problem.fix))
            details.message = f"--abort would be refused: {problem.message}"
        return report
    first = preflight(target, None, ck.hf_snapshot, check_lock=False) if decided is not None else []
    if first:  # the run's first check, before its recovery: a read-only folder stops it there, as it does
        report.findings.append(error(first[0].code, first[0].message, fix=first[0].fix))
        return report
    refusal = _filled_output_refusal(target, decided, report.path, opts.output, dry_run=True)
    if refusal is not None:  # the run would stop there, as it does: nothing else to plan
        report.findings.append(error(refusal.code, str(refusal), fix=refusal.fix))
        return report
    after = _layout_after(decided) if target.in_place else None
    if after is not None and after != str(ck.layout):  # the recovery changes PATH's layout before any step
        from clef_format import migrations

        route = migrations.path(after, opts.to) or []
        if not route:
            details.message = f"already at {opts.to} once the recovery above is done: no step left to run"
    else:
        after = None
        route = _route(ck, opts.to)
        if not route:
            details.message = _nothing_message(target, opts, report.path)
    for i, edge in enumerate(route):
        if i == 0 and after is None:
            plan = edge.plan(ck)
            _refuse_blocking(ck, plan, report.path, edge, dry_run=True, in_place=target.in_place)
            by_link = carried_by_link(target, ck.hf_snapshot)
            details.steps.append(StepResult(plan.to_dict(by_link)))
            for problem in preflight(target, plan, ck.hf_snapshot, check_lock=True):
                report.findings.append(error(problem.code, problem.message, fix=problem.fix))
            try:
                st = os.statvfs(target.parent)
                details.space_free = st.f_bavail * st.f_frsize
            except OSError:
                details.space_free = None
        else:
            details.steps.append(StepResult({"revision": edge.revision, "direction": edge.direction,
                                             "from": edge.src, "to": edge.dst, "read": {}, "written": {},
                                             "removed": [], "carried": 0, "bytes_carried": 0,
                                             "notes": ["planned after the previous step has run" if i else
                                                       "planned after the recovery above has run"]}))
    if journal:
        details.pending = pending_said(target, journal)
    return report


def _layout_after(decided: Decision | None) -> str | None:
    """The layout PATH holds once the recovery ``decided`` is carried out, in place (None: it stays as read):
    a rollback puts the original back, a finished swap or cleanup leaves the new tree."""
    if decided is None or decided.journal is None:
        return None
    if decided.action is Action.UNSWAP:
        return decided.journal.from_layout
    if decided.action in (Action.SWAP, Action.FINISH_FALLBACK, Action.CLEANUP):
        return decided.journal.to_layout
    return None


def _run_steps(ck: Checkpoint, target: Target, opts: Options, report: ReportDraft, display: str,
               progress: Progress | None, before: TreeState | None = None, given: Given | None = None,
               named: str | None = None) -> None:
    """Run the route step by step. The last step's verify of its staged tree is the final report (the
    swap is a rename: the same bytes); only when no step ran is the result (the source) verified here.
    ``named``: what the final report's fixes call the result (the ``--output`` as typed, else ``display``)."""
    details = _details(report)
    named = named or display
    from clef_format.verify.run import verify_checkpoint

    given = given or Given()
    route = _route(ck, opts.to)
    if not route:
        details.message = _nothing_message(target, opts, display, bool(details.recovered))
    first = True
    final: Report | None = None
    while route:
        edge = route[0]
        plan = edge.plan(ck)
        _refuse_blocking(ck, plan, display, edge, downloaded=first, in_place=target.in_place)
        first = False
        if given.preflighted:  # the target was preflighted before the lock, and nothing changed it since
            check_space(plan, target, ck.hf_snapshot)
        else:
            problems = preflight(target, plan, ck.hf_snapshot, check_lock=False)
            if problems:
                raise problems[0]
        by_link = carried_by_link(target, ck.hf_snapshot)
        planned = plan.to_dict(by_link)
        try:
            result = run_plan(plan, ck, target, progress, before=before, entries=given.entries,
                              journal=given.journal, display=display, name=named)
        except SourceChanged as exc:
            redo = f"clef-format migrate {quote_path(display)} --to {opts.to}" + (
                f" --output {quote_path(opts.output)}" if opts.output else "")
            raise MigrateRefused(f"{exc.message}; {plan.revision} {plan.direction} did not run",
                                 f"{redo} redoes it on the new content (once nothing else writes the checkpoint)"
                                 ) from None
        except NonFiniteRows as exc:
            report.findings.append(error("table-nonfinite", f"{exc}: quantizing would hide them; nothing was changed",
                                         fix="re-download the backbone; a healthy table has no NaN/Inf rows"))
            return
        except CleanupIncomplete as exc:
            report.findings.append(error("migrate-failed", str(exc.strerror),
                                         fix=f"clef-format migrate {quote_path(display)} --to {opts.to}"))
            return
        except SwapFailed as exc:
            report.findings.append(error("migrate-failed", f"{plan.revision} {plan.direction}: {exc.strerror}",
                                         fix="see the message; clef-format migrate --dry-run shows what blocks it"))
            return
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if exc.errno in (28, 27, 122):  # ENOSPC, EFBIG, EDQUOT
                reason = f"the disk is full or the file size limit was hit ({exc.strerror})"
            report.findings.append(error("migrate-failed", f"{plan.revision} {plan.direction} failed: {reason}; "
                                         "the new files were removed and the checkpoint is exactly as it was",
                                         fix="free space, or use --output DIR on another disk" if exc.errno in (28, 27, 122)
                                         else None))
            return
        details.steps.append(StepResult(planned, result.quality, result.carried_by, result.seconds, result.entries))
        target = Target(target.path, target.path, True)
        final = result.report
        given = Given()  # the next step's tree is this step's result: surveyed by that step, no journal left
        from clef_format import migrations

        if final is not None and final.layout is not None and migrations.path(final.layout, opts.to) == []:
            break  # the result is at opts.to (its verify said so): nothing to plan, nothing to read again
        try:  # the state the next step (if any) is planned from; failing here, that step takes its own
            before = snapshot(target.path)
        except OSError:
            before = None
        ck = read_checkpoint(target.path, named)
        route = _route(ck, opts.to)
    done = target.path if details.steps else target.source  # no step ran: the source is the result
    if final is None or not details.steps:
        final = verify_checkpoint(read_checkpoint(done, named if details.steps else ck.name), display)
    report.layout = final.layout
    report.findings.extend(final.findings)
    details.result = done
