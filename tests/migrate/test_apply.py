"""apply in-process, on real workspace folders: the recovery decision of an interrupted run and what
recovering does with it, the crash hook, the lock, the swap, deleting what migrate made, preflight."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from clef_format import migrations
from clef_format.errors import MigrateRefused, Refused
from clef_format.migrate import crash, recovery, workspace
from clef_format.migrate.apply import _verify_staged
from clef_format.migrate.crash import CRASH_ENV
from clef_format.migrate.preflight import preflight, survey_source
from clef_format.migrate.recovery import _decide, pending_recovery, recover
from clef_format.migrate.swap import SwapFailed, swap_in
from clef_format.migrate.tree_state import record, snapshot
from clef_format.migrate.workspace import Lock, Target, fingerprint, make_target, read_journal, remove_tree, write_journal
from clef_format.read.checkpoint import read_checkpoint
from clef_format.spec import layouts as L
from tests.support.migrate import file_digests, run_json, siblings, verified

REVISION = "0001_int8_tables"


class Interrupted(Exception):
    """Raised by the test's SIGINT handler: the crash hook fired here."""


def _raise(signum: int, frame: object) -> None:
    raise Interrupted


@pytest.fixture
def crash_at(monkeypatch: pytest.MonkeyPatch):
    """``crash_at(spec, handler)``: arm CLEF_FORMAT_CRASH_AT with a fresh count and a SIGINT handler."""
    monkeypatch.setattr(crash, "_crash_counts", {})
    old = signal.getsignal(signal.SIGINT)

    def arm(spec: str, handler=_raise) -> None:
        monkeypatch.setenv(CRASH_ENV, spec)
        signal.signal(signal.SIGINT, handler)

    yield arm
    signal.signal(signal.SIGINT, old)



def journal_for(target: Target, phase: str, fp: dict, **extra: object) -> workspace.Journal:
    journal = {"version": workspace.JOURNAL_VERSION, "revision": REVISION, "direction": "upgrade", "from": "layout-1",
               "to": "layout-2", "source": target.source, "target": target.path, "in_place": target.in_place,
               "phase": phase, "fingerprint": fp, "done": {}, "quality": {}, **extra}
    os.makedirs(target.ws, exist_ok=True)
    write_journal(target, workspace.Journal.from_json(journal))
    assert read_journal(target).to_json() == journal  # the file says exactly what apply writes
    return workspace.Journal.from_json(journal)


def ino(path: str) -> list[int]:
    st = os.stat(path)
    return [st.st_dev, st.st_ino]


# ---- crash hook ------------------------------------------------------------------------------------

def test_crash_hook_signals_this_process_at_the_nth_point_of_its_phase(crash_at) -> None:
    crash_at("lock:2:INT")
    crash.crashpoint("journal")  # another phase: not counted
    crash.crashpoint("lock")  # the first lock point passes
    with pytest.raises(Interrupted):
        crash.crashpoint("lock")


