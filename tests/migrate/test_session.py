"""migrate end to end on real safetensors files: round trips, refusals, snapshots, locks, full and read-only disks."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import struct
import subprocess
from pathlib import Path

import pytest

from tests.support.hub_cache import build_hub_cache
from clef_format.migrate.workspace import Lock, make_target
from clef_format.read.checkpoint import read_checkpoint
from clef_format.read.safetensors import read_header
from clef_format.spec import layouts as L
from clef_format.spec import tables_format as TF
from clef_format.verify.run import verify_checkpoint
from tests.support.migrate import backbone_digests, cli, file_digests, run_json, siblings, table_bytes, verified



def _index_total(root: Path) -> None:
    """The index's weight_map and total_size agree with the shard headers."""
    index = json.loads((root / L.BACKBONE_INDEX).read_text())
    total = 0
    for shard in sorted(set(index["weight_map"].values())):
        h = read_header(root / shard)
        total += sum(i.nbytes for i in h.tensors.values())
        assert all(index["weight_map"][n] == shard for n in h.tensors)
    assert index["metadata"]["total_size"] == total


@pytest.mark.parametrize("shards", [1, 3])
def test_round_trip_keeps_every_other_tensor_byte_identical(fresh, capsys, shards: int) -> None:
    root = fresh("layout-1", shards=shards)
    digests = backbone_digests(root)
    meta = {rel: read_header(root / rel).metadata for rel in read_checkpoint(root).backbone_files}
    originals = table_bytes(root)

    rc, out = run_json(capsys, str(root))
    assert rc == 0 and out["ok"] and out["layout"] == "layout-2", out
    assert verified(root)[:2] == ("layout-2", True)
    assert backbone_digests(root) == digests
    assert {rel: read_header(root / rel).metadata for rel in read_checkpoint(root).backbone_files} == meta
    tables_meta = read_header(root / L.TABLES).metadata
    assert not TF.metadata_problems(tables_meta)
    quality = json.loads(tables_meta["quality"])
    assert set(quality) == set(L.TABLE_NAMES) and quality == out["steps"][0]["quality"]
    for q in quality.values():
        assert 0.005 < q["rel_error"] < 0.02 and q["mean_row_cosine"] > 0.9998 and q["min_row_cosine"] <= q["mean_row_cosine"]
    assert json.loads((root / L.HEAD_CONFIG).read_text())[L.MARKER_KEY] == L.MARKER_VALUE
    first_int8 = (root / L.TABLES).read_bytes()
    if shards > 1:
        _index_total(root)

    rc, out = run_json(capsys, str(root), "--to", "layout-1")
    assert rc == 0 and out["layout"] == "layout-1" and out["ok"], out
    assert "DECODED FROM INT8" in out["steps"][0]["plan"]["notes"][0]
    assert backbone_digests(root) == digests
    assert not (root / L.TABLES).exists() and L.MARKER_KEY not in json.loads((root / L.HEAD_CONFIG).read_text())
    decoded = table_bytes(root)
    assert decoded.keys() == originals.keys() and all(len(decoded[k]) == len(originals[k]) for k in decoded)
    if shards > 1:
        _index_total(root)

    rc, out = run_json(capsys, str(root))
    assert rc == 0 and out["layout"] == "layout-2" and out["ok"]
    assert backbone_digests(root) == digests
    # the int8 of decoded int8 is the same int8 up to one step where BF16 rounding crossed a half
    import torch
    from safetensors.torch import load_file

    again = load_file(str(root / L.TABLES))
    with open(root / "first.safetensors", "wb") as fh:
        fh.write(first_int8)
    first = load_file(str(root / "first.safetensors"))
    for name in L.TABLE_NAMES:
        assert (again[name].int() - first[name].int()).abs().max() <= 1
        assert torch.allclose(again[TF.scale_name(name)], first[TF.scale_name(name)], rtol=1e-2)
    assert siblings(root) == []


def test_dry_run_writes_nothing_and_shows_the_plan(fresh, capsys) -> None:
    root = fresh("layout-1")
    before = file_digests(root)
    rc, out = run_json(capsys, str(root), "--dry-run")
    assert rc == 0 and out["dry_run"] and out["layout"] == "layout-1"
    plan = out["steps"][0]["plan"]
    assert set(plan["written"]) == {L.TABLES, L.BACKBONE_SINGLE, L.HEAD_CONFIG}
    assert plan["read"][L.BACKBONE_SINGLE] > 0 and plan["space_needed"] > plan["bytes_written"]
    assert out["space_free"] > 0
    assert file_digests(root) == before and siblings(root) == []
    text = cli("migrate", str(root), "--dry-run")
    assert text.returncode == 0 and "dry run: nothing was written" in text.stdout and "space" in text.stdout


