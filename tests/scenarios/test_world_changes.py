"""The world changes while migrate runs: nothing the user had is lost.

Enumerated like the errno suite: at each phase boundary of an in-place migrate (the crash points of
``clef_format.migrate.crash``, met in-process through its ``adversary`` hook), one change is made to
the real source on the real filesystem, as another program would make it: an editor's save (write a
temporary file, rename it over), a file created, deleted, appended to, truncated, chmod-ed, a
``config.json`` edit, a symlink swapped in, a filesystem mounted, ``clef-format manifest`` run. Then
either the run went through and the change is in the result, or the run refused (``migrate-refused``,
exit 1) with the checkpoint as the change left it and no workspace or lock beside it.

Also here, each a data loss of the code before this suite: a mount point inside the checkpoint, the
checkpoint or ``--output`` being one, a symlink to a file of the checkpoint by a path that leaves it,
``example`` writing into a Hugging Face cache. Mounts are real (``mount -t tmpfs``, ``mount --bind``):
skipped where this user may not mount.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import pytest

from clef_format.migrate import crash
from tests.support.migrate import file_digests, run_json, siblings, verified

NOTE = b"a note the user keeps beside the weights\n"


def _mount(*args: str) -> None:
    proc = subprocess.run(["mount", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"mount {' '.join(args)} is not permitted here: {proc.stderr.strip()}")


def _umount_below(top: Path) -> None:
    """Unmount everything mounted under ``top`` (deepest first), wherever a swap moved it."""
    with open("/proc/self/mountinfo") as fh:
        points = [line.split(" ")[4] for line in fh]
    for p in sorted((p for p in points if p.startswith(str(top))), key=len, reverse=True):
        subprocess.run(["umount", "-l", p], capture_output=True)


@pytest.fixture
def mounts(tmp_path: Path):
    yield _mount
    _umount_below(tmp_path)


# ---- the changes: each makes one change at ``root`` and says whether a tree holds it -----------------

class Change:
    def __init__(self, name: str, make: Callable[[Path], None], holds: Callable[[Path], bool]) -> None:
        self.name, self.make, self.holds = name, make, holds


def _editor_save(root: Path) -> None:
    tmp = root / ".notes.txt.swp"
    tmp.write_bytes(NOTE + b"edited\n")
    os.replace(tmp, root / "notes.txt")


def _config_edit(root: Path) -> None:  # an editor's save of config.json with one value changed
    cfg = json.loads((root / "config.json").read_text())
    cfg["_name_or_path"] = "edited-by-the-user"
    tmp = root / "config.json.tmp"
    tmp.write_text(json.dumps(cfg, indent=2))
    os.replace(tmp, root / "config.json")


def _symlink_swap(root: Path) -> None:
    (root / "notes-v2.txt").write_bytes(NOTE + b"v2\n")
    tmp = root / ".notes.link"
    os.symlink("notes-v2.txt", tmp)
    os.replace(tmp, root / "notes.txt")


def _mount_tmpfs(root: Path) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "none", str(root / "data")], check=True)
    (root / "data" / "mounted.txt").write_bytes(b"on another filesystem\n")


def _append(root: Path) -> None:
    with open(root / "notes.txt", "ab") as fh:
        fh.write(b"appended\n")


def _chmod(root: Path) -> None:
    os.chmod(root / "notes.txt", 0o600)


CHANGES = [
    Change("editor-save", _editor_save, lambda r: (r / "notes.txt").read_bytes() == NOTE + b"edited\n"),
    Change("config-edit", _config_edit,
           lambda r: json.loads((r / "config.json").read_text()).get("_name_or_path") == "edited-by-the-user"),
    Change("create", lambda r: (r / "new.txt").write_bytes(b"new\n"),
           lambda r: (r / "new.txt").is_file() and (r / "new.txt").read_bytes() == b"new\n"),
    Change("delete", lambda r: (r / "notes.txt").unlink(), lambda r: not os.path.lexists(r / "notes.txt")),
    Change("append", _append, lambda r: (r / "notes.txt").read_bytes() == NOTE + b"appended\n"),
    Change("truncate", lambda r: os.truncate(r / "notes.txt", 0), lambda r: (r / "notes.txt").stat().st_size == 0),
    Change("chmod", _chmod, lambda r: (r / "notes.txt").stat().st_mode & 0o777 == 0o600),
    Change("symlink-swap", _symlink_swap,
           lambda r: (r / "notes.txt").is_symlink() and (r / "notes.txt").read_bytes() == NOTE + b"v2\n"),
    Change("mount", _mount_tmpfs,
           lambda r: (r / "data" / "mounted.txt").is_file() and os.path.ismount(r / "data")),
]

#: Crash points of an in-place layout-1 -> layout-2 run, recorded once (``_points``): the first and the
#: last of each phase, where the disk state changes.
_POINTS: list[tuple[str, int]] = []


def _points(fresh, capsys) -> list[tuple[str, int]]:
    if not _POINTS:
        root = _source(fresh)
        met: list[tuple[str, int]] = []
        with crash.adversary(lambda phase, n: met.append((phase, n))):
            rc, out = run_json(capsys, str(root), "--to", "layout-2")
        assert rc == 0, out
        last: dict[str, int] = {}
        for phase, n in met:
            last[phase] = max(n, last.get(phase, 0))
        _POINTS.extend(sorted({(p, 1) for p in last} | set(last.items()), key=lambda x: (crash.CRASH_PHASES.index(x[0]), x[1])))
    return list(_POINTS)


def _source(fresh) -> Path:
    root = fresh("layout-1")
    (root / "notes.txt").write_bytes(NOTE)
    os.chmod(root / "notes.txt", 0o644)
    (root / "data").mkdir()
    return root


@pytest.mark.parametrize("change", CHANGES, ids=[c.name for c in CHANGES])
def test_a_change_at_each_phase_boundary_is_kept_or_refused(fresh, capsys, mounts, change: Change,
                                                           tmp_path: Path) -> None:
    if change.name == "mount":
        probe = tmp_path / "probe"
        probe.mkdir()
        mounts("-t", "tmpfs", "none", str(probe))
        _umount_below(probe)
    points = _points(fresh, capsys)
    assert {p for p, _ in points} >= {"lock", "journal", "stage", "verify", "swap", "cleanup"}, points
    failures = []
    for phase, n in points:
        _umount_below(tmp_path)
        for name in ["ck", *siblings(tmp_path / "ck")]:
            if (tmp_path / name).is_dir():
                shutil.rmtree(tmp_path / name)
            elif os.path.lexists(tmp_path / name):
                os.unlink(tmp_path / name)
        root = _source(fresh)
        done: list[bool] = []

        def act(at: str, count: int) -> None:
            if (at, count) == (phase, n) and not done:
                done.append(True)
                change.make(root)

        with crash.adversary(act):
            rc, out = run_json(capsys, str(root), "--to", "layout-2")
        assert done, f"{phase}:{n} was never reached"
        codes = [f["code"] for f in out["findings"] if f["severity"] == "error"]
        where = f"{change.name} at {phase}:{n}"
        if not change.holds(root):
            failures.append(f"{where}: exit {rc} {codes}, the change is lost")
        elif rc == 1:
            if codes != ["migrate-refused"] or verified(root)[0] != "layout-1" or siblings(root):
                failures.append(f"{where}: refused as {codes}, layout {verified(root)[0]}, left {siblings(root)}")
        elif rc != 0 or verified(root)[:2] != ("layout-2", True):
            failures.append(f"{where}: exit {rc} {codes}, result {verified(root)}")
    assert not failures, "\n".join(failures)


def test_a_refusal_names_the_command_that_redoes_the_step(fresh, capsys) -> None:
    root = _source(fresh)

    def act(phase: str, n: int) -> None:
        if (phase, n) == ("verify", 1):
            _editor_save(root)

    with crash.adversary(act):
        rc, out = run_json(capsys, str(root), "--to", "layout-2")
    [finding] = [f for f in out["findings"] if f["severity"] == "error"]
    assert rc == 1 and finding["code"] == "migrate-refused", out
    assert "notes.txt was replaced" in finding["message"], finding
    assert finding["fix"].startswith(f"clef-format migrate {root} --to layout-2 redoes it"), finding
    rc, out = run_json(capsys, str(root), "--to", "layout-2")  # the fix, followed
    assert rc == 0 and (root / "notes.txt").read_bytes() == NOTE + b"edited\n" and verified(root)[:2] == ("layout-2", True)


def test_manifest_waits_for_a_running_migrate_instead_of_being_swapped_away(fresh, capsys) -> None:
    """``clef-format manifest`` during a migrate of the same checkpoint: it said OK and its manifest was
    dropped by the swap. It takes migrate's lock now, so it refuses while the migrate runs."""
    from clef_format.migrate.manifest_writer import make_manifest

    root = _source(fresh)
    seen = []

    def act(phase: str, n: int) -> None:
        if (phase, n) == ("stage", 1):
            seen.append(make_manifest(str(root)))

    with crash.adversary(act):
        rc, out = run_json(capsys, str(root), "--to", "layout-2")
    assert rc == 0, out
    [report] = seen
    assert not report.ok and [f.code for f in report.findings] == ["manifest-refused"], report.findings
    assert "another clef-format migrate" in report.findings[0].message
    assert not (root / "clef_manifest.json").exists()
    assert make_manifest(str(root)).ok and (root / "clef_manifest.json").is_file()  # after it, it writes


