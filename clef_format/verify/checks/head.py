"""Joint head checks: its config parses for ``JointSchemaHead(**config)`` and its tensors are exactly the head.

Errors come from facts, in this order (docs/FORMAT.md, "The joint head"):

a. the checkpoint's own ``joint_schema_model.py``, read statically (``spec.head_reference``: never
   imported, never run): the keys ``JointSchemaHead.__init__`` takes, and the exact tensor names and
   shapes of the module tree it builds at this config;
b. for whatever (a) cannot tell (no reference file, one the reader cannot follow, a subtree it cannot
   evaluate), the known facts: at the release config 122 BF16 tensors in 243,538,016 bytes and the
   stack counts and symmetry, the config keys, heads dividing width, torch's own layer shapes wherever
   torch's names appear;
c. the names this project infers (and, off the release config, the stack counts and symmetry that hang on
   them): a note (info), never an error on their own.
"""

from __future__ import annotations

import json

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from clef_format.verify.vllm_build import VllmBuild
    from typing import Callable, Iterator, Mapping

    _Tensors = Mapping[str, tuple[str, tuple[int, ...]]]

from clef_format.read.checkpoint import Checkpoint
from clef_format.verify.options import DEFAULTS, VerifyOptions
from clef_format.read.safetensors import encode_header
from clef_format.spec import layouts as L
from clef_format.spec.findings import Finding, error, info, warning
from clef_format.spec.head_reference import Reference, read_reference, under
from clef_format.spec.joint_head import (
    CONFIG_KEYS, HEAD_DTYPE, RELEASE_CONFIG, RELEASE_FILE_BYTES, RELEASE_TENSORS, HeadConfig, HeadConfigError, HeadProblem,
    config_problems, dtype_problems, feedforward_of, inferred_problems, parse_head_config, stack_problems,
    torch_layer_problems,
)
from clef_format.spec.marker import without_marker

_FIX = "re-download the joint head files of this revision"
#: Findings listed per head file (a hostile or foreign file must not flood the report).
_MAX_FINDINGS = 50