def test_already_at_target_does_nothing(fresh, capsys) -> None:
    root = fresh("layout-2")
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    rc, out = run_json(capsys, str(root), "--to", "layout-2")
    assert rc == 0 and out["ok"] and out["steps"] == [] and "nothing to do" in out["message"]
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before


@pytest.mark.parametrize("out_state", ["absent", "empty"])
@pytest.mark.parametrize("layout", ["layout-1", "layout-2"])
def test_already_at_target_with_output_writes_nothing_and_reports_the_source(fresh, capsys, tmp_path: Path,
                                                                             layout: str, out_state: str) -> None:
    """``--to`` the source's own layout with ``--output OUT``: exit 0 and the source's verify report, dry run
    and real run alike; ``result`` is the source, OUT is not created (or stays empty), nothing beside it."""
    root = fresh(layout)
    before = file_digests(root)
    out_dir = tmp_path / "out"
    if out_state == "empty":
        out_dir.mkdir()
    source_codes = sorted(f.code for f in verify_checkpoint(read_checkpoint(root), str(root)).findings)
    for extra in (["--dry-run"], []):
        rc, out = run_json(capsys, str(root), "--to", layout, "--output", str(out_dir), *extra)
        assert rc == 0 and out["ok"] and out["steps"] == [] and out["layout"] == layout, out
        assert "nothing to do, nothing written" in out["message"] and str(root) in out["message"], out["message"]
        assert sorted(f["code"] for f in out["findings"]) == source_codes
        assert out.get("result") == (None if extra else str(root.resolve()))
        assert out_dir.exists() == (out_state == "empty") and (out_state == "absent" or not any(out_dir.iterdir()))
        assert siblings(out_dir) == [] and file_digests(root) == before


@pytest.mark.parametrize("output", [False, True])
def test_already_at_target_predicts_its_status_in_the_dry_run(fresh, capsys, tmp_path: Path, output: bool) -> None:
    """A source at the target layout that verify rejects: the real run and the dry run both exit 1 with the
    source's errors (nothing is written either way)."""
    root = fresh("layout-2", "bf16", num_layers=4)
    cfg = json.loads((root / L.CONFIG).read_text())
    cfg["text_config"]["hidden_act"] = "gelu"
    (root / L.CONFIG).write_text(json.dumps(cfg))
    args = [str(root), "--to", "layout-2"] + (["--output", str(tmp_path / "out")] if output else [])
    rc_dry, dry = run_json(capsys, *args, "--dry-run")
    rc, real = run_json(capsys, *args)
    codes = {f["code"] for f in real["findings"]}
    assert rc_dry == rc == 1 and "config-invalid" in codes and {f["code"] for f in dry["findings"]} == codes
    assert not (tmp_path / "out").exists() and siblings(root) == []


@pytest.mark.parametrize("flag", [[], ["--abort"], ["--current"]])
def test_an_absent_path_with_nothing_beside_it_says_what_to_give(capsys, tmp_path: Path, flag: list[str]) -> None:
    rc, out = run_json(capsys, str(tmp_path / "nowhere"), *flag)
    (finding,) = out["findings"]
    assert rc == 2 and finding["code"] == "path-not-found" and "no interrupted migrate into it" in finding["message"]
    assert "org/name" in finding["fix"] and not list(tmp_path.iterdir())


@pytest.mark.parametrize("value", ["bogus:1", "stage:0", "stage:x", "stage:1:TERM", "swap:２", ":1"])
def test_a_crash_setting_that_names_no_crash_point_is_a_usage_error(fresh, value: str) -> None:
    """CLEF_FORMAT_CRASH_AT that names no crash point: exit 2, one JSON object naming the phases, nothing
    written (it used to be ignored silently)."""
    from clef_format.migrate.crash import CRASH_PHASES

    root = fresh("layout-1")
    before = file_digests(root)
    for extra in ([], ["--dry-run"]):
        proc = cli("migrate", str(root), "--json", *extra, env={"CLEF_FORMAT_CRASH_AT": value})
        out = json.loads(proc.stdout)
        (finding,) = out["findings"]
        assert proc.returncode == 2 and finding["code"] == "usage-error" and out["error"], out
        assert all(p in finding["message"] for p in CRASH_PHASES) and finding["fix"]
    assert file_digests(root) == before and siblings(root) == []


@pytest.mark.parametrize("flags", [["--abort", "--current"], ["--abort", "--to", "layout-2"],
                                   ["--abort", "--to", "layout-1", "--dry-run"], ["--current", "--to", "layout-2"],
                                   ["--current", "--to", "layout-1", "--json"]])
def test_contradicting_flags_are_a_usage_error(fresh, capsys, flags: list[str]) -> None:
    root = fresh("layout-1")
    before = file_digests(root)
    rc, out = run_json(capsys, str(root), *flags)
    (finding,) = out["findings"]
    assert rc == 2 and finding["code"] == "usage-error" and "contradict" in finding["message"] and finding["fix"]
    assert file_digests(root) == before and siblings(root) == []