def test_crash_hook_interrupts_even_with_sigint_blocked_in_the_inherited_mask(crash_at) -> None:
    """A process started by a thread that held SIGINT back inherits that mask: the hook's Ctrl-C stayed
    pending and the run finished unstopped (a main-tier test failed so, once, under load). The hook
    unblocks it and raises it in this thread, handled before the hook returns."""
    crash_at("lock:1:INT")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        with pytest.raises(Interrupted):
            crash.crashpoint("lock")
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_crash_hook_interrupts_a_process_started_with_sigint_ignored() -> None:
    """A test runner started in the background (``bash .ci/run &``, make under a non-interactive shell)
    passes SIGINT ignored to every process it starts: the hook's Ctrl-C did nothing and the run finished
    (test_a_shell_left_in_the_parked_original_cannot_migrate_it failed so in a backgrounded CI run)."""
    import subprocess
    import sys

    code = ("import os, signal\nfrom clef_format.migrate import crash\n"
            "assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN\n"
            "try:\n    crash.crashpoint('lock')\nexcept KeyboardInterrupt:\n    print('interrupted')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, CRASH_ENV: "lock:1:INT"},
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.returncode == 0 and proc.stdout == "interrupted\n", (proc.stdout, proc.stderr)


# ---- the journal and the decision about an interrupted run ----------------------------------------

def test_a_written_journal_reads_back(fresh) -> None:
    target = make_target(str(fresh("layout-1")), None)
    journal = journal_for(target, "staging", {})
    assert read_journal(target) == journal


@pytest.mark.parametrize("phase,extra", [("staging", {}), ("staged", {"new_ino": [2049, 12]}), ("swapped", {"new_ino": [1, 2]})])
def test_a_journal_file_of_each_phase_rewrites_byte_for_byte(fresh, phase: str, extra: dict) -> None:
    """The journal is the on-disk contract: a file written before the typed record (``json.dump(dict,
    indent=1)``, keys in this order) reads back and is written again byte for byte."""
    import json

    target = make_target(str(fresh("layout-1")), None)
    raw = {"version": workspace.JOURNAL_VERSION, "revision": REVISION, "direction": "upgrade", "from": "layout-1",
           "to": "layout-2", "source": target.source, "target": target.path, "in_place": True, "phase": phase,
           "fingerprint": {"config.json": [10, 20, 30]}, "done": {"a.safetensors": 5},
           "quality": {"t": {"max_abs": 0.5}}, **extra}
    os.makedirs(target.ws)
    before = json.dumps(raw, indent=1)
    Path(target.journal_path).write_text(before)
    journal = read_journal(target)
    assert journal.phase == phase and journal.done == {"a.safetensors": 5}
    write_journal(target, journal)
    assert Path(target.journal_path).read_text() == before


def test_an_interrupted_staging_resumes_silently_or_rolls_back_naming_the_step(fresh) -> None:
    root = fresh("layout-1")
    target = make_target(str(root), None)
    ck = read_checkpoint(root)
    journal_for(target, "staging", fingerprint(ck))
    os.makedirs(target.new)
    assert _decide(target, ck, abort=False).action == "resume"
    assert pending_recovery(target, ck) is None  # a resume is no recovery to announce
    assert pending_recovery(target, ck, abort=True) == (f"rolled back the interrupted migration {REVISION} upgrade; "
                                                        "the checkpoint was never changed")
    before = file_digests(root)
    assert recover(target, ck) == f"resuming the interrupted migration {REVISION} upgrade"
    assert file_digests(root) == before and os.path.isdir(target.new)  # nothing swapped in, the staging kept


def test_a_source_file_replaced_with_its_size_and_mtime_kept_is_a_changed_source(fresh) -> None:
    """Size and mtime alone passed a file swapped for another (same size, times copied, renamed into
    place): a staged tree of the old content would have been swapped in, a staging resumed on it."""
    root = fresh("layout-1")
    target = make_target(str(root), None)
    before = fingerprint(read_checkpoint(root))
    journal_for(target, "staged", before)
    os.makedirs(target.new)
    victim = root / L.HEAD_CONFIG
    other = root.parent / "replacement.tmp"
    data = victim.read_bytes()
    other.write_bytes(data.replace(b"{", b"{ ", 1)[:len(data)])  # same size, other bytes
    shutil.copystat(victim, other)
    os.replace(other, victim)
    ck = read_checkpoint(root)
    assert fingerprint(ck) != before  # what a staging's resume compares
    assert _decide(target, ck, abort=False).action == "remove"
    assert pending_recovery(target, ck) == (f"rolled back the interrupted migration {REVISION} upgrade: "
                                            "the checkpoint changed since")


@pytest.mark.parametrize("wanted,action", [(recovery.ANY_STEP, "resume"), ((REVISION, "upgrade"), "resume"),
                                           ((REVISION, "downgrade"), "remove"), (None, "remove")])
def test_a_staging_is_resumed_only_by_a_run_of_the_same_step(fresh, wanted, action: str) -> None:
    """A run to another layout, or one with nothing to do, said "resuming" and left the staging pending."""
    root = fresh("layout-1")
    target = make_target(str(root), None)
    ck = read_checkpoint(root)
    journal_for(target, "staging", fingerprint(ck))
    os.makedirs(target.new)
    decided = _decide(target, ck, abort=False, wanted=wanted)
    got, note = decided.action, decided.note
    assert got == action, note
    if action == "remove":
        now = "has nothing to do" if wanted is None else f"runs {REVISION} downgrade"
        assert note == f"rolled back the interrupted migration {REVISION} upgrade: this run {now}, so none of it was needed"
        assert pending_recovery(target, ck, wanted=wanted) == note


def test_a_staging_of_a_source_that_changed_is_rolled_back_not_resumed(fresh) -> None:
    root = fresh("layout-1")
    target = make_target(str(root), None)
    journal_for(target, "staging", fingerprint(read_checkpoint(root)))
    os.makedirs(target.new)
    (root / "tokenizer.json").write_text('{"changed": true}')
    ck = read_checkpoint(root)
    decided = _decide(target, ck, abort=False)
    assert (decided.action, decided.note) == (
        "remove", f"rolled back the interrupted migration {REVISION} upgrade: the checkpoint changed since")


def _exchanged(fresh, built, tmp: Path) -> tuple[Path, Target, dict]:
    """In place, killed right after the exchange: T holds the new tree, ws/new the original one, and the
    journal still says staged (its new_ino is the inode now at T)."""
    root = fresh("layout-1")
    target = make_target(str(root), None)
    original = file_digests(root)
    os.makedirs(target.ws)
    shutil.copytree(root, target.new, symlinks=True)
    shutil.rmtree(root)
    shutil.copytree(built("layout-2"), root, symlinks=True)
    journal_for(target, "staged", {}, new_ino=ino(str(root)), new_tree=record(snapshot(str(root))))
    return root, target, original


def test_abort_after_the_exchange_puts_the_original_tree_back(fresh, built, tmp_path: Path) -> None:
    root, target, original = _exchanged(fresh, built, tmp_path)
    decided = _decide(target, None, abort=True)
    action, note = decided.action, decided.note
    assert action == "unswap" and f"{REVISION} upgrade" in note and "is back at" in note
    assert recover(target, None, abort=True) == note
    assert file_digests(root) == original and siblings(root) == []


def test_abort_after_the_exchange_with_a_journal_that_records_no_new_tree_is_refused(fresh, built,
                                                                                   tmp_path: Path) -> None:
    """A journal of an earlier clef-format records no state of the new tree: nothing proves the tree at T
    unchanged, so the rollback that would delete it is refused, and nothing is touched."""
    root, target, original = _exchanged(fresh, built, tmp_path)
    raw = read_journal(target).to_json()
    del raw["new_tree"]
    write_journal(target, workspace.Journal.from_json(raw))
    new = file_digests(root)
    decided = _decide(target, None, abort=True)
    assert decided.action == "refuse" and "records nothing that proves the tree unchanged" in decided.note
    with pytest.raises(MigrateRefused) as err:
        recover(target, None, abort=True)
    assert err.value.fix == decided.fix and file_digests(root) == new and file_digests(target.new) == original


def test_recovery_after_the_exchange_records_the_swap_before_cleaning_up(fresh, built, tmp_path: Path,
                                                                       crash_at) -> None:
    root, target, _ = _exchanged(fresh, built, tmp_path)
    assert _decide(target, None, abort=False).action == "cleanup"
    crash_at("cleanup:1:INT")
    with pytest.raises(Interrupted):
        recover(target, None)
    assert read_journal(target).phase == "swapped"  # a later run no longer needs the inode to know


def test_recovery_finishes_a_fallback_swap_killed_between_its_renames(fresh, built) -> None:
    root = fresh("layout-1")
    target = make_target(str(root), None)
    os.makedirs(target.ws)
    os.rename(root, target.old)
    shutil.copytree(built("layout-2"), target.new, symlinks=True)
    journal_for(target, "staged", {}, new_ino=ino(target.new))
    assert _decide(target, None, abort=False).action == "finish-fallback"
    assert recover(target, None) == f"finished the interrupted migration {REVISION} upgrade (its new tree was complete)"
    assert verified(root)[:2] == ("layout-2", True) and siblings(root) == []


def test_recovery_swaps_in_a_staged_tree_of_an_unchanged_source(fresh, built) -> None:
    root = fresh("layout-1")
    target = make_target(str(root), None)
    ck = read_checkpoint(root)
    os.makedirs(target.ws)
    shutil.copytree(built("layout-2"), target.new, symlinks=True)
    journal_for(target, "staged", fingerprint(ck), new_ino=ino(target.new))
    note = recover(target, ck)
    assert note == f"finished the interrupted migration {REVISION} upgrade (its new tree was complete and verified)"
    assert verified(root)[:2] == ("layout-2", True) and siblings(root) == []


def test_a_swap_that_fails_before_the_new_tree_is_in_leaves_the_checkpoint_as_it_was(fresh) -> None:
    root = fresh("layout-1")
    target = make_target(str(root), None)
    before = file_digests(root)
    journal = journal_for(target, "staged", {})  # ws/new is gone: the exchange cannot happen
    with pytest.raises(SwapFailed) as err:
        swap_in(target, journal)
    assert "nothing was changed" in err.value.strerror
    assert file_digests(root) == before and siblings(root) == []


# ---- a real interrupted staging, resumed ----------------------------------------------------------

def test_a_staging_interrupted_before_verify_resumes_with_its_finished_files(fresh, tmp_path: Path, capsys,
                                                                            crash_at, monkeypatch) -> None:
    root = fresh("layout-1")
    out = tmp_path / "out"
    target = make_target(str(root), str(out))
    saved = tmp_path / "saved-ws"

    def keep_workspace(signum: int, frame: object) -> None:  # what a SIGKILL at this point leaves
        shutil.copytree(target.ws, saved, symlinks=True)

    crash_at("verify:1:INT", keep_workspace)
    rc, _ = run_json(capsys, str(root), "--output", str(out))
    monkeypatch.delenv(CRASH_ENV)
    assert rc == 0 and saved.is_dir()
    shutil.rmtree(out)
    shutil.copytree(saved, target.ws, symlinks=True)

    ck = read_checkpoint(root)
    plan = migrations.path("layout-1", "layout-2")[0].plan(ck)
    journal = read_journal(target)
    assert journal.phase == "staging" and journal.done == {o.rel: o.size for o in plan.outputs}
    assert pending_recovery(target, ck) is None
    assert pending_recovery(target, ck, abort=True) == (f"rolled back the interrupted migration {REVISION} upgrade; "
                                                        "the checkpoint was never changed")
    stamp = 1_000_000_000_000_000_000
    for o in plan.outputs:  # a finished file is kept as it is: its mtime tells
        os.utime(os.path.join(target.new, o.rel), ns=(stamp, stamp))

    rc, report = run_json(capsys, str(root), "--output", str(out))
    assert rc == 0 and report["layout"] == "layout-2", report
    assert verified(out)[:2] == ("layout-2", True) and siblings(out) == []
    assert {o.rel: (out / o.rel).stat().st_mtime_ns for o in plan.outputs} == {o.rel: stamp for o in plan.outputs}


def test_a_resumed_staging_rewrites_a_finished_file_cut_short(fresh, tmp_path: Path, capsys, crash_at,
                                                             monkeypatch) -> None:
    root = fresh("layout-1")
    out = tmp_path / "out"
    target = make_target(str(root), str(out))
    saved = tmp_path / "saved-ws"
    crash_at("verify:1:INT", lambda s, f: shutil.copytree(target.ws, saved, symlinks=True))
    rc, _ = run_json(capsys, str(root), "--output", str(out))
    monkeypatch.delenv(CRASH_ENV)
    assert rc == 0
    shutil.rmtree(out)
    shutil.copytree(saved, target.ws, symlinks=True)
    tables = Path(target.new) / L.TABLES
    os.truncate(tables, tables.stat().st_size - 100)  # the journal says done, the file says otherwise

    rc, report = run_json(capsys, str(root), "--output", str(out))
    assert rc == 0 and report["layout"] == "layout-2", report
    assert verified(out)[:2] == ("layout-2", True)


# ---- verify of the staged tree --------------------------------------------------------------------

def test_a_staged_tree_that_does_not_verify_is_refused_naming_its_errors(fresh, built, tmp_path: Path) -> None:
    root = fresh("layout-1")
    target = make_target(str(root), None)
    plan = migrations.path("layout-1", "layout-2")[0].plan(read_checkpoint(root))
    os.makedirs(target.ws)
    shutil.copytree(built("layout-2"), target.new, symlinks=True)
    tables = Path(target.new) / L.TABLES
    os.truncate(tables, tables.stat().st_size - 10)  # a tables file cut short
    from clef_format.verify.run import verify_checkpoint

    report = verify_checkpoint(read_checkpoint(target.new), str(root))
    errors = [f for f in report.findings if f.severity == "error"]
    assert errors
    with pytest.raises(OSError) as err:
        _verify_staged(plan, target, str(root))
    msg = err.value.strerror
    assert msg.startswith(f"the new files did not verify as layout-2 (got {report.layout}: ") and "nothing was changed" in msg
    assert f"{errors[0].code}: {errors[0].message}" in msg
    assert all(f"{f.code}: {f.message}" not in msg for f in report.findings if f.severity != "error")


# ---- the lock -------------------------------------------------------------------------------------

def test_a_lock_that_cannot_be_recorded_is_refused_and_removed(fresh) -> None:
    target = make_target(str(fresh("layout-1")), None)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))  # the pid cannot be written: EFBIG
    try:
        with pytest.raises(Refused) as err:
            Lock(target).__enter__()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)
    assert "cannot record the lock" in err.value.message
    assert not os.path.lexists(target.lock_path)


