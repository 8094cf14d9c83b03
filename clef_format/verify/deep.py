"""``verify --deep``: hash every file once against what it can be checked against, decode every scale.

What a file is checked against, best first (one hash per file, never two):

1. ``clef_manifest.json`` (BLAKE3; see ``manifest``), when it lists the file;
2. its Hugging Face cache blob name: a snapshot entry is a symlink to ``../../blobs/<etag>``, the
   etag being the sha256 of an LFS file or the git blob sha1 of a small one;
3. ``local_dir`` download metadata ``.cache/huggingface/download/<path>.metadata`` (lines: commit,
   etag, timestamp), written by ``snapshot_download(local_dir=...)``.

A file with none of these gets ``manifest-missing`` (a warning: nothing is wrong, but nothing was
proven) and the hint to run ``clef-format manifest``. Hashing runs on a thread pool, largest file
first, while this thread decodes the scales, so the scale work costs nothing extra in wall time.
Scales are decoded with numpy (imported here only, never on the fast path) from the validated header's offsets.
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from typing import Any, Callable, Iterable, Iterator, NamedTuple, TypeVar

from clef_format.progress import NO_PROGRESS
from clef_format.read.checkpoint import Checkpoint
from clef_format.read.hashing import (
    CHANGED_FIX, UNREADABLE_FIX, ChangedWhileRead, HashPool, HashResult, HashTask, read_failure,
)
from clef_format.read.hf_cache import etag_digest, local_dir_etag, local_dir_metadata, snapshot_blob
from clef_format.read.manifest import ALGORITHM as MANIFEST_ALGORITHM
from clef_format.read.manifest import MANIFEST_NAME, read_manifest
from clef_format.shell import quote, quote_path
from clef_format.spec import layouts as L
from clef_format.spec import tables_format as TF
from clef_format.spec.findings import Finding, error, info, warning

#: Largest finite value per source dtype (a scale times the quantized maximum must stay below it).
DTYPE_MAX = {"BF16": 3.3895313892515355e38, "F16": 65504.0, "F32": 3.4028234663852886e38}
#: Quantized maximum of the FP8 (E4M3) weights a backbone scale multiplies.
FP8_MAX = 448.0
T = TypeVar("T")
_FLOAT_DTYPES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0"}


class Reference(NamedTuple):
    """An expected digest for one file, and where the expectation came from."""

    algorithm: str
    digest: str
    source: str
    path: str  # what to hash (the blob for a cache snapshot entry)


def _etag_reference(etag: str, source: str, path: str) -> Reference | None:
    found = etag_digest(etag)
    return Reference(found[0], found[1], source, path) if found else None


def cache_reference(ck: Checkpoint, rel: str) -> Reference | None:
    """The blob name a snapshot entry points to, when it is an etag inside this repo's ``blobs/``."""
    blob = snapshot_blob(ck.root, ck.path(rel)) if ck.hf_snapshot else None
    return _etag_reference(os.path.basename(blob), "Hugging Face cache blob name", blob) if blob else None


def local_dir_reference(ck: Checkpoint, rel: str) -> Reference | None:
    """The etag of ``snapshot_download(local_dir=...)`` metadata for ``rel``, if present and sane.
    Raises ``OSError`` (``filename``: what cannot be read) when the metadata cannot be read."""
    etag = local_dir_etag(ck.root, rel)
    return _etag_reference(etag, "local_dir download metadata", ck.path(rel)) if etag else None