@pytest.mark.parametrize("flags", [["--to", "layout-1", "--to", "layout-2"], ["--to=layout-2", "--to", "layout-1"],
                                   ["--output", "A", "--output", "B"], ["--to", "layout-2", "--dry-run", "--to=layout-1"]])
def test_an_option_given_twice_with_different_values_is_a_usage_error(fresh, capsys, tmp_path: Path,
                                                                      flags: list[str]) -> None:
    """argparse keeps the last value silently; which one the user meant is not known: refuse, name both."""
    root = fresh("layout-1")
    before = file_digests(root)
    outs = tmp_path / "outs"
    outs.mkdir()
    flags = [str(outs / f) if f in ("A", "B") else f for f in flags]
    rc, out = run_json(capsys, str(root), *flags)
    (finding,) = out["findings"]
    assert rc == 2 and finding["code"] == "usage-error" and "given twice" in finding["message"], out
    values = [f.split("=")[-1] for f in flags if not f.startswith("--") or "=" in f]
    assert values[0] in finding["message"] and values[1] in finding["message"]
    assert file_digests(root) == before and siblings(root) == [] and list(outs.iterdir()) == []


def test_an_option_given_twice_with_the_same_value_is_that_value(fresh, capsys, tmp_path: Path) -> None:
    root = fresh("layout-1")
    rc, out = run_json(capsys, str(root), "--to", "layout-1", "--to=layout-1", "--dry-run")
    assert rc == 0 and out["to"] == "layout-1" and out["findings"] and not [
        f for f in out["findings"] if f["severity"] == "error"], out
    rc, out = run_json(capsys, str(root), "--output", str(tmp_path / "o"), "--output", f"{tmp_path}/o/", "--dry-run")
    assert rc == 0, out  # one folder, typed two ways
    rel = os.path.relpath(tmp_path / "o")
    rc, out = run_json(capsys, str(root), "--output", rel, "--output", str(tmp_path / "o"), "--dry-run")
    assert rc == 0, out
    from clef_format.cli.main import main

    for twice in (["--vllm-version", "0.28", "--vllm-version", "0.28.0"], ["--vllm-version=0.33.0", "--vllm-version=0.33"]):
        assert main(["verify", str(root), "--json", *twice]) == 0
        assert json.loads(capsys.readouterr().out)["ok"]
    assert main(["verify", str(root), "--json", "--vllm-version", "0.28", "--vllm-version", "0.33"]) == 2
    assert "given twice" in json.loads(capsys.readouterr().out)["findings"][0]["message"]


@pytest.mark.parametrize("layout,codes,rc", [("layout-1", ["legacy-layout"], 0), ("layout-2", [], 0),
                                             ("layout-2-unmarked", ["marker-missing"], 1)])
def test_current_says_what_the_layout_means_as_verify_does(fresh, capsys, layout: str, codes: list[str],
                                                           rc: int) -> None:
    """``--current`` on layout-1 said "OK, 0 warnings" where verify warns legacy-layout; on the unmarked
    layout, OK where verify says never serve it. Its findings are verify's layout findings."""
    root = fresh(layout)
    got, out = run_json(capsys, str(root), "--current")
    assert [f["code"] for f in out["findings"]] == codes and got == rc, out
    assert all(f["fix"].startswith(f"clef-format migrate {root} --to layout-2") for f in out["findings"])
    verify = verify_checkpoint(read_checkpoint(root), str(root))
    assert {f.code for f in verify.findings if f.severity != "info"} == set(codes)


@pytest.mark.parametrize("flags", [["PATH", "--history"], ["PATH", "--current", "--history"], ["--history", "--to",
                                   "layout-1"], ["--history", "--abort"], ["--history", "--dry-run"],
                                   ["--history", "--output", "OUT"], ["PATH", "--current", "--output", "OUT"]])
def test_flags_that_would_be_ignored_are_a_usage_error(fresh, capsys, tmp_path: Path, flags: list[str]) -> None:
    root = fresh("layout-1")
    flags = [str(root) if f == "PATH" else str(tmp_path / "out") if f == "OUT" else f for f in flags]
    rc, out = run_json(capsys, *flags)
    (finding,) = out["findings"]
    assert rc == 2 and finding["code"] == "usage-error" and "takes no" in finding["message"] and finding["fix"], out
    assert siblings(root) == [] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv", [["--json=1"], ["--json=yes", "--dry-run"], ["--js", "--json"], ["--dry", "--json"],
                                  ["--cur", "--json"]])
def test_a_malformed_or_abbreviated_flag_is_one_json_usage_error(fresh, capsys, argv: list[str]) -> None:
    """``--json=1`` printed argparse's text and no JSON; abbreviations (``--js``) were taken by argparse
    but not by the check that decides whether the answer is JSON. Neither is accepted now."""
    from clef_format.cli.main import main

    root = fresh("layout-1")
    assert main(["migrate", str(root), *argv]) == 2
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["findings"][0]["code"] == "usage-error" and out["ok"] is False, out
    assert siblings(root) == []


