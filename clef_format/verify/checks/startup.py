"""What the engine reads in full at start-up and verify's structure path does not: the tables' values
and the tokenizer files. ``verify --deep`` and the serving gate run it (one function, so the two
agree); the structure path stays within its time bound (benchmarks/RESULTS.md: parsing a real-size
``tokenizer.json`` alone costs more than the whole structure path)."""

from __future__ import annotations

import json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

from clef_format.read.checkpoint import Checkpoint
from clef_format.spec import layouts as L
from clef_format.spec.findings import Finding, error, warning
from clef_format.verify.checks.tables import table_content_findings

_TOKENIZER_FIX = "download the tokenizer files again from the same revision (this one is cut short or edited)"


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON (serde_json, which the tokenizers library parses with, refuses it)")


def _library_problem(text: str) -> str | None:
    """The ``tokenizers`` library's own verdict on a tokenizer.json, when the library is importable (it is
    wherever vLLM runs: transformers needs it); ``None`` when it loads the file or is not there."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    try:
        Tokenizer.from_str(text)
    except Exception as exc:  # the library raises a bare Exception for every parse error
        return f"is refused by the tokenizers library ({str(exc)[:200]})"
    return None


def _recording(duplicates: list[str]) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """``object_pairs_hook`` keeping the last value of a key, as the loaders do, and recording each key
    written twice with different values."""
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out and out[key] != value:
                duplicates.append(key)
            out[key] = value
        return out
    return hook


def tokenizer_problem(rel: str, data: bytes, use_library: bool = True,
                      duplicates: list[str] | None = None) -> str | None:
    """What stops the engine loading this tokenizer file, or None. ``tokenizer.json`` is parsed as the
    ``tokenizers`` library (serde_json) does: no UTF-8 BOM, no NaN/Infinity, an object holding a
    ``"model"`` object with its ``"vocab"`` (a necessary condition, not the library's whole schema); then,
    where the library is importable (``use_library``), the library itself loads it: its schema is the
    fact (a real-size file takes it a fraction of a second: --deep and the gate only).
    ``tokenizer_config.json`` is read by transformers' ``json.load`` of the UTF-8 text: a BOM fails
    there too. tests/verify/test_tokenizer_rule.py checks both against ``Tokenizer.from_file``.
    ``duplicates``, when given, receives each key written twice with different values (same parse)."""
    strict = rel == "tokenizer.json"
    if not data:
        return "is empty" if strict else None
    if data.startswith(b"\xef\xbb\xbf"):
        return "starts with a UTF-8 byte order mark, which the JSON parsers of tokenizers and transformers refuse"
    try:
        text = data.decode("utf-8")
        hook = _recording(duplicates) if duplicates is not None else None
        obj = (json.loads(text, parse_constant=_no_constant, object_pairs_hook=hook) if strict else
               json.loads(text, object_pairs_hook=hook))
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError alike
        return f"is not JSON ({exc})"
    if not isinstance(obj, dict):
        return f"holds a JSON {type(obj).__name__}, not an object"
    if strict:
        model = obj.get("model")
        if not isinstance(model, dict):
            return "has no \"model\" object (tokenizers: \"Model missing.\")"
        if "vocab" not in model:
            return "has a \"model\" without its \"vocab\""
        if use_library:
            return _library_problem(text)
    return None


def tokenizer_findings(ck: Checkpoint) -> list[Finding]:
    """Each tokenizer file present must load: vLLM loads the tokenizer (``tokenizer.json`` through the
    tokenizers library, ``tokenizer_config.json`` through transformers) before it serves, and a file
    that does not parse stops the engine at start-up. A missing file, or an empty
    ``tokenizer_config.json``, is the structure path's warning; an empty ``tokenizer.json`` an error here."""
    out = []
    for rel in L.TOKENIZER_FILES:
        if not ck.has(rel):
            continue
        try:
            with open(ck.path(rel), "rb") as fh:
                data = fh.read()
        except OSError as exc:
            out.append(error("unreadable", f"{rel} cannot be read: {exc.strerror}", file=rel,
                             fix="check permissions, or re-download the file"))
            continue
        duplicates: list[str] = []
        problem = tokenizer_problem(rel, data, duplicates=duplicates)
        if problem is not None:
            out.append(error("bad-config", f"{rel} {problem}: the engine fails to start, it cannot load the "
                             "tokenizer", file=rel, fix=_TOKENIZER_FIX))
        for key in sorted(set(duplicates)):
            out.append(warning("bad-config", f"{rel} holds the key {key!r} twice with different values: the "
                               "tokenizers library and transformers load the last one; a reader that keeps the "
                               "first would build another tokenizer", file=rel,
                               fix=f"keep one {key!r} in {rel} (restore the file from the original download)"))
    return out


def startup_findings(ck: Checkpoint) -> list[Finding]:
    """The table rule over every row, the recorded digests and the tokenizer files' JSON."""
    from clef_format.read.hashing import ChangedWhileRead, read_failure

    try:
        out = table_content_findings(ck)
    except ChangedWhileRead as exc:  # cut or rewritten since the structure read: a read that changed, no verdict
        out = [read_failure(exc.filename or L.TABLES, "in full", exc)]
    except OSError as exc:
        out = [error("bad-header", f"the tables cannot be read in full: {exc}: the engine would fail loading them",
                     file=L.TABLES, fix="re-download the tables")]
    return out + tokenizer_findings(ck)