# ---- mount boundaries ------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["tmpfs", "bind"])
def test_a_mount_inside_the_checkpoint_is_refused_by_the_dry_run_and_the_run(fresh, capsys, mounts, tmp_path: Path,
                                                                            how: str) -> None:
    """The real run copied the mounted files, swapped, then deleted the old tree through the mount."""
    root = _source(fresh)
    if how == "tmpfs":
        mounts("-t", "tmpfs", "none", str(root / "data"))
    else:
        outside = tmp_path / "elsewhere"
        outside.mkdir()
        mounts("--bind", str(outside), str(root / "data"))
    (root / "data" / "precious.txt").write_bytes(b"x" * 100)
    before = file_digests(root)
    for extra in (["--dry-run"], []):
        rc, out = run_json(capsys, str(root), "--to", "layout-2", *extra)
        [finding] = [f for f in out["findings"] if f["severity"] == "error"]
        assert rc == 1 and finding["code"] == "migrate-refused", out
        assert "data is a mount point inside the checkpoint" in finding["message"] and "unmount" in finding["fix"]
        assert file_digests(root) == before and siblings(root) == []


def test_the_checkpoint_as_a_mount_point_is_refused_in_place(fresh, capsys, mounts) -> None:
    root = _source(fresh)
    mounts("--bind", str(root), str(root))
    before = file_digests(root)
    for extra in (["--dry-run"], []):
        rc, out = run_json(capsys, str(root), "--to", "layout-2", *extra)
        codes = [f["code"] for f in out["findings"] if f["severity"] == "error"]
        assert rc == 1 and codes == ["migrate-refused"], out
        assert "is a mount point" in out["findings"][0]["message"] and "--output" in out["findings"][0]["fix"]
        assert file_digests(root) == before and siblings(root) == []


