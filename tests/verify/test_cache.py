"""Unfinished downloads (verify/checks/cache.py): an error when the checkpoint itself is incomplete,
a warning beside a complete one, decided on what the reader found and on the layout's files."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.hub_cache import build_hub_cache, build_local_dir, repo_folder
from clef_format.read.checkpoint import read_checkpoint
from clef_format.spec import layouts as L
from clef_format.verify.checks.cache import check_cache
from clef_format.verify.run import verify

INCOMPLETE = ".cache/huggingface/download/Xy1z.abcdef.incomplete"


def _local_dir(built, tmp_path: Path, **kw) -> Path:
    root = build_local_dir(tmp_path / "local", built("layout-2", "hybrid", **kw))
    (root / INCOMPLETE).write_bytes(b"\0" * 100)
    return root


def _partial(root: Path) -> list[dict]:
    return [f.to_dict() for f in verify(str(root)).findings if f.code == "partial-download"]


def test_a_missing_shard_makes_the_unfinished_download_an_error(built, tmp_path: Path) -> None:
    """Every file the layout requires is there; the index names a shard that is not (reader's missing-file)."""
    root = _local_dir(built, tmp_path, shards=3)
    index = json.loads((root / L.BACKBONE_INDEX).read_text())
    shard = sorted(set(index["weight_map"].values()))[1]
    (root / shard).unlink()
    (partial,) = _partial(root)
    assert partial["severity"] == "error"
    assert partial["message"] == ("1 unfinished download(s) in .cache/huggingface/download/: Xy1z.abcdef.incomplete; "
                                  "files of this checkpoint are missing")


def test_an_error_other_than_a_missing_file_leaves_it_a_warning(built, tmp_path: Path) -> None:
    """A complete checkpoint with a reader error that is not a missing file (a symlink leading outside)."""
    root = _local_dir(built, tmp_path)
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    (root / "tokenizer.json").unlink()
    (root / "tokenizer.json").symlink_to(outside)
    report = verify(str(root))
    assert "path-escape" in report.codes()
    (partial,) = [f for f in report.findings if f.code == "partial-download"]
    assert partial.severity == "warning"
    assert partial.message.endswith("(this checkpoint itself looks complete: perhaps another revision)")


def test_more_than_three_unfinished_downloads_are_elided(built, tmp_path: Path) -> None:
    root = _local_dir(built, tmp_path)
    for name in ("a.incomplete", "b.incomplete", "c.incomplete"):
        (root / ".cache" / "huggingface" / "download" / name).write_bytes(b"\0")
    (partial,) = _partial(root)
    assert partial["message"].startswith("4 unfinished download(s) in .cache/huggingface/download/: ")
    assert partial["message"].count(".incomplete") == 3 and " ... (" in partial["message"]
    assert partial["fix"] == ("re-run the download (hf download / snapshot_download) to finish it, then verify "
                              "again; or delete the .incomplete files")


def test_unfinished_downloads_of_nested_files_in_a_local_dir_are_found(built, tmp_path: Path) -> None:
    """hf keeps the .incomplete of clef_head/x beside its metadata, in download/clef_head/: listed too."""
    root = _local_dir(built, tmp_path)
    nested = root / ".cache" / "huggingface" / "download" / "clef_head" / "tables.abc.incomplete"
    nested.write_bytes(b"\0")
    (partial,) = _partial(root)
    assert partial["message"].startswith("2 unfinished download(s) in .cache/huggingface/download/: "
                                         "Xy1z.abcdef.incomplete, clef_head/tables.abc.incomplete (")


def test_exactly_three_unfinished_downloads_are_all_listed_without_an_ellipsis(built, tmp_path: Path) -> None:
    root = _local_dir(built, tmp_path)
    for name in ("a.incomplete", "b.incomplete"):
        (root / ".cache" / "huggingface" / "download" / name).write_bytes(b"\0")
    (partial,) = _partial(root)
    assert partial["message"] == ("3 unfinished download(s) in .cache/huggingface/download/: Xy1z.abcdef.incomplete, "
                                  "a.incomplete, b.incomplete (this checkpoint itself looks complete: "
                                  "perhaps another revision)")


def test_the_blob_store_of_a_cache_snapshot_is_listed_at_its_top_level_only(built, tmp_path: Path) -> None:
    """blobs/ is flat: an .incomplete in a folder below it is nothing hf left there."""
    snapshot = build_hub_cache(tmp_path / "hub", "org/name", built("layout-2", "hybrid"))
    blobs = repo_folder(tmp_path / "hub", "org/name") / "blobs"
    (blobs / "0123abcd.incomplete").write_bytes(b"\0")
    (blobs / "sub").mkdir()
    (blobs / "sub" / "4567ef.incomplete").write_bytes(b"\0")
    (partial,) = _partial(snapshot)
    assert partial["severity"] == "warning"
    assert partial["message"].startswith("1 unfinished download(s) in the repository's blobs/: 0123abcd.incomplete (")


def test_a_snapshot_folder_without_a_blob_store_still_has_its_local_dir_downloads_listed(built, tmp_path: Path) -> None:
    """A snapshot-shaped folder holding real files (no blobs/ beside snapshots/): the local_dir place is
    still looked at."""
    root = build_local_dir(repo_folder(tmp_path / "hub", "org/name") / "snapshots" / ("a" * 40),
                           built("layout-2", "hybrid"))
    (root / INCOMPLETE).write_bytes(b"\0")
    ck = read_checkpoint(root)
    assert ck.hf_snapshot
    (partial,) = [f.to_dict() for f in check_cache(ck)]
    assert partial["message"].startswith("1 unfinished download(s) in .cache/huggingface/download/: "
                                         "Xy1z.abcdef.incomplete (")