def test_history_and_current(fresh, capsys) -> None:
    rc, out = run_json(capsys, "--history")
    assert rc == 0 and [h["revision"] for h in out["history"]] == ["0001_int8_tables", "0002_repair_marker"]
    rc, out = run_json(capsys, str(fresh("layout-1")), "--current")
    assert rc == 0 and out["revision"] == "base" and out["pending"] is None


def test_repair_unmarked_writes_only_the_marker(fresh, capsys) -> None:
    root = fresh("layout-2-unmarked")
    before = file_digests(root)
    rc, out = run_json(capsys, str(root))
    assert rc == 0 and out["layout"] == "layout-2" and out["ok"], out
    after = file_digests(root)
    assert {k for k in after if after[k] != before.get(k)} == {L.HEAD_CONFIG}


def test_repair_refused_when_the_tables_file_is_corrupt(fresh, capsys) -> None:
    root = fresh("layout-2-unmarked")
    h = read_header(root / L.TABLES)
    info = h.tensors[L.LM_HEAD]
    with open(root / L.TABLES, "r+b") as fh:
        fh.seek(h.data_start + info.begin + 5)
        fh.write(b"\x80")  # -128: never written by the format
    before = file_digests(root)
    rc, out = run_json(capsys, str(root))
    assert rc == 1 and "re-download" in json.dumps(out["findings"])
    assert [f["code"] for f in out["findings"] if f["severity"] == "error"] == ["migrate-refused"]
    assert file_digests(root) == before and siblings(root) == []


def test_nonfinite_table_rows_refused_with_a_finding(fresh, capsys) -> None:
    root = fresh("layout-1")
    ck = read_checkpoint(root)
    h = read_header(root / ck.tensor_file[L.EMBED_TOKENS])
    info = h.tensors[L.EMBED_TOKENS]
    with open(root / ck.tensor_file[L.EMBED_TOKENS], "r+b") as fh:
        fh.seek(h.data_start + info.begin + 7 * info.shape[1] * 2 + 6)
        fh.write(struct.pack("<H", 0x7FC0))  # BF16 NaN in row 7
    before = file_digests(root)
    rc, out = run_json(capsys, str(root))
    assert rc == 1
    (finding,) = [f for f in out["findings"] if f["severity"] == "error"]
    assert finding["code"] == "table-nonfinite" and "[7]" in finding["message"]
    assert file_digests(root) == before and siblings(root) == []


def test_refuses_a_checkpoint_broken_beyond_what_migrate_fixes(fresh, capsys) -> None:
    root = fresh("layout-1")
    (root / L.HEAD_WEIGHTS).unlink()
    rc, out = run_json(capsys, str(root))
    assert rc == 1 and out["findings"][0]["code"] == "migrate-refused"
    assert "missing-file" in out["findings"][0]["message"]
    assert verified(root)[0] == "layout-1"


def test_hf_snapshot_is_never_written(built, tmp_path, capsys) -> None:
    snap = build_hub_cache(tmp_path / "hub", "acme/clef-flash-NVFP4", built("layout-1"))
    blobs = file_digests(snap.parent.parent / "blobs")
    rc, out = run_json(capsys, str(snap))
    assert rc == 1 and out["findings"][0]["code"] == "migrate-refused" and "--output" in out["findings"][0]["fix"]
    dest = tmp_path / "migrated"
    rc, out = run_json(capsys, str(snap), "--output", str(dest))
    assert rc == 0 and out["layout"] == "layout-2" and out["ok"], out
    assert "link" not in out["steps"][0]["carried_by"]  # a hard link into blobs/ could corrupt the cache later
    assert not any(p.is_symlink() for p in dest.rglob("*"))
    assert file_digests(snap.parent.parent / "blobs") == blobs
    assert verified(snap)[0] == "layout-1" and backbone_digests(dest) == backbone_digests(snap)


def test_out_of_place_leaves_the_source_untouched(fresh, tmp_path, capsys) -> None:
    root = fresh("layout-1")
    before = file_digests(root)
    dest = tmp_path / "out"
    rc, out = run_json(capsys, str(root), "--output", str(dest))
    assert rc == 0 and out["layout"] == "layout-2"
    assert file_digests(root) == before and verified(dest)[:2] == ("layout-2", True)
    assert sum(out["steps"][0]["carried_by"].values()) >= 5
    rc, out = run_json(capsys, str(root), "--output", str(dest))
    assert rc == 2 and "not an empty directory" in out["error"]


