"""clef-format's own hash manifest, ``clef_manifest.json`` at the checkpoint root.

Format (version 1)::

    {"clef_manifest": 1, "algorithm": "blake3", "created_by": "clef-format X",
     "files": {"<posix rel path>": {"size": <bytes>, "blake3": "<64 hex>"}}}

BLAKE3 because it is a tree hash: one file is hashed on every core at once, so ``verify --deep``
against a manifest costs a fraction of a sequential sha256 pass (benchmarks/RESULTS.md). The
manifest lists every regular file ``read_checkpoint`` sees, except itself. It proves integrity
(the files are those that were hashed), not authenticity: anyone who can change the files can
change the manifest. Inside a Hugging Face snapshot it is never written (the cache blob names
already are a manifest); a manifest shipped *in* a repo is itself checked against its blob name.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from clef_format.read.checkpoint import (
    MAX_JSON_BYTES, Checkpoint, DuplicateKey, duplicate_key_message, loads_unique, safe_member,
)
from clef_format.spec.findings import Finding, error
from clef_format.shell import quote_path

MANIFEST_NAME = "clef_manifest.json"
MANIFEST_VERSION = 1
ALGORITHM = "blake3"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class ManifestEntry(NamedTuple):
    size: int
    digest: str


def manifest_files(ck: Checkpoint) -> dict[str, int]:
    """The files a manifest of ``ck`` covers: every readable file but the manifest itself."""
    return {rel: size for rel, size in sorted(ck.files.items()) if rel != MANIFEST_NAME}


def build_manifest(digests: dict[str, str], sizes: dict[str, int]) -> dict[str, Any]:
    from clef_format import __version__

    return {
        "clef_manifest": MANIFEST_VERSION,
        "algorithm": ALGORITHM,
        "created_by": f"clef-format {__version__}",
        "files": {rel: {"size": sizes[rel], ALGORITHM: digests[rel]} for rel in sorted(digests)},
    }


def read_manifest(ck: Checkpoint) -> tuple[dict[str, ManifestEntry] | None, list[Finding]]:
    """The manifest's entries (``None`` if there is none or it is unusable) and what is wrong with it.

    Hostile input: keys are checked like index entries (never used as paths before
    ``safe_member``), sizes and digests are type-checked, and the file is size-limited.
    """
    if MANIFEST_NAME not in ck.files:
        return None, []
    fix = f"re-create it with `clef-format manifest {quote_path(ck.name)}` from a known-good copy"
    size = ck.files[MANIFEST_NAME]
    if size > MAX_JSON_BYTES:
        return None, [error("bad-config", f"{MANIFEST_NAME} is {size} bytes, over the {MAX_JSON_BYTES} limit; not read",
                            file=MANIFEST_NAME, fix=fix)]
    try:
        with open(ck.path(MANIFEST_NAME), "rb") as fh:
            raw = loads_unique(fh.read())
    except OSError as exc:  # reading failed: nothing is said about the manifest's content (exit 2)
        return None, [error("unreadable", f"{MANIFEST_NAME} cannot be read: {exc.strerror or exc}", file=MANIFEST_NAME,
                            fix=f"make {MANIFEST_NAME} readable (check its permissions); do not regenerate it, it is "
                                "the integrity reference")]
    except DuplicateKey as exc:  # the integrity reference is refused, never read as one reader would
        return None, [error("bad-config", duplicate_key_message(MANIFEST_NAME, exc.key), file=MANIFEST_NAME, fix=fix)]
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return None, [error("bad-config", f"{MANIFEST_NAME} is not valid JSON: {exc}", file=MANIFEST_NAME, fix=fix)]
    if (not isinstance(raw, dict) or raw.get("clef_manifest") != MANIFEST_VERSION
            or raw.get("algorithm") != ALGORITHM or not isinstance(raw.get("files"), dict)):
        return None, [error("bad-config",
                            f"{MANIFEST_NAME} is not a version-{MANIFEST_VERSION} {ALGORITHM} manifest of this clef-format",
                            file=MANIFEST_NAME, fix=fix)]
    entries: dict[str, ManifestEntry] = {}
    findings: list[Finding] = []
    for rel, entry in raw["files"].items():
        member = safe_member(rel)
        if member is None:
            findings.append(error("path-escape", f"{MANIFEST_NAME} names {rel!r}, a path outside the checkpoint; never read",
                                  file=MANIFEST_NAME, fix=fix))
            continue
        if member != rel:  # "clef_head/../tokenizer.json" would silently stand in for tokenizer.json's own entry
            twice = f"; {member!r} is listed too: two entries for one file" if member in raw["files"] else ""
            findings.append(error(
                "bad-config", f"{MANIFEST_NAME} names {rel!r}, not a normalized path (it stands for {member!r}){twice}; "
                "the entry is ignored (clef-format manifest writes each file once, by its plain path)",
                file=MANIFEST_NAME, fix=fix))
            continue
        digest = entry.get(ALGORITHM) if isinstance(entry, dict) else None
        esize = entry.get("size") if isinstance(entry, dict) else None
        if (not isinstance(digest, str) or not _HEX64.match(digest) or not isinstance(esize, int)
                or isinstance(esize, bool) or esize < 0):
            findings.append(error("bad-config", f"{MANIFEST_NAME}: entry {rel!r} lacks a size and a {ALGORITHM} digest",
                                  file=MANIFEST_NAME, fix=fix))
            continue
        entries[member] = ManifestEntry(esize, digest)
    return entries, findings