def gather_references(ck: Checkpoint, use_manifest: bool = True) -> tuple[dict[str, Reference], list[str],
                                                                          list[Finding]]:
    """Per file, the one reference it is hashed against; the files with none; findings so far.
    ``use_manifest=False``: the download's own references alone (``manifest`` asks what a file that
    differs from the present manifest was downloaded as)."""
    findings: list[Finding] = []
    entries, problems = read_manifest(ck) if use_manifest else (None, [])
    findings.extend(problems)
    refs: dict[str, Reference] = {}
    unchecked: list[str] = []
    blocked: set[str] = set()  # metadata files or folders already reported unreadable
    if entries is not None:
        for rel in sorted(set(entries) - set(ck.files)):
            if ck.reported(rel):  # there, but never read (path-escape, special-file): the reader says why
                continue
            findings.append(error("missing-file", f"{rel} is listed in {MANIFEST_NAME} but absent", file=rel,
                                  fix="restore it from the original download"))
    for rel, size in sorted(ck.files.items()):
        entry = entries.get(rel) if entries else None
        if entry is not None:
            if entry.size != size:
                findings.append(error(
                    "hash-mismatch", f"{rel}: {size} bytes, {MANIFEST_NAME} expects {entry.size}", file=rel,
                    fix=f"re-download this file (truncated or modified); if the change was intended, "
                        f"{remanifest(ck)}"))
                continue
            refs[rel] = Reference(MANIFEST_ALGORITHM, entry.digest, MANIFEST_NAME, ck.path(rel))
            continue
        try:
            ref = cache_reference(ck, rel) or local_dir_reference(ck, rel)
        except OSError as exc:  # its reference may exist but cannot be read: could not run (exit 2), no verdict
            if exc.filename not in blocked:
                blocked.add(exc.filename)
                what = (f"cannot be read: {exc.strerror} (the download metadata {rel} is checked against)"
                        if exc.filename.endswith(".metadata") else
                        f"cannot be searched: {exc.strerror} (it holds the download metadata the files are checked "
                        "against)")
                findings.append(error("unreadable", f"{exc.filename} {what}", file=exc.filename,
                                      fix="make it readable (chmod / chown), or run as a user who can read the whole "
                                          "checkpoint"))
            continue
        if ref is not None:
            refs[rel] = ref
        elif not ck.hf_snapshot and os.path.isfile(meta := local_dir_metadata(ck.root, rel)):
            findings.append(warning(  # there, but no etag in it: not "no metadata"
                "manifest-missing", f"{rel}: its local_dir download metadata {os.path.relpath(meta, ck.root)} is "
                "corrupt or unreadable (no etag sha256 or git sha1 on its second line): nothing to check it against",
                file=rel, fix=f"{_local_dir_refetch(ck, rel)}; that also rewrites the metadata"))
        elif not (rel == MANIFEST_NAME and entries is not None):
            unchecked.append(rel)
    return refs, unchecked, findings


def remanifest(ck: Checkpoint) -> str:
    """The command that records the files as they are now over the present manifest (which manifest
    refuses to overwrite with files that differ from it, unless forced or they match their download
    metadata), with the checkpoint's real path."""
    return f"re-run `clef-format manifest {quote_path(os.path.abspath(ck.root))} --force`"


def _snapshot_repo(ck: Checkpoint) -> tuple[str, str]:
    """(repo id, revision folder) of a cache snapshot; ``ORG/NAME`` when the folder names none."""
    from clef_format.read.copies import snapshot_identity

    repo_id, revision = snapshot_identity(ck.root)
    return repo_id or "ORG/NAME", revision


def unchecked_fix(ck: Checkpoint) -> str:
    """How files with nothing to be checked against get a reference."""
    if ck.hf_snapshot:  # clef-format never writes into a cache: manifest refuses there
        repo, revision = _snapshot_repo(ck)
        repo, revision = quote(repo), quote(revision)
        return (f"re-download the snapshot (`hf download {repo} --revision {revision} --force-download`: files in a "
                "cache snapshot should be symlinks to blobs/<etag>), or copy it out (`hf download "
                f"{repo} --revision {revision} --local-dir DIR`, whose metadata the gate checks)")
    return (f"clef-format manifest {quote_path(ck.name)}  (records BLAKE3 digests that later --deep runs and the "
            "serving gate check)")


def _unchecked_findings(ck: Checkpoint, unchecked: list[str], checked: int) -> list[Finding]:
    fix = unchecked_fix(ck)
    if not unchecked:
        return []
    if not checked:
        return [warning("manifest-missing",
                        f"nothing to check the {len(unchecked)} file(s) against: no {MANIFEST_NAME}, no Hugging Face "
                        "cache blob names, no local_dir download metadata; scales were still decoded", fix=fix)]
    return [warning("manifest-missing", f"{rel} has nothing to be checked against", file=rel, fix=fix)
            for rel in unchecked]


def _unreadable(ck: Checkpoint, rels: list[str]) -> list[Finding]:
    """The files with no reference are not hashed, but --deep reads every file: each is still opened,
    so one that cannot be read is reported (could not run, exit 2) instead of passed over."""
    out = []
    for rel in rels:
        try:
            os.close(os.open(os.path.join(ck.root, rel), os.O_RDONLY | os.O_NONBLOCK))
        except OSError as exc:
            out.append(error("unreadable", f"{rel} cannot be read: {exc.strerror}", file=rel,
                             fix="check permissions, or re-download the file"))
    return out