def check_head(ck: Checkpoint, opts: VerifyOptions = DEFAULTS, vllm: VllmBuild | None = None) -> Iterator[Finding]:
    weights, config_rel = L.head_files(ck.layout)
    if ck.head_config is None or not ck.has(config_rel):
        return
    try:
        cfg, unknown = parse_head_config(ck.head_config)
    except HeadConfigError as exc:
        built = _config_the_reference_builds(ck)
        if built is None:
            yield error("head-incomplete", str(exc), file=config_rel, fix=_FIX)
            return
        cfg, unknown, cast = built
        yield warning("head-config-invalid", f"{config_rel}: {', '.join(cast)} not integers; the checkpoint's own "
                      f"{L.HEAD_CODE} converts them and builds the head (a plugin whose JointSchemaHead does not "
                      "would fail)", file=config_rel, fix=f"write them as integers in {config_rel}: "
                      + ", ".join(f"{k}: {getattr(cfg, k)}" for k in cast))
    ref = read_reference(ck.head_code, without_marker(ck.head_config)) if ck.head_code is not None else None
    yield from _reference_findings(ref)
    if ref is not None and ref.status == "ok":
        unknown = list(ref.rejected)  # the reference's own signature decides which keys it takes
    if unknown:
        yield error("head-unexpected",
                    f"{config_rel} has keys {unknown} that JointSchemaHead(**config) does not accept",
                    file=config_rel, fix=f"remove {unknown} from {config_rel}")
    if ref is not None and ref.fails_kind == "missing":
        yield error("head-incomplete", f"{config_rel}: {ref.fails}", file=config_rel, fix=_FIX)
    if ck.model is not None and cfg.hidden_size != ck.model.text.hidden_size:
        yield error("head-incomplete",
                    f"joint head hidden_size {cfg.hidden_size} differs from the backbone's {ck.model.text.hidden_size}",
                    file=config_rel, fix=_FIX)
    header = ck.headers.get(weights)
    if header is None:
        return
    tensors = {name: (i.dtype, i.shape) for name, i in header.tensors.items()}
    known = ref if ref is not None and ref.status == "ok" and not ref.fails else None
    # The reader stopped partway ("" unknown): the statements after the stop may still replace or delete
    # what it built, so the tree so far decides nothing; its differences are a note.
    stopped = known is not None and "" in known.unknown
    exact = _reference_problems(known, tensors) if known is not None else []
    if stopped:
        yield from _partial_note(exact, weights)
        exact = []
    fully_known = known is not None and not known.unknown
    # what the reference did not decide: the whole head without a reference read, else its unknown subtrees
    scope = ("",) if known is None else known.unknown
    rest = {n: v for n, v in tensors.items() if under(n, scope)}
    # the config against the layers' matrices: where the reference did not decide them, and next to a
    # mismatch with the reference (the config may be what changed: the finding names the fix). Where the
    # reference decided a layer and the file matches it, that is the fact, even a layer of 2 * feedforward.
    judged = tensors if exact else rest
    feedforward_fix = not exact or known is None or _feedforward_fixes(ck, cfg, tensors)
    config_findings = [] if not judged else list(_config_findings(cfg, judged, config_rel, known, feedforward_fix))
    yield from config_findings
    if ref is not None and ref.fails_kind == "fails" and not config_findings:
        yield error("head-config-invalid", f"{config_rel}: {ref.fails}", file=config_rel,
                    fix=_failing_key_fix(ck, config_rel) or _FIX)
    facts, stack_notes = _fact_problems(cfg, tensors, rest, ck.files.get(weights), fully_known, scope)
    problems = exact + facts
    reported = {p.tensor for p in problems}
    problems += [p for p in dtype_problems(tensors) if p.tensor not in reported]
    exact_ids = {id(p) for p in exact}
    fallback_fix = _fallback_fix(ref)
    for p in problems[:_MAX_FINDINGS]:
        code = "head-unexpected" if p.kind == "unexpected" else "head-incomplete"
        fix = _FIX if id(p) in exact_ids or fallback_fix is None else fallback_fix
        yield error(code, f"{weights}: {p.message}", file=weights, tensor=p.tensor or None, fix=fix)
    if len(problems) > _MAX_FINDINGS:
        yield error("head-incomplete", f"{weights}: {len(problems) - _MAX_FINDINGS} more problem(s) not listed",
                    file=weights, fix=_FIX)
    if scope:  # (c): only for the tensors the reference did not decide, and only a note
        notes = stack_notes + [p for p in inferred_problems(cfg, rest) if p.tensor not in reported
                               and under(p.tensor, scope)]
        if notes:
            shown = "; ".join(p.message for p in notes[:5]) + (f"; {len(notes) - 5} more" if len(notes) > 5 else "")
            yield info("head-names-inferred",
                       f"{weights}: differs from the tensor names clef-format infers (not published, so not an "
                       f"error): {shown}", file=weights)


def _config_the_reference_builds(ck: Checkpoint) -> tuple[HeadConfig, list[str], list[str]] | None:
    """For a head config whose values are not plain ints (``64.0``, ``"4"``): the config as the checkpoint's own
    reference takes it, when that reference, read with the values as written, builds the whole head (it
    converts them itself: ``int(width)``); with the unknown keys and the keys converted. None otherwise: the
    strict rule stands."""
    raw = ck.head_config
    if ck.head_code is None or not isinstance(raw, dict) or any(k not in raw for k in CONFIG_KEYS):
        return None
    ref = read_reference(ck.head_code, without_marker(raw))
    if ref.status != "ok" or ref.reason or ref.unknown or ref.fails:
        return None
    values: dict[str, int] = {}
    for k in CONFIG_KEYS:
        v = raw[k]
        try:
            values[k] = int(v) if isinstance(v, (int, float, str)) and not isinstance(v, bool) else int("x")
        except (ValueError, OverflowError):
            return None
    try:
        cfg, _ = parse_head_config({**raw, **values})
    except HeadConfigError:
        return None
    cast = [k for k in CONFIG_KEYS if type(raw[k]) is not int]
    return cfg, list(ref.rejected), cast