def test_second_concurrent_migrate_is_refused(fresh) -> None:
    root = fresh("layout-1")
    before = file_digests(root)
    with Lock(make_target(str(root), None)):  # a real flock held by this process
        proc = cli("migrate", str(root), "--json")
    assert proc.returncode == 1, proc.stderr
    out = json.loads(proc.stdout)
    assert out["findings"][0]["code"] == "migrate-refused" and "another clef-format migrate" in out["findings"][0]["message"]
    assert file_digests(root) == before


def _mount_tmpfs(where: Path, size: str) -> None:
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")


@pytest.fixture
def tmpfs(tmp_path):
    mounts: list[Path] = []

    def make(size: str) -> Path:
        where = tmp_path / f"mnt{len(mounts)}"
        _mount_tmpfs(where, size)
        mounts.append(where)
        return where

    yield make
    for m in mounts:
        subprocess.run(["umount", "-l", str(m)], capture_output=True)


def test_full_disk_is_refused_before_starting(built, tmpfs, capsys) -> None:
    mnt = tmpfs("1200k")  # holds the ~830 KB checkpoint, not its migration
    root = mnt / "ck"
    shutil.copytree(built("layout-1"), root)
    before = file_digests(root)
    rc, out = run_json(capsys, str(root))
    assert rc == 1 and "not enough free space" in out["findings"][0]["message"]
    assert file_digests(root) == before and siblings(root) == []


def test_write_failure_midway_rolls_back(fresh) -> None:
    """A size-limited write (RLIMIT_FSIZE in the child) fails mid-file: clear error, original intact."""
    root = fresh("layout-1")
    before = file_digests(root)

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    proc = cli("migrate", str(root), "--json", preexec_fn=limit)
    assert proc.returncode == 1, proc.stderr
    (finding,) = json.loads(proc.stdout)["findings"]
    assert finding["code"] == "migrate-failed" and "exactly as it was" in finding["message"]
    assert "full" in finding["message"] or "limit" in finding["message"]
    assert file_digests(root) == before and siblings(root) == []