@pytest.mark.parametrize("how", ["tmpfs", "bind"])
def test_an_empty_mount_point_as_output_is_refused_before_writing(fresh, capsys, mounts, tmp_path: Path,
                                                                  how: str) -> None:
    """A bind mount shares its device number with the folder it lies in: only the mount table tells."""
    root = _source(fresh)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    if how == "tmpfs":
        mounts("-t", "tmpfs", "none", str(out_dir))
    else:
        empty = tmp_path / "empty"
        empty.mkdir()
        mounts("--bind", str(empty), str(out_dir))
    for extra in (["--dry-run"], []):
        rc, out = run_json(capsys, str(root), "--to", "layout-2", "--output", str(out_dir), *extra)
        codes = [f["code"] for f in out["findings"] if f["severity"] == "error"]
        assert rc == 1 and codes == ["migrate-refused"], out
        assert "mount point" in " ".join(f["message"] for f in out["findings"])
        assert os.listdir(out_dir) == [] and siblings(out_dir) == []


def test_no_cleanup_deletes_through_a_mount(tmp_path: Path, mounts) -> None:
    from clef_format.migrate.workspace import remove_tree

    tree = tmp_path / "made-by-migrate"
    (tree / "sub").mkdir(parents=True)
    mounts("-t", "tmpfs", "none", str(tree / "sub"))
    (tree / "sub" / "theirs.txt").write_text("not migrate's")
    with pytest.raises(OSError, match="is a mount point"):
        remove_tree(str(tree))
    assert (tree / "sub" / "theirs.txt").read_text() == "not migrate's"