# ---- deleting what migrate made -------------------------------------------------------------------

def _mount_tmpfs(where: Path, opts: str = "size=1m") -> None:
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")


def test_a_tree_that_cannot_be_deleted_raises_naming_what_stayed(tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    _mount_tmpfs(mnt)
    try:
        ws = mnt / "ws"
        (ws / "sub").mkdir(parents=True)
        (ws / "sub" / "f").write_text("x")
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True, capture_output=True)
        with pytest.raises(OSError) as err:
            remove_tree(str(ws))
        assert err.value.strerror == f"cannot delete {ws}: Read-only file system"
        assert err.value.filename and os.path.basename(err.value.filename) == "f"  # the entry that stayed
        assert (ws / "sub" / "f").read_text() == "x"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_deleting_a_tree_with_a_mount_inside_refuses_before_deleting_anything(tmp_path: Path) -> None:
    """It used to delete what it could (the mounted files first), then fail on the mount point."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "mine.txt").write_text("migrate's")
    _mount_tmpfs(ws / "mnt")
    (ws / "mnt" / "theirs.txt").write_text("another disk's")
    try:
        with pytest.raises(OSError) as err:
            remove_tree(str(ws))
        assert err.value.strerror == f"{ws / 'mnt'} is a mount point: nothing below it is deleted (unmount it, then run again)"
        assert err.value.filename == str(ws)
        assert (ws / "mnt" / "theirs.txt").read_text() == "another disk's" and (ws / "mine.txt").is_file()
    finally:
        subprocess.run(["umount", "-l", str(ws / "mnt")], capture_output=True)


# ---- preflight and the survey of the source -------------------------------------------------------

def test_preflight_refuses_a_read_only_checkpoint(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    _mount_tmpfs(ck, "size=1m,ro")
    try:
        refusals = preflight(make_target(str(ck), None), None, False, check_lock=False)
    finally:
        subprocess.run(["umount", "-l", str(ck)], capture_output=True)
    assert all(isinstance(r, Refused) for r in refusals)
    assert [r.message for r in refusals] == [
        f"{ck} is a mount point: the new tree cannot replace it by rename; nothing was written",
        f"{ck} is read-only for this user; nothing was written"]


def test_in_place_survey_accepts_a_writable_folder_of_another_owner(fresh) -> None:
    root = fresh("layout-1")
    shared = root / "runs"
    shared.mkdir()
    (shared / "log.txt").write_text("x")
    os.chown(shared, 4242, 4242)
    shared.chmod(0o777)
    assert "runs/log.txt" in survey_source(str(root), in_place=True)
