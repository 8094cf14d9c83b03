"""Reading clef_manifest.json (read/manifest.py) as hostile input: size limit, JSON, version,
member names and entry types, each refused with its finding; valid entries kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clef_format.read.checkpoint import MAX_JSON_BYTES, read_checkpoint
from clef_format.read.manifest import MANIFEST_NAME, ManifestEntry, manifest_files, read_manifest

DIGEST = "ab" * 32


def _with_manifest(fresh, content: bytes | dict) -> Path:
    root = fresh()
    raw = content if isinstance(content, bytes) else json.dumps(content).encode()
    (root / MANIFEST_NAME).write_bytes(raw)
    return root


def _manifest(files: dict) -> dict:
    return {"clef_manifest": 1, "algorithm": "blake3", "created_by": "clef-format 0", "files": files}


def test_no_manifest_is_none_and_no_finding(fresh) -> None:
    assert read_manifest(read_checkpoint(fresh())) == (None, [])


def test_valid_entries_are_read_and_the_manifest_is_not_its_own_entry(fresh) -> None:
    root = _with_manifest(fresh, _manifest({"config.json": {"size": 12, "blake3": DIGEST},
                                            "sub/x.bin": {"size": 0, "blake3": DIGEST}}))
    ck = read_checkpoint(root)
    assert read_manifest(ck) == ({"config.json": ManifestEntry(12, DIGEST), "sub/x.bin": ManifestEntry(0, DIGEST)}, [])
    assert MANIFEST_NAME not in manifest_files(ck) and "config.json" in manifest_files(ck)


def test_a_manifest_of_exactly_the_limit_is_read_one_byte_more_is_not(fresh) -> None:
    body = json.dumps(_manifest({})).encode()
    root = _with_manifest(fresh, body + b" " * (MAX_JSON_BYTES - len(body)))
    assert read_manifest(read_checkpoint(root)) == ({}, [])
    (root / MANIFEST_NAME).write_bytes(body + b" " * (MAX_JSON_BYTES + 1 - len(body)))
    entries, (finding,) = read_manifest(read_checkpoint(root))
    assert entries is None
    assert finding.to_dict() == {
        "code": "bad-config", "severity": "error",
        "message": f"{MANIFEST_NAME} is {MAX_JSON_BYTES + 1} bytes, over the {MAX_JSON_BYTES} limit; not read",
        "file": MANIFEST_NAME, "fix": f"re-create it with `clef-format manifest {root}` from a known-good copy"}


@pytest.mark.parametrize("content, words", [
    (b"\x00\x01garbage", "is not valid JSON"),
    (b"\xff\xfe{}", "is not valid JSON"),
    (b"[1, 2]", "is not a version-1 blake3 manifest"),
    ({"clef_manifest": 2, "algorithm": "blake3", "files": {}}, "is not a version-1 blake3 manifest"),
    ({"clef_manifest": 1, "algorithm": "sha256", "files": {}}, "is not a version-1 blake3 manifest"),
    ({"clef_manifest": 1, "algorithm": "blake3", "files": []}, "is not a version-1 blake3 manifest"),
])
def test_an_unusable_manifest_is_one_bad_config(fresh, content, words: str) -> None:
    root = _with_manifest(fresh, content)
    entries, (finding,) = read_manifest(read_checkpoint(root))
    assert entries is None
    assert (finding.code, finding.severity, finding.file) == ("bad-config", "error", MANIFEST_NAME)
    assert finding.message.startswith(MANIFEST_NAME + " ") and words in finding.message
    assert finding.fix == f"re-create it with `clef-format manifest {root}` from a known-good copy"


@pytest.mark.parametrize("entry", [
    "not a dict", {"size": 1}, {"blake3": DIGEST}, {"size": 1, "blake3": DIGEST.upper()},
    {"size": 1, "blake3": DIGEST[:-1]}, {"size": 1, "blake3": DIGEST + "0"}, {"size": -1, "blake3": DIGEST},
    {"size": True, "blake3": DIGEST}, {"size": "1", "blake3": DIGEST}, {"size": 1.0, "blake3": DIGEST},
    {"size": 1, "blake3": 7},
])
def test_a_malformed_entry_is_refused_and_the_others_kept(fresh, entry) -> None:
    root = _with_manifest(fresh, _manifest({"bad.bin": entry, "config.json": {"size": 3, "blake3": DIGEST}}))
    entries, (finding,) = read_manifest(read_checkpoint(root))
    assert entries == {"config.json": ManifestEntry(3, DIGEST)}
    assert (finding.code, finding.file) == ("bad-config", MANIFEST_NAME)
    assert finding.message == f"{MANIFEST_NAME}: entry 'bad.bin' lacks a size and a blake3 digest"


@pytest.mark.parametrize("rel", ["../outside", "/etc/passwd", "a/../../b", "", "a\\b"])
def test_a_member_leaving_the_checkpoint_is_a_path_escape(fresh, rel: str) -> None:
    root = _with_manifest(fresh, _manifest({rel: {"size": 1, "blake3": DIGEST}}))
    entries, (finding,) = read_manifest(read_checkpoint(root))
    assert entries == {}
    assert (finding.code, finding.severity, finding.file) == ("path-escape", "error", MANIFEST_NAME)
    assert finding.message == f"{MANIFEST_NAME} names {rel!r}, a path outside the checkpoint; never read"
    assert finding.fix and "clef-format manifest" in finding.fix


def test_a_built_manifest_names_its_writer_and_reads_back(fresh) -> None:
    from clef_format import __version__
    from clef_format.read.manifest import build_manifest

    built = build_manifest({"config.json": DIGEST, "a/b.json": "cd" * 32}, {"config.json": 12, "a/b.json": 0})
    assert built == {"clef_manifest": 1, "algorithm": "blake3", "created_by": f"clef-format {__version__}",
                     "files": {"a/b.json": {"size": 0, "blake3": "cd" * 32}, "config.json": {"size": 12, "blake3": DIGEST}}}
    root = _with_manifest(fresh, built)
    assert read_manifest(read_checkpoint(root)) == (
        {"a/b.json": ManifestEntry(0, "cd" * 32), "config.json": ManifestEntry(12, DIGEST)}, [])


def test_a_malformed_entry_says_how_to_recreate_the_manifest(fresh) -> None:
    root = _with_manifest(fresh, _manifest({"bad.bin": {"size": 1}}))
    _, (finding,) = read_manifest(read_checkpoint(root))
    assert finding.fix == f"re-create it with `clef-format manifest {root}` from a known-good copy"


def test_a_manifest_that_cannot_be_read_is_unreadable_and_not_to_be_regenerated(fresh) -> None:
    """The manifest is listed, then cannot be opened (here: replaced by a folder): a statement about
    access (exit 2), never a verdict on its content."""
    root = _with_manifest(fresh, _manifest({}))
    ck = read_checkpoint(root)
    (root / MANIFEST_NAME).unlink()
    (root / MANIFEST_NAME).mkdir()
    entries, findings = read_manifest(ck)
    assert entries is None
    assert [f.to_dict() for f in findings] == [{
        "code": "unreadable", "severity": "error", "message": f"{MANIFEST_NAME} cannot be read: Is a directory",
        "file": MANIFEST_NAME,
        "fix": f"make {MANIFEST_NAME} readable (check its permissions); do not regenerate it, it is the integrity reference"}]


def test_a_key_written_twice_is_refused_as_in_every_other_json(fresh) -> None:
    """The same rule as config.json, the index and the head config (read.checkpoint.loads_unique): a
    manifest whose entry for a file appears twice is bad-config, never read with the last one winning."""
    good = json.dumps({"size": 12, "blake3": DIGEST})
    raw = ('{"clef_manifest": 1, "algorithm": "blake3", "created_by": "x", "files": {"config.json": '
           f'{json.dumps({"size": 12, "blake3": "0" * 64})}, "config.json": {good}}}}}').encode()
    root = _with_manifest(fresh, raw)
    entries, findings = read_manifest(read_checkpoint(root))
    assert entries is None and [f.to_dict() for f in findings] == [{
        "code": "bad-config", "severity": "error",
        "message": f"{MANIFEST_NAME} holds the key 'config.json' twice: JSON readers disagree on which one counts "
                   "(Python's keeps the last, others the first)",
        "file": MANIFEST_NAME, "fix": f"re-create it with `clef-format manifest {root}` from a known-good copy"}]


def test_a_non_normalized_entry_is_a_finding_and_ignored(fresh) -> None:
    """``sub/./x.bin`` is not how manifest writes a path: the entry is reported and never stands for
    ``sub/x.bin`` (whose own entry, when there is one, it would otherwise replace)."""
    root = _with_manifest(fresh, _manifest({"config.json": {"size": 12, "blake3": DIGEST},
                                            "sub/./x.bin": {"size": 0, "blake3": DIGEST}}))
    entries, (finding,) = read_manifest(read_checkpoint(root))
    assert entries == {"config.json": ManifestEntry(12, DIGEST)}
    assert (finding.code, finding.severity, finding.file) == ("bad-config", "error", MANIFEST_NAME)
    assert "'sub/./x.bin'" in finding.message and "'sub/x.bin'" in finding.message
    assert "two entries" not in finding.message