def test_read_only_directory_is_refused(built, tmpfs, capsys) -> None:
    mnt = tmpfs("4m")
    root = mnt / "ck"
    shutil.copytree(built("layout-1"), root)
    before = file_digests(root)
    if subprocess.run(["mount", "-o", "remount,ro", str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("cannot remount read-only")
    rc, out = run_json(capsys, str(root))
    assert rc == 1 and "read-only" in out["findings"][0]["message"] and "--output" in out["findings"][0]["fix"]
    assert file_digests(root) == before


def test_output_shares_no_inode_with_the_source(fresh, tmp_path, capsys) -> None:
    """Out of place, an output file edited in place (open r+, write) must never change the source's."""
    root = fresh("layout-1")
    dest = tmp_path / "migrated"
    rc, out = run_json(capsys, str(root), "--output", str(dest))
    assert rc == 0 and out["ok"], out
    assert "link" not in out["steps"][0]["carried_by"]
    source_inodes = {p.stat().st_ino for p in root.rglob("*") if p.is_file()}
    assert not any(p.stat().st_ino in source_inodes for p in dest.rglob("*") if p.is_file())
    before = backbone_digests(root)
    with open(dest / L.BACKBONE_SINGLE, "r+b") as fh:
        fh.seek(-1, 2)
        fh.write(b"\x00")
    assert backbone_digests(root) == before


def test_an_output_runs_text_report_says_the_source_kept_its_layout(fresh, tmp_path, capsys) -> None:
    """The header said ``migrate SRC / layout layout-2`` after an --output run, where SRC is still layout-1."""
    from clef_format.cli.main import main

    root, dest = fresh("layout-1"), tmp_path / "migrated"
    assert main(["migrate", str(root), "--output", str(dest)]) == 0
    header = capsys.readouterr().out.splitlines()[:2]
    assert header == [f"migrate {root}", f"  layout   layout-1 (unchanged); the result in {dest} is layout-2"]
    assert main(["migrate", str(root), "--to", "layout-2", "--output", str(tmp_path / "planned"), "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "  layout   layout-1"
    assert main(["migrate", str(dest), "--output", str(tmp_path / "again")]) == 0  # nothing to do, nothing written
    assert capsys.readouterr().out.splitlines()[1] == "  layout   layout-2"
    assert main(["migrate", str(root)]) == 0  # in place: PATH is now at the new layout
    assert capsys.readouterr().out.splitlines()[1] == "  layout   layout-2"


@pytest.mark.parametrize("name", ["own-ws", "own-lock", "other-ws", "other-lock"])
def test_an_output_named_like_a_workspace_or_lock_is_a_usage_error(fresh, tmp_path, capsys, name: str) -> None:
    """An --output at ``.PATH.clef-migrate`` was accepted; the next run on PATH took the result for its
    litter and deleted it. Any name of that form is migrate's own."""
    root = fresh("layout-1")
    owner = root.name if name.startswith("own") else "other"
    out = root.parent / (f".{owner}.clef-migrate" + (".lock" if name.endswith("lock") else ""))
    before = file_digests(root)
    for extra in ([], ["--dry-run"]):
        rc, report = run_json(capsys, str(root), "--output", str(out), *extra)
        (finding,) = report["findings"]
        assert rc == 2 and finding["code"] == "usage-error" and str(root.parent / owner) in finding["message"], report
    assert not out.exists() and file_digests(root) == before and siblings(root) == []


@pytest.mark.parametrize("content", ["file", "nested", "symlink", "not-a-dir"])
def test_a_workspace_name_holding_what_migrate_never_leaves_is_never_removed(fresh, capsys, content: str) -> None:
    """A journal-less workspace was removed as litter whatever it held. migrate leaves one only empty
    (or with an empty new/ and a partial journal.json.tmp): anything else is refused, named, and kept."""
    root = fresh("layout-1")
    ws = root.parent / f".{root.name}.clef-migrate"
    if content == "not-a-dir":
        ws.write_text("mine")
    else:
        (ws / "new").mkdir(parents=True)
        (ws / "journal.json.tmp").write_text("{")
        if content == "file":
            (ws / "NOTES.txt").write_text("mine")
        elif content == "nested":
            (ws / "new" / "model.safetensors").write_bytes(b"x" * 10)
        else:
            (ws / "link").symlink_to(root)
    kept = file_digests(ws) if ws.is_dir() else {"": ws.read_text()}
    before = file_digests(root)
    for args in (["--to", "layout-2"], ["--abort"], ["--abort", "--dry-run"], ["--dry-run"]):
        rc, out = run_json(capsys, str(root), *args)
        errors = [f for f in out["findings"] if f["severity"] == "error"]
        assert rc == 1 and errors and errors[0]["code"] == "migrate-refused", (args, out)
        assert str(ws) in errors[0]["message"] and errors[0]["fix"].startswith(f"move {ws} away"), out
    rc, out = run_json(capsys, str(root), "--current")
    assert rc == 0 and "moved away" in out["message"] and "--abort" not in out["message"], out
    assert (file_digests(ws) if ws.is_dir() else {"": ws.read_text()}) == kept and file_digests(root) == before
    shutil.move(str(ws), str(root.parent / "moved"))  # the fix, followed
    rc, out = run_json(capsys, str(root))
    assert rc == 0 and out["layout"] == "layout-2" and siblings(root) == [], out


def test_a_journal_less_workspace_migrate_left_is_still_removed(fresh, capsys) -> None:
    root = fresh("layout-1")
    ws = root.parent / f".{root.name}.clef-migrate"
    (ws / "new").mkdir(parents=True)
    (ws / "journal.json.tmp").write_text('{"version"')
    rc, out = run_json(capsys, str(root), "--current")
    assert "--abort removes it" in out["message"], out
    rc, out = run_json(capsys, str(root))
    assert rc == 0 and out["layout"] == "layout-2" and siblings(root) == [], out
    assert any(f["code"] == "migrate-recovered" for f in out["findings"])


@pytest.mark.parametrize("kind", ["dir", "symlink-to-dir", "symlink-to-file", "dangling-symlink", "text-file"])
def test_what_is_not_a_lock_at_the_lock_name_is_never_followed_or_overwritten(fresh, capsys, tmp_path: Path,
                                                                              kind: str) -> None:
    """A symlink at the lock name was followed: the file it led to was truncated to migrate's pid (a
    dangling one created its target), then the symlink deleted. Anything but a pid file is refused,
    by the run, the dry run, --abort and a run with nothing to do alike, and kept as it was."""
    root = fresh("layout-1")
    lock = root.parent / f".{root.name}.clef-migrate.lock"
    victim = tmp_path / "precious.txt"
    victim.write_text("line one\nline two\n")
    if kind == "dir":
        lock.mkdir()
        (lock / "mine").write_text("x")
    elif kind == "symlink-to-dir":
        (tmp_path / "target").mkdir()
        lock.symlink_to(tmp_path / "target")
    elif kind == "symlink-to-file":
        lock.symlink_to(victim)
    elif kind == "dangling-symlink":
        lock.symlink_to(tmp_path / "absent")
    else:
        lock.write_text("my notes, not a pid\n")
    before = file_digests(root)
    for args in ([], ["--dry-run"], ["--abort"], ["--to", "layout-1"]):
        rc, out = run_json(capsys, str(root), *args)
        (finding,) = [f for f in out["findings"] if f["severity"] == "error"]
        assert rc == 1 and str(lock) in finding["message"] and finding["fix"].startswith(f"move {lock} away"), (args, out)
        assert "read-only" not in finding["fix"]
        assert ("symlink" in finding["message"]) == kind.startswith(("symlink", "dangling")), finding
    assert victim.read_text() == "line one\nline two\n" and not (tmp_path / "absent").exists()
    assert os.path.lexists(lock) and file_digests(root) == before
    rc, out = run_json(capsys, str(root), "--current")
    assert "moved away" in out["message"], out
    shutil.move(str(lock), str(tmp_path / "moved"))
    rc, out = run_json(capsys, str(root))
    assert rc == 0 and out["layout"] == "layout-2" and siblings(root) == [], out


def test_a_lock_a_killed_run_left_is_taken(fresh, capsys) -> None:
    root = fresh("layout-1")
    (root.parent / f".{root.name}.clef-migrate.lock").write_text("12345\n")
    rc, out = run_json(capsys, str(root))
    assert rc == 0 and out["layout"] == "layout-2" and siblings(root) == [], out


@pytest.mark.parametrize("phase", ["stage:3", "swap:2", "cleanup:1"])
def test_an_interrupted_output_run_from_another_source_is_never_finished_in_its_name(fresh, capsys, tmp_path: Path,
                                                                                    phase: str) -> None:
    """A run from B into OUT "finished" A's interrupted run there and said OUT holds B's result."""
    a, b, out = fresh("layout-1"), tmp_path / "b", tmp_path / "out"
    shutil.copytree(a, b)
    proc = cli("migrate", str(a), "--output", str(out), "--json", env={"CLEF_FORMAT_CRASH_AT": phase})
    assert proc.returncode == -signal.SIGKILL
    left = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock"))  # a killed run's lock: litter
    for extra in ([], ["--dry-run"]):
        rc, report = run_json(capsys, str(b), "--output", str(out), *extra)
        (finding,) = [f for f in report["findings"] if f["severity"] == "error"]
        assert rc == 1 and finding["code"] == "migrate-refused" and str(a) in finding["message"], report
        assert finding["fix"].startswith(f"clef-format migrate {a} --to layout-2 --output {out} finishes it")
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == left
    assert cli(*finding["fix"].split(" finishes it")[0].split()[1:], "--json").returncode == 0  # the fix, followed
    assert verified(out)[:2] == ("layout-2", True) and siblings(out) == []


def test_output_in_a_missing_folder_is_a_usage_error(fresh, tmp_path, capsys) -> None:
    root = fresh("layout-1")
    rc, out = run_json(capsys, str(root), "--output", str(tmp_path / "no" / "such" / "out"))
    assert rc == 2 and out["findings"][0]["code"] == "usage-error" and out["error"], out
    assert "create" in out["findings"][0]["fix"] and verified(root)[0] == "layout-1"


def _sigint_as_from_a_shell() -> None:
    """Ctrl-C raises in the command, as from a shell: a runner started in the background (make in CI
    under a non-interactive shell) has SIGINT ignored, and the command would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("phase", ["lock:1", "journal:2", "stage:1", "verify:1", "swap:1", "swap:2", "cleanup:1",
                                   "cleanup:2", "cleanup:3"])
def test_a_ctrl_c_during_an_output_run_says_how_to_resume_it_never_in_place(fresh, tmp_path, phase) -> None:
    """After Ctrl-C (SIGINT at each phase) an --output run is resumed with its --output, or said to have
    left nothing; following the fix finishes it and never touches the source."""
    src = fresh("layout-1")
    out = tmp_path / "out"
    before = file_digests(src)
    proc = cli("migrate", str(src), "--to", "layout-2", "--output", str(out), "--json",
               env={"CLEF_FORMAT_CRASH_AT": f"{phase}:INT"}, preexec_fn=_sigint_as_from_a_shell)
    assert proc.returncode == 2, proc.stderr
    fix = json.loads(proc.stdout)["findings"][0]["fix"]
    assert f"clef-format migrate {src} resumes" not in fix, fix
    again = ["migrate", str(src), "--to", "layout-2", "--output", str(out), "--json"]
    if " resumes it" in fix:  # the fix's own command
        assert fix.startswith(f"clef-format migrate {src} --to layout-2 --output {out} resumes it"), fix
        steps = [fix.split(" resumes it")[0].split()[1:] + ["--json"]]
    elif fix.startswith(f"clef-format migrate {out} --abort removes what it left (nothing in it is needed); "):
        # before its journal, or after the cleanup removed it: --abort clears the workspace (never the result)
        finished = fix.endswith(f"; {out} holds the finished result")
        assert finished or fix.endswith("; then run the migration again"), fix
        assert finished == (phase == "cleanup:3"), (phase, fix)
        steps = [["migrate", str(out), "--abort", "--json"]] + ([] if finished else [again])
    else:
        assert fix == f"nothing of the interrupted run is left and {src} is unchanged: run the command again", fix
        steps = [again]
    for step in steps:
        rerun = cli(*step)
        assert rerun.returncode == 0, (step, rerun.stdout[-2000:])
    assert file_digests(src) == before  # the source, byte for byte
    assert verified(out) == ("layout-2", True, [])


IN_PLACE_CTRL_C = [  # (phase, the fix, the command in it that is followed)
    ("swap:1", "clef-format migrate {src} resumes the interrupted run; add --abort to roll it back instead",
     "clef-format migrate {src}"),
    # its cleanup had begun removing the original: a rollback can no longer be promised
    ("cleanup:2", "clef-format migrate {src} finishes the interrupted run (its cleanup had begun: it cannot be "
                  "rolled back)", "clef-format migrate {src}"),
    # after the journal's removal only the leftovers are left: --abort removes them, nothing to resume
    ("cleanup:3", "clef-format migrate {src} --abort removes what the run left (nothing in it is needed); then "
                  "clef-format migrate {src} --current shows the layout {src} is at", "clef-format migrate {src} --abort"),
]


@pytest.mark.parametrize("phase,fix,command", IN_PLACE_CTRL_C, ids=[c[0] for c in IN_PLACE_CTRL_C])
def test_a_ctrl_c_during_an_in_place_run_names_the_command_that_deals_with_it(fresh, phase: str, fix: str,
                                                                               command: str) -> None:
    src = fresh("layout-1")
    proc = cli("migrate", str(src), "--to", "layout-2", "--json", env={"CLEF_FORMAT_CRASH_AT": f"{phase}:INT"},
               preexec_fn=_sigint_as_from_a_shell)
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["findings"][0]["fix"] == fix.format(src=src)
    assert cli(*command.format(src=src).split()[1:], "--json").returncode == 0  # the fix, followed
    assert siblings(src) == [] and verified(src)[:2] == ("layout-2", True)


def test_a_rerun_that_only_finishes_a_cleanup_never_says_nothing_was_written(built, tmp_path) -> None:
    """An --output run killed at its second swap point, then ``migrate OUT``: the rerun finishes the
    interrupted run's cleanup (a write), so its message says no step was left, never "nothing written"."""
    import sys

    from clef_format.migrate.crash import CRASH_ENV

    src, out = built("layout-1", "hybrid"), tmp_path / "out1"
    env = {**os.environ, CRASH_ENV: "swap:2"}
    run = [sys.executable, "-m", "clef_format", "migrate"]
    crashed = subprocess.run([*run, str(src), "--to", "layout-2", "--output", str(out)], env=env, capture_output=True)
    assert crashed.returncode != 0
    env.pop(CRASH_ENV)
    rerun = json.loads(subprocess.run([*run, str(out), "--json"], env=env, capture_output=True, text=True).stdout)
    assert rerun["recovered"] and "cleanup" in rerun["recovered"][0], rerun
    assert "nothing written" not in rerun["message"] and "no step left" in rerun["message"], rerun["message"]
    again = json.loads(subprocess.run([*run, str(out), "--json"], env=env, capture_output=True, text=True).stdout)
    assert again["message"] == "already at layout-2: nothing to do, nothing written" and not again["recovered"]


def test_a_checkpoint_already_at_its_target_names_no_recovery_in_a_dry_run_and_itself_as_the_result(fresh, capsys) -> None:
    """Already at ``--to``: ``--dry-run``'s JSON says no interrupted run waits for the next run (``recovery``
    null, docs/MIGRATION.md) and names no result (nothing ran); the run names the source as its result. Neither
    writes a byte."""
    root = fresh("layout-2")
    before = file_digests(root)
    rc, dry = run_json(capsys, str(root), "--to", "layout-2", "--dry-run")
    assert rc == 0 and dry["message"] == "already at layout-2: nothing to do, nothing written", dry
    assert "recovery" in dry and dry["recovery"] is None and "result" not in dry and dry["steps"] == [], dry
    rc, done = run_json(capsys, str(root), "--to", "layout-2")
    assert rc == 0 and done["result"] == str(root) and "recovery" not in done, done
    assert file_digests(root) == before


def test_an_output_with_dotdot_after_a_symlink_lands_where_the_kernel_resolves_it(fresh, capsys, tmp_path) -> None:
    """``--output L/../kout`` with L a link to R/sub: the shell's ``mkdir L/../kout`` made R/kout, but the
    run resolved the string lexically and wrote ./kout, so ``verify L/../kout`` found an empty folder. Now
    --output is resolved as PATH is, by the kernel: the result is in R/kout, where the user's folder is."""
    from tests.support.migrate import run_json, verified

    src = fresh("layout-1")
    (tmp_path / "R" / "sub").mkdir(parents=True)
    (tmp_path / "L").symlink_to(tmp_path / "R" / "sub")
    (tmp_path / "R" / "kout").mkdir()
    given = f"{tmp_path}/L/../kout"
    rc, done = run_json(capsys, str(src), "--output", given)
    assert rc == 0 and verified(tmp_path / "R" / "kout")[:2] == ("layout-2", True), done
    assert not (tmp_path / "kout").exists()
