"""What the engine reads in full at start-up and verify's structure path does not: the tables' values
and the tokenizer files. ``verify --deep`` and the serving gate run it (one function, so the two
agree); the structure path stays within its time bound (benchmarks/RESULTS.md: parsing a real-size
``tokenizer.json`` alone costs more than the whole structure path)."""

from __future__ import annotations

import json

from clef_format.read.checkpoint import Checkpoint
from clef_format.spec import layouts as L
from clef_format.spec.findings import Finding, error
from clef_format.verify.checks.tables import table_content_findings

_TOKENIZER_FIX = "download the tokenizer files again from the same revision (this one is cut short or edited)"


def tokenizer_findings(ck: Checkpoint) -> list[Finding]:
    """Each tokenizer file present and not empty must be a JSON object: vLLM loads the tokenizer
    (``tokenizer.json`` through the tokenizers library, ``tokenizer_config.json`` through
    transformers) before it serves, and a file that does not parse stops the engine at start-up.
    A missing or empty file is the structure path's warning."""
    out = []
    for rel in L.TOKENIZER_FILES:
        if not ck.has(rel) or ck.files.get(rel) == 0:
            continue
        try:
            with open(ck.path(rel), "rb") as fh:
                data = fh.read()
        except OSError as exc:
            out.append(error("unreadable", f"{rel} cannot be read: {exc.strerror}", file=rel,
                             fix="check permissions, or re-download the file"))
            continue
        try:
            obj = json.loads(data)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError alike
            out.append(error("bad-config", f"{rel} is not JSON ({exc}): the engine fails to start, it cannot load "
                             "the tokenizer", file=rel, fix=_TOKENIZER_FIX))
            continue
        if not isinstance(obj, dict):
            out.append(error("bad-config", f"{rel} holds a JSON {type(obj).__name__}, not an object: the engine "
                             "fails to start, it cannot load the tokenizer", file=rel, fix=_TOKENIZER_FIX))
    return out


def startup_findings(ck: Checkpoint) -> list[Finding]:
    """The table rule over every row, the recorded digests and the tokenizer files' JSON."""
    try:
        out = table_content_findings(ck)
    except OSError as exc:
        out = [error("bad-header", f"the tables cannot be read in full: {exc}: the engine would fail loading them",
                     file=L.TABLES, fix="re-download the tables")]
    return out + tokenizer_findings(ck)