def _reference_findings(ref: Reference | None) -> Iterator[Finding]:
    if ref is None:
        return
    if ref.status == "invalid":
        yield error("head-code-invalid", f"{L.HEAD_CODE} is not valid Python: {ref.reason}; the plugin cannot "
                    "import JointSchemaHead from it", file=L.HEAD_CODE,
                    fix=f"re-download {L.HEAD_CODE} from the same revision of the checkpoint")
    elif ref.status == "unread":
        yield info("head-code-invalid", f"{L.HEAD_CODE} was not read statically ({ref.reason}); the joint head is "
                   "checked from the known facts only", file=L.HEAD_CODE)
    elif ref.status == "ok" and ref.reason:
        yield info("head-code-invalid", f"{L.HEAD_CODE} could not be followed statically past {_stop(ref)}, a "
                   "construct the static reader does not evaluate (valid Python is not an error); the joint head is "
                   "checked from the known facts only", file=L.HEAD_CODE)
    elif ref.status == "ok" and ref.unknown and not ref.fails:
        parts = [f"{path} (built at {_where(why)})" for path, why in zip(ref.unknown, ref.why)]
        shown = "; ".join(parts[:5]) + (f"; {len(parts) - 5} more" if len(parts) > 5 else "")
        yield info("head-code-invalid", f"{L.HEAD_CODE} was read statically except the module(s) {shown}: a "
                   "construct the static reader does not evaluate (valid Python is not an error); the tensors under "
                   "them are checked from the known facts only, the rest exactly", file=L.HEAD_CODE)


def _partial_note(problems: list[HeadProblem], weights: str) -> Iterator[Finding]:
    if problems:
        shown = "; ".join(p.message for p in problems[:5]) + (f"; {len(problems) - 5} more" if len(problems) > 5 else "")
        yield info("head-code-invalid", f"{weights}: differs from what {L.HEAD_CODE} builds up to where the reader "
                   f"stopped (not an error: the statements after it may change the module tree): {shown}",
                   file=weights)


def _where(why: str) -> str:
    """``line 8: While`` -> ``line 8 (While)``."""
    line, sep, what = why.partition(": ")
    return f"{line} ({what})" if sep and line.startswith("line ") else why


def _stop(ref: Reference) -> str:
    """Where the reader stopped: ``line 8 (While)``."""
    return _where(ref.reason.removeprefix("read up to "))


def _fallback_fix(ref: Reference | None) -> str | None:
    """The fix of a fact finding when the reference file was there but the reader could not follow it: the
    cause may be the reader, so it says which fact the head contradicts and where the reader stopped, and
    does not send the user to re-download a head that may be fine. None when the reference was read or absent."""
    if ref is None or ref.status == "invalid" or (ref.status == "ok" and not ref.reason and not ref.why):
        return None
    where = (_stop(ref) if ref.reason else _where(ref.why[0])) if ref.status == "ok" else ref.reason
    return (f"the head contradicts the fact stated; {L.HEAD_CODE} could not be followed statically ({where}), so "
            "compare the head with the module tree that file builds at this config before replacing either")


def _natural(name: str) -> list[tuple[int, int | str]]:
    """Sort key: layers.4 before layers.10."""
    return [(0, int(p)) if p.isdigit() else (1, p) for p in name.split(".")]