def refetch_fix(ck: Checkpoint, rel: str, ref: Reference) -> str:
    """How to get ``rel`` back as it was downloaded or recorded: the command for its kind of download."""
    if ref.source == MANIFEST_NAME:
        return (f"copy {rel} again from the copy {MANIFEST_NAME} was made from (or re-run the migrate that wrote it); "
                f"if the change was intended, {remanifest(ck)}")
    if ck.hf_snapshot:
        repo, revision = _snapshot_repo(ck)
        return (f"re-download it: `hf download {quote(repo)} {quote(rel)} --revision {quote(revision)} --force-download` "
                "(the cache's blob is not the file its name says)")
    return _local_dir_refetch(ck, rel)


def _local_dir_refetch(ck: Checkpoint, rel: str) -> str:
    """The re-download of one file of a ``hf download --local-dir`` folder. Its metadata records the commit
    and etag, not the repo id, so the command names the repo as ORG/NAME and says so."""
    return (f"re-download it: `hf download ORG/NAME {quote(rel)} --local-dir {quote_path(ck.name)} --force-download`, "
            "where ORG/NAME is the repo it was downloaded from (the folder's download metadata does not record it)")


def _hash_findings(ck: Checkpoint, refs: dict[str, Reference],
                   results: dict[tuple[str, str], HashResult]) -> list[Finding]:
    out = []
    for rel, ref in sorted(refs.items()):
        result = results[(ref.path, ref.algorithm)]
        digest, problem = result.digest, result.error
        if digest is None:
            # could not run: reading failed, which says nothing about the content (exit 2, not a verdict)
            out.append(error("unreadable", f"{rel} cannot be read while hashing: {problem}", file=rel,
                             fix=CHANGED_FIX if result.changed else UNREADABLE_FIX))
        elif digest != ref.digest:
            what = (f"not the bytes {MANIFEST_NAME} recorded (changed since: damaged, or edited or put back on purpose)"
                    if ref.source == MANIFEST_NAME else "not the bytes that were downloaded")
            out.append(error(
                "hash-mismatch",
                f"{rel}: {ref.algorithm} expected {ref.digest} ({ref.source}), actual {digest}: {what}, so an "
                "engine would serve them as they are now (wrong answers, or a failed start)",
                file=rel, fix=f"its content is not what was downloaded or recorded: {refetch_fix(ck, rel, ref)}"))
    return out


def scale_tensors(ck: Checkpoint) -> dict[str, list[str]]:
    """Every float ``*_scale`` tensor of the backbone and the tables file: file -> names."""
    out: dict[str, list[str]] = {}
    for rel in [*ck.backbone_files, L.TABLES]:
        header = ck.headers.get(rel)
        if header is None:
            continue
        names = [n for n, t in header.tensors.items() if n.endswith("_scale") and t.dtype in _FLOAT_DTYPES]
        if names:
            out[rel] = names
    return out


#: Bytes of one scale tensor decoded at a time: a hostile multi-GB "*_scale" costs bounded memory.
#: Small, too: decoding holds the GIL per chunk, and the hashing threads wait for it between their reads.
SCALE_CHUNK = 4 * 1024 * 1024
_E4M3_NOT_NEGATIVE = bytes(range(0x81))  # 0x00-0x80 (0x80 is -0); 0x81-0xFF are negative (0xFF is NaN)
_E4M3_GOOD = bytes(range(0x7F)) + b"\x80"  # finite and not negative