# ---- symlinks to the checkpoint's own files -------------------------------------------------------

@pytest.mark.parametrize("form", ["absolute", "through-parent"])
def test_a_symlink_to_a_file_of_the_checkpoint_itself_is_carried(fresh, capsys, form: str) -> None:
    """Verify OK, dry run OK, and the real run failed saying the link leads outside the checkpoint."""
    root = _source(fresh)
    text = str(root / "notes.txt") if form == "absolute" else f"../{root.name}/notes.txt"
    os.symlink(text, root / "notes-link.txt")
    assert verified(root)[1]
    rc, out = run_json(capsys, str(root), "--to", "layout-2", "--dry-run")
    assert rc == 0, out
    rc, out = run_json(capsys, str(root), "--to", "layout-2")
    assert rc == 0 and verified(root)[:2] == ("layout-2", True), out
    link = root / "notes-link.txt"
    assert link.is_symlink() and link.read_bytes() == NOTE and os.readlink(link) == "notes.txt"


# ---- the cache boundary, for every writer ----------------------------------------------------------

@pytest.mark.parametrize("area", ["snapshots/0123456789abcdef0123456789abcdef01234567", "blobs/fresh"])
def test_example_never_writes_into_a_hugging_face_cache(tmp_path: Path, capsys, monkeypatch, area: str) -> None:
    """``example`` built into a snapshot folder, and the invented revision then passed verify org/name@rev."""
    from clef_format.cli.main import main

    cache = tmp_path / "hub"
    repo = cache / "models--org--name"
    for part in ("snapshots", "blobs", "refs"):
        (repo / part).mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    where = repo / area
    capsys.readouterr()
    rc = main(["example", str(where), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and [f["code"] for f in out["findings"]] == ["example-refused"], out
    assert not where.exists() and sorted(os.listdir(repo / "snapshots")) == []


# ---- --output runs, the target itself, and a tree deeper than the recursion limit ------------------

def _reset(tmp_path: Path) -> None:
    """Remove what the last case left (``rm -rf``: a 1,100-deep tree would make shutil.rmtree recurse)."""
    _umount_below(tmp_path)
    for entry in tmp_path.iterdir():
        subprocess.run(["rm", "-rf", "--one-file-system", str(entry)], check=True)


_AFTER_EXCHANGE: set[tuple[str, int]] = set()


def _output_points(fresh, capsys, tmp_path: Path) -> list[tuple[str, int]]:
    """The crash points of an --output run (first and last of each phase); ``_AFTER_EXCHANGE`` gets those
    met after the first ``swap`` point, where the exchange happens (the journal's ``swapped`` write, ...)."""
    root = _source(fresh)
    met: list[tuple[str, int]] = []
    with crash.adversary(lambda phase, n: met.append((phase, n))):
        rc, out = run_json(capsys, str(root), "--to", "layout-2", "--output", str(tmp_path / "out"))
    assert rc == 0, out
    _AFTER_EXCHANGE.update(met[met.index(("swap", 1)) + 1:])
    last: dict[str, int] = {}
    for phase, n in met:
        last[phase] = max(n, last.get(phase, 0))
    return sorted({(p, 1) for p in last} | set(last.items()), key=lambda x: (crash.CRASH_PHASES.index(x[0]), x[1]))


def _holds_out_of_place(change: Change, out_dir: Path) -> bool:
    """Out of place a symlink to a file of the checkpoint is materialised (docs/MIGRATION.md)."""
    if change.name == "symlink-swap":
        return (out_dir / "notes.txt").read_bytes() == NOTE + b"v2\n"
    return change.holds(out_dir)


@pytest.mark.parametrize("change", CHANGES, ids=[c.name for c in CHANGES])
def test_a_change_to_the_source_of_an_output_run_is_kept_or_refused(fresh, capsys, mounts, change: Change,
                                                                    tmp_path: Path) -> None:
    """An --output run only reads the source: the change always stays there, and the output holds it
    (or holds the source as it was before, for a change made after the exchange), or the run refused."""
    if change.name == "mount":
        probe = tmp_path / "probe"
        probe.mkdir()
        mounts("-t", "tmpfs", "none", str(probe))
    points = _output_points(fresh, capsys, tmp_path)
    failures = []
    for phase, n in points:
        _reset(tmp_path)
        root, out_dir = _source(fresh), tmp_path / "out"
        done: list[bool] = []

        def act(at: str, count: int) -> None:
            if (at, count) == (phase, n) and not done:
                done.append(True)
                change.make(root)

        with crash.adversary(act):
            rc, out = run_json(capsys, str(root), "--to", "layout-2", "--output", str(out_dir))
        codes = [f["code"] for f in out["findings"] if f["severity"] == "error"]
        where = f"{change.name} at {phase}:{n}"
        if not done or not change.holds(root):
            failures.append(f"{where}: reached {bool(done)}, the source lost the change")
        elif rc == 1:
            if codes != ["migrate-refused"] or (out_dir.exists() and os.listdir(out_dir)) or siblings(out_dir):
                failures.append(f"{where}: refused as {codes}, output left {out_dir.exists() and os.listdir(out_dir)}")
        elif rc != 0 or verified(out_dir)[:2] != ("layout-2", True):
            failures.append(f"{where}: exit {rc} {codes}, output {verified(out_dir) if out_dir.exists() else None}")
        elif change.name != "mount" and not _holds_out_of_place(change, out_dir) and (phase, n) not in _AFTER_EXCHANGE:
            failures.append(f"{where}: exit 0 without the change made before the exchange")
    _reset(tmp_path)
    assert not failures, "\n".join(failures)


def test_a_file_put_into_the_output_while_the_run_stages_is_never_deleted(fresh, capsys, tmp_path: Path) -> None:
    """The --output made (or filled) by someone else meanwhile: the exchange moved it into the workspace
    and the cleanup deleted it, exit 0. Refused now before the exchange; after it, the file is in the result."""
    points = _output_points(fresh, capsys, tmp_path)
    failures = []
    for phase, n in points:
        _reset(tmp_path)
        root, out_dir = _source(fresh), tmp_path / "out"

        def act(at: str, count: int) -> None:
            if (at, count) == (phase, n):
                out_dir.mkdir(exist_ok=True)
                (out_dir / "mine.txt").write_bytes(NOTE)

        with crash.adversary(act):
            rc, out = run_json(capsys, str(root), "--to", "layout-2", "--output", str(out_dir))
        codes = [f["code"] for f in out["findings"] if f["severity"] == "error"]
        kept = (out_dir / "mine.txt").is_file() and (out_dir / "mine.txt").read_bytes() == NOTE
        if not kept:
            failures.append(f"{phase}:{n}: exit {rc} {codes}, mine.txt is lost")
        elif rc == 1 and (codes != ["migrate-refused"] or os.listdir(out_dir) != ["mine.txt"] or siblings(out_dir)):
            failures.append(f"{phase}:{n}: refused as {codes}, output {os.listdir(out_dir)}, left {siblings(out_dir)}")
        elif rc == 0 and verified(out_dir)[:2] != ("layout-2", True):
            failures.append(f"{phase}:{n}: exit 0, output {verified(out_dir)}")
    _reset(tmp_path)
    assert not failures, "\n".join(failures)


def test_a_tree_deeper_than_the_recursion_limit_made_at_each_phase_boundary(fresh, capsys, tmp_path: Path) -> None:
    """The tree state, the survey and the cleanup walked by recursion: a folder nested 1,100 deep made
    while migrate ran raised RecursionError. Now the run refuses (the tree is kept) or, made after the
    exchange, the tree is in the result (which verify then reports as tree-too-deep)."""
    from tests.migrate.test_deep_trees import DEEP, leaf_of, nest

    points = _points(fresh, capsys)
    failures = []
    for phase, n in points:
        _reset(tmp_path)
        root = _source(fresh)

        def act(at: str, count: int) -> None:
            if (at, count) == (phase, n):
                nest(root / "data", DEEP, "d")

        with crash.adversary(act):
            rc, out = run_json(capsys, str(root), "--to", "layout-2")
        codes = sorted({f["code"] for f in out["findings"] if f["severity"] == "error"})
        layout, _, errors = verified(root)
        if leaf_of(root / "data", DEEP, "d") != b"leaf\n":
            failures.append(f"{phase}:{n}: exit {rc} {codes}, the deep tree is lost")
        elif rc == 1 and codes == ["migrate-refused"]:
            if layout != "layout-1" or siblings(root):
                failures.append(f"{phase}:{n}: refused, layout {layout}, left {siblings(root)}")
        elif layout != "layout-2" or set(errors) != {"tree-too-deep"} or siblings(root):
            failures.append(f"{phase}:{n}: exit {rc} {codes}, result {layout} {errors}, left {siblings(root)}")
    _reset(tmp_path)
    assert not failures, "\n".join(failures)


# ---- manifest: each change at each of its phase boundaries -----------------------------------------

#: manifest's points: the lock taken, the files hashed (before the proof), the proof passed (before the
#: rename), the manifest written.
MANIFEST_POINTS = [("lock", 1), ("stage", 1), ("swap", 1), ("cleanup", 1)]


@pytest.mark.parametrize("change", CHANGES, ids=[c.name for c in CHANGES])
def test_a_change_at_each_phase_boundary_of_manifest_is_recorded_or_refused(fresh, mounts, change: Change,
                                                                           tmp_path: Path) -> None:
    """manifest hashed the files, then wrote what it had hashed: a file edited meanwhile was recorded as
    it was, and verify --deep then called the user's own edit damage (exit 0, a wrong manifest). Now the
    state taken before hashing is proven before writing: the change is recorded, or manifest refuses
    and writes nothing. Past the proof (the rename, or later) the manifest describes the files as they
    were when it was proven, and --deep reports the later edit as what it is, a change since."""
    from clef_format.migrate.manifest_writer import make_manifest
    from clef_format.read.checkpoint import read_checkpoint
    from clef_format.verify.run import verify_checkpoint

    if change.name == "mount":
        probe = tmp_path / "probe"
        probe.mkdir()
        mounts("-t", "tmpfs", "none", str(probe))
    failures = []
    for phase, n in MANIFEST_POINTS:
        _reset(tmp_path)
        root = _source(fresh)
        done: list[bool] = []

        def act(at: str, count: int) -> None:
            if (at, count) == (phase, n) and not done:
                done.append(True)
                change.make(root)

        with crash.adversary(act):
            report = make_manifest(str(root))
        codes = [f.code for f in report.findings if f.severity == "error"]
        written = (root / "clef_manifest.json").is_file()
        where = f"{change.name} at {phase}:{n}"
        deep = verify_checkpoint(read_checkpoint(root), str(root), deep=True)
        mismatched = sorted(f.file or "" for f in deep.findings if f.code == "hash-mismatch")
        if not done or not change.holds(root):
            failures.append(f"{where}: reached {bool(done)}, the change is lost")
        elif not report.ok:
            if codes != ["manifest-refused"] or written or "changed while its files were hashed" not in \
                    report.findings[0].message:
                failures.append(f"{where}: refused as {codes}, manifest written {written}")
        elif not written:
            failures.append(f"{where}: ok without a manifest")
        elif phase in ("lock", "stage") and mismatched:
            failures.append(f"{where}: written before the change was proven absent, --deep: {mismatched}")
    _reset(tmp_path)
    assert not failures, "\n".join(failures)