def _group(names: set[str], other: set[str]) -> list[tuple[str, int]]:
    """Names grouped by their shortest module path holding only such names (none of ``other``); a group of
    one is the tensor's own name."""
    out: list[tuple[str, int]] = []
    done: set[str] = set()
    for name in sorted(names, key=_natural):
        if name in done:
            continue
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if not any(under(o, (prefix,)) for o in other):
                members = {n for n in names if under(n, (prefix,))}
                done |= members
                out.append((prefix if len(members) > 1 else name, len(members)))
                break
    return out


def _reference_problems(ref: Reference, tensors: _Tensors) -> list[HeadProblem]:
    """(a): the head file against the module tree joint_schema_model.py builds, exactly (outside the
    subtrees the reader could not evaluate)."""
    return exact_problems(ref.tensors, tensors, ref.unknown, L.HEAD_CODE)


def exact_problems(want: Mapping[str, tuple[int, ...]], tensors: _Tensors, unknown: tuple[str, ...] = (),
                   builder: str = L.HEAD_CODE) -> list[HeadProblem]:
    """A head file against the exact names and shapes ``builder`` builds (the reference file, or the
    serving plugin's own head): tensors lacking or extra (grouped by module), shapes that differ.
    Tensors under the ``unknown`` module paths are not judged here."""
    out: list[HeadProblem] = []
    missing = {n for n in want if n not in tensors}
    extra = {n for n in tensors if n not in want and not under(n, unknown)}
    for prefix, count in _group(missing, set(tensors)):
        what = prefix if count == 1 else f"{prefix} ({count} tensors)"
        out.append(HeadProblem("missing", prefix, f"lacks {what}, which {builder} builds"))
    for prefix, count in _group(extra, set(want)):
        what = prefix if count == 1 else f"{prefix} ({count} tensors)"
        out.append(HeadProblem("unexpected", prefix, f"holds {what}, which {builder} does not build"))
    for name in sorted((n for n in want if n in tensors and tuple(tensors[n][1]) != tuple(want[n])), key=_natural):
        out.append(HeadProblem("shape", name, f"{name} is {tensors[name][0]}{list(tensors[name][1])}, "
                               f"{builder} builds {HEAD_DTYPE}{list(want[name])}"))
    return out


def _fact_problems(cfg: HeadConfig, tensors: _Tensors, rest: _Tensors, file_size: int | None,
                   fully_known: bool, scope: tuple[str, ...]) -> tuple[list[HeadProblem], list[HeadProblem]]:
    """(b): (errors, notes) for the tensors the reference did not decide (``rest``, under the module paths
    ``scope``): a stack layer the reference decided is never reported missing from ``rest``.

    Errors: the published figures at the release config, torch's layer shapes wherever torch's names
    appear. The stack counts and symmetry hang on the stack names ``evidence_layers`` / ``layers`` and on
    layers built alike, both inferred: an error at the release config (where the release's figures back
    them), a note at any other config, where nothing published says how the head names its layers."""
    errors: list[HeadProblem] = []
    notes: list[HeadProblem] = []
    release = cfg._asdict() == RELEASE_CONFIG
    if not fully_known and release:
        errors += _release_figures(tensors, file_size)
    if rest:
        (errors if release else notes).extend(p for p in stack_problems(cfg, rest) if under(p.tensor, scope))
        errors += [p for p in torch_layer_problems(cfg, rest) if p.kind == "config" or under(p.tensor, scope)]
    return errors, notes