class _Tally:
    """Counts and first indexes of bad values in one scale tensor, accumulated chunk by chunk."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {"nonfinite": 0, "negative": 0, "nonpositive": 0, "over": 0}
        self.first: dict[str, list[int]] = {k: [] for k in self.counts}
        self.minimum: float | None = None

    def add(self, kind: str, count: int, indexes: Iterable[Any]) -> None:
        if count:
            self.counts[kind] += count
            if len(self.first[kind]) >= 5:
                return  # never scan for positions once five are known (a hostile all-NaN tensor stays cheap)
            for i in indexes:
                self.first[kind].append(int(i))
                if len(self.first[kind]) >= 5:
                    break


def _e4m3_chunk(t: _Tally, data: bytes, base: int) -> None:
    """FP8 E4M3 (fn) group scales judged on their bytes: 0x7F/0xFF are NaN, 0x81-0xFE negative.

    Byte counting runs at memory speed (no float copy of the ~0.4 GB of NVFP4 scales of a 9B
    model); its largest value (448) times the FP8 maximum cannot overflow BF16: no upper bound.
    """
    import numpy as np

    if not np.count_nonzero(np.frombuffer(data, np.uint8) >= 0x7F) or not data.translate(None, _E4M3_GOOD):
        return  # one vectorised pass (no GIL held); the exact counts below only for a suspicious chunk
    nan = data.count(b"\x7f") + data.count(b"\xff")
    negative = len(data.translate(None, _E4M3_NOT_NEGATIVE)) - data.count(b"\xff")
    if nan:
        t.add("nonfinite", nan, (base + i for i, b in enumerate(data) if b in (0x7F, 0xFF)))
    if negative:
        t.add("negative", negative, (base + i for i, b in enumerate(data) if 0x80 < b < 0xFF))


def _float_chunk(t: _Tally, a: "object", base: int, limit: float, is_global: bool) -> None:
    import numpy as np

    arr = np.asarray(a, dtype=np.float64)
    finite = np.isfinite(arr)
    bad = np.flatnonzero(~finite)
    t.add("nonfinite", int(bad.size), bad[:5] + base)
    arr = np.where(finite, arr, 0.0)
    neg = np.flatnonzero(arr < 0)
    t.add("negative", int(neg.size), neg[:5] + base)
    if is_global:  # among the finite values: a NaN is reported as such, never as "got 0.0"
        nonpos = np.flatnonzero(finite & (arr <= 0))
        t.add("nonpositive", int(nonpos.size), nonpos[:5] + base)
    over = np.flatnonzero(np.abs(arr) > limit)
    t.add("over", int(over.size), over[:5] + base)
    if finite.any():
        m = float(arr[finite].min())
        t.minimum = m if t.minimum is None else min(t.minimum, m)


def _decode(dtype: str, data: bytes) -> "object":
    """Little-endian float bytes -> numpy floats (BF16 and F8 widened bit-exactly)."""
    import numpy as np

    if dtype in ("F32", "F64", "F16"):
        return np.frombuffer(data, {"F32": "<f4", "F64": "<f8", "F16": "<f2"}[dtype])
    if dtype == "BF16":  # the upper half of an F32
        return (np.frombuffer(data, "<u2").astype(np.uint32) << 16).view(np.float32)
    if dtype == "F8_E5M2":  # the upper byte of an F16
        return (np.frombuffer(data, np.uint8).astype(np.uint16) << 8).view(np.float16)
    if dtype == "F8_E8M0":  # a bare exponent: 2**(e-127); 0xFF is NaN (it becomes inf here: still non-finite)
        return (np.frombuffer(data, np.uint8).astype(np.uint32) << 23).view(np.float32)
    raise ValueError(dtype)


def _tally_tensor(fh: "object", start: int, nbytes: int, dtype: str, limit: float, is_global: bool) -> _Tally:
    """Raises ``ChangedWhileRead`` when the file ends before the tensor does: it was cut (or rewritten)
    after its header was read, and the bytes read are not the tensor's."""
    t = _Tally()
    width = 1 if dtype.startswith("F8") else {"F16": 2, "BF16": 2, "F32": 4, "F64": 8}[dtype]
    step = SCALE_CHUNK - SCALE_CHUNK % width
    done = 0
    while done < nbytes:
        want = min(step, nbytes - done)
        data = os.pread(fh.fileno(), want, start + done)  # type: ignore[attr-defined]
        if len(data) < want:  # a regular file reads short only at its end
            raise ChangedWhileRead.cut("its scales were decoded")
        if dtype == "F8_E4M3":
            _e4m3_chunk(t, data, done)
        else:
            _float_chunk(t, _decode(dtype, data), done // width, limit, is_global)
        done += len(data)
    return t


def scale_findings(ck: Checkpoint) -> Iterator[Finding]:
    """Decode every scale; finite, non-negative, global scales positive, no overflow when dequantized.

    The bytes come straight from the offsets of the already validated header (the same offsets
    ``safe_open`` would map) and are decoded with numpy, chunk by chunk: importing torch would cost
    2-5 s of CPU that, on a 2-core machine, the hashing needs. The int8 tables' scales follow the
    one rule of ``spec.tables_format`` and are judged by the fast path (``check_tables``); here the
    tables add their value rules and recorded digests, and the tokenizer files must parse
    (``startup_findings``, which the serving gate runs too).
    """
    from clef_format.verify.checks.startup import startup_findings

    yield from startup_findings(ck)  # the tables' value rules and digests (their scales: check_tables), the tokenizer
    yield from backbone_scale_findings(ck)


def backbone_scale_findings(ck: Checkpoint) -> Iterator[Finding]:
    """Every backbone scale tensor decoded, streamed in ``SCALE_CHUNK`` pieces (bounded memory): what
    ``verify --deep`` and the serving gate refuse (``nonfinite-scale``, ``scale-range``)."""
    targets = {rel: names for rel, names in scale_tensors(ck).items() if rel != L.TABLES}
    fix_backbone = "re-download the backbone; if it was quantized locally, re-run the quantization"
    fix_tables = "re-create the tables with clef-format migrate from a layout-1 copy, or re-download them"
    for rel, names in targets.items():
        is_tables = rel == L.TABLES
        header = ck.headers[rel]
        source = header.metadata.get("source_dtype", "BF16") if is_tables else "BF16"
        qmax = TF.QMAX if is_tables else int(FP8_MAX)
        limit = DTYPE_MAX.get(source, DTYPE_MAX["BF16"]) / qmax
        fix = fix_tables if is_tables else fix_backbone
        try:
            fh = open(ck.path(rel), "rb")
        except OSError as exc:
            yield read_failure(rel, "to decode its scales", exc)
            continue
        with fh:
            for name in names:
                info_ = header.tensors[name]
                try:
                    t = _tally_tensor(fh, header.data_start + info_.begin, info_.nbytes, info_.dtype, limit,
                                      name.endswith("global_scale"))
                except OSError as exc:  # one finding for the file (one cause), never one per tensor after it
                    yield read_failure(rel, f"while its scales are decoded ({name})", exc)
                    break
                c, first = t.counts, t.first
                if c["nonfinite"] and not is_tables:
                    yield error("nonfinite-scale", f"{name}: {c['nonfinite']} scale(s) NaN or infinite "
                                f"(at {first['nonfinite']})", file=rel, tensor=name, fix=fix)
                if c["negative"] and not is_tables:
                    yield error("scale-range", f"{name}: {c['negative']} negative scale(s) (at {first['negative']})",
                                file=rel, tensor=name, fix=fix)
                elif c["nonpositive"] and not is_tables:
                    yield error("scale-range", f"{name}: a global scale must be positive (weights are divided by "
                                f"it), got {t.minimum!r} (at {first['nonpositive']})", file=rel, tensor=name, fix=fix)
                if c["over"]:
                    yield error("scale-range", f"{name}: {c['over']} scale(s) above {limit:.4g}: times {qmax} they "
                                f"overflow {source} (at {first['over']})", file=rel, tensor=name, fix=fix)


class DeepRun:
    """A deep verification in flight: hashing starts at once, so the structural checks run in its shadow."""

    def __init__(self, ck: Checkpoint, progress: Any = None) -> None:
        self.ck = ck
        self.refs, self.unchecked, self.findings = gather_references(ck)
        self.findings += _unreadable(ck, self.unchecked)
        tasks: dict[tuple[str, str], HashTask] = {}
        for ref in self.refs.values():
            key = (ref.path, ref.algorithm)
            if key not in tasks:
                try:
                    size = os.path.getsize(ref.path)
                except OSError:
                    size = 0
                tasks[key] = HashTask(f"{ref.algorithm}:{ref.path}", ref.path, ref.algorithm, size)
        self.total = sum(t.size for t in tasks.values())
        advance = (progress or NO_PROGRESS).add(f"hashing {len(tasks)} file(s)", self.total)
        self.pool = HashPool(tasks.values(), advance).start()
        self.scales = self.pool.after(lambda: list(scale_findings(ck)))

    def finish(self) -> list[Finding]:
        """Wait for the hashes and the scale check; findings sorted hash-first."""
        try:
            scale_out = self.scales.result()
        finally:
            done = {(r.key.split(":", 1)[1], r.algorithm): r for r in self.pool.results()}
        hash_problems = _hash_findings(self.ck, self.refs, done)
        # a file that could not be read in full (cut or rewritten meanwhile, or access) is one finding, the
        # first reader's: what the hashing or the decode concluded from its moving bytes is no verdict
        unread: dict[str, Finding] = {}
        for f in [*hash_problems, *scale_out]:
            if f.code == "unreadable" and f.file is not None:
                unread.setdefault(f.file, f)
        findings = list(self.findings)
        findings.extend(f for f in hash_problems if f.file not in unread or f is unread[f.file])
        findings.extend(_unchecked_findings(self.ck, self.unchecked, len(self.refs)))
        findings.extend(f for f in scale_out if f.file not in unread or f is unread[f.file])
        if self.refs and not hash_problems and not any(f.code in ("hash-mismatch", "missing-file") for f in findings):
            sources = sorted({r.source for r in self.refs.values()})
            findings.append(info("deep-verified", f"{len(self.refs)} file(s) hashed ({self.total / 1e9:.2f} GB), "
                                                  f"all match ({'; '.join(sources)})"))
        return findings


class ReferenceCheck:
    """Chosen files hashed against their references (``gather_references``) on a pool that starts at once;
    ``finish`` waits and gives the ``hash-mismatch`` / ``unreadable`` findings of the hashing.

    The one hashing path of ``reference_findings`` (migrate) and the serving gate (``vllm.content``).
    ``wanted``: which checkpoint-relative files to check; ``skip``: references already proven (the gate's
    files unchanged since they were hashed in this process), not hashed again. Work queued with ``after``
    runs on the first worker to run out of files, in the largest file's shadow.
    """

    def __init__(self, ck: Checkpoint, wanted: Callable[[str], bool], *,
                 skip: Callable[[Reference], bool] | None = None, progress: Any = None,
                 use_manifest: bool = True) -> None:
        self.ck = ck
        refs, unchecked, self.findings = gather_references(ck, use_manifest)
        self.refs = {rel: ref for rel, ref in refs.items() if wanted(rel)}
        self.unchecked = [rel for rel in unchecked if wanted(rel)]
        self.skipped = sorted(rel for rel, ref in self.refs.items() if skip is not None and skip(ref))
        self.hashed = {rel: ref for rel, ref in self.refs.items() if rel not in self.skipped}
        tasks = {(ref.path, ref.algorithm): HashTask(f"{ref.algorithm}:{ref.path}", ref.path, ref.algorithm,
                                                     ck.files.get(rel, 0)) for rel, ref in self.hashed.items()}
        self.total = sum(t.size for t in tasks.values())
        advance = None
        if tasks:
            advance = (progress or NO_PROGRESS).add(f"checking {len(tasks)} file(s) against their references",
                                                    self.total)
        self.pool = HashPool(tasks.values(), advance).start()
        self.matched: list[str] = []

    def after(self, fn: Callable[[], T]) -> "Future[T]":
        return self.pool.after(fn)

    def finish(self) -> list[Finding]:
        """Wait for every hash; the findings of the hashed files (``matched``: those that matched)."""
        done = {(r.key.split(":", 1)[1], r.algorithm): r for r in self.pool.results()}
        out = _hash_findings(self.ck, self.hashed, done)
        bad = {f.file for f in out}
        self.matched = [rel for rel in sorted(self.hashed) if rel not in bad]
        return out


def reference_findings(ck: Checkpoint, rels: Iterable[str], progress: Any = None) -> list[Finding]:
    """The deep check of ``rels`` alone against their references (those that have one): ``hash-mismatch``
    or ``unreadable`` findings, nothing for a file with no reference. Migrate runs it on the files it
    is about to replace, whose references it then drops: a mismatch found later would have no record
    left to be found against."""
    wanted = set(rels)
    run = ReferenceCheck(ck, wanted.__contains__, progress=progress)
    out = [f for f in run.findings if f.code == "hash-mismatch" and f.file in wanted]
    return out + run.finish()


def deep_findings(ck: Checkpoint) -> list[Finding]:
    """Hash (concurrently) and decode scales behind the smaller files; findings sorted hash-first."""
    return DeepRun(ck).finish()
