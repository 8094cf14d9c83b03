"""Unfinished downloads (verify/checks/cache.py): an error when the checkpoint itself is incomplete,
a warning beside a complete one, decided on what the reader found and on the layout's files."""

from __future__ import annotations

import json
from pathlib import Path

from clef_format.fixtures.hub_cache import build_local_dir
from clef_format.spec import layouts as L
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