def _release_figures(tensors: _Tensors, file_size: int | None) -> list[HeadProblem]:
    """At the release config: 122 tensors and a file of 243,538,016 bytes as safetensors writes it.

    The size compared is the file's own when it has exactly the release's size; else the size the
    safetensors writer gives these tensors (all BF16, so stored in name order; with or without the
    ``{"format": "pt"}`` metadata), so a head re-saved with another header layout is judged by its tensors.
    """
    out: list[HeadProblem] = []
    if len(tensors) != RELEASE_TENSORS:
        out.append(HeadProblem("missing" if len(tensors) < RELEASE_TENSORS else "unexpected", "",
                               f"holds {len(tensors)} tensors; at the release config the release's head holds "
                               f"{RELEASE_TENSORS}"))
    if file_size == RELEASE_FILE_BYTES or any(d != HEAD_DTYPE for d, _ in tensors.values()):
        return out  # another dtype is reported tensor by tensor
    entries = [(n, d, tuple(s)) for n, (d, s) in sorted(tensors.items())]
    sizes = {len(h) + size for h, size in (encode_header(entries, md) for md in (None, {"format": "pt"}))}
    if RELEASE_FILE_BYTES not in sizes:
        out.append(HeadProblem("shape", "", f"is {file_size} bytes ({min(sizes)} as safetensors writes these "
                               f"tensors); at the release config the release's head file is "
                               f"{RELEASE_FILE_BYTES:,} bytes"))
    return out


def _reread(ck: Checkpoint, change: Callable[[dict], dict]) -> Reference | None:
    """The reference read again at the checkpoint's head config (marker removed) as ``change`` gives it: how a
    fix is proven before it is offered. None when the reference was not read (no code) or did not build."""
    if ck.head_code is None or not isinstance(ck.head_config, dict):
        return None
    again = read_reference(ck.head_code, change(without_marker(ck.head_config)))
    return again if again.status == "ok" and not again.fails else None


def _failing_key_fix(ck: Checkpoint, config_rel: str) -> str | None:
    """The fix when a key beyond the six the head needs (``dropout``) holds the value the head's constructor
    refuses, proven by the reference itself: read again without that key (its own default), it builds."""
    raw = without_marker(ck.head_config) if isinstance(ck.head_config, dict) else {}
    for key in [k for k in raw if k not in CONFIG_KEYS]:
        if _reread(ck, lambda c: {k: v for k, v in c.items() if k != key}) is not None:
            return (f"remove {json.dumps(key)} from {config_rel} (JointSchemaHead's own default then applies), or "
                    f"set it to a value its constructor accepts; the value {json.dumps(raw[key])} makes it raise")
    return None


def _feedforward_fixes(ck: Checkpoint, cfg: HeadConfig, tensors: _Tensors) -> bool:
    """Next to a mismatch with the reference: whether the feedforward the layers store (``linear1`` rows)
    is the fix, proven by the reference itself: read again with that value, it builds exactly this file.
    Without torch's names to read the value from, the finding stands (its fix names the release's value);
    with layers whose ``linear1`` rows disagree there is no one value to set, and the mismatches say it."""
    value = feedforward_of(tensors)
    if value is None:  # no linear1 to read it from (the finding stands), or layers that disagree (it does not)
        return not any(n.endswith(".linear1.weight") for n in tensors)
    if value == cfg.feedforward:
        return False
    again = _reread(ck, lambda c: {**c, "feedforward": value})
    return again is not None and not again.unknown and not _reference_problems(again, tensors)


def _config_findings(cfg: HeadConfig, tensors: _Tensors, config_rel: str, ref: Reference | None,
                     feedforward_fix: bool = True) -> Iterator[Finding]:
    """heads dividing width (torch's attention asserts it) is an error; the feedforward width read from
    the layers' matrices is an error next to a reference mismatch when the reference, read with the stored
    value, builds the file exactly (``feedforward_fix``: it names the fix), else a warning."""
    for p in config_problems(cfg, tensors):
        if p.tensor == "feedforward" and not feedforward_fix:
            continue
        value = feedforward_of(tensors) if p.tensor == "feedforward" else None
        fix = (f'set "feedforward": {value} in {config_rel}' if value is not None else
               f"set {p.tensor} in {config_rel} to the value the head was trained with (the release: "
               f"{'16, dividing width 1024' if p.tensor == 'heads' else '4096'})")
        make = error if p.tensor == "heads" or ref is not None or value is not None else warning
        yield make("head-config-invalid", f"{config_rel}: {p.message}", file=config_rel, fix=fix)
