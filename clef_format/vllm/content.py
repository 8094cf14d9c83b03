"""The serving gate's content check: every file the engine or the plugin reads at start-up, hashed
against the strongest reference its download has, before any weight is loaded.

The references are ``verify --deep``'s (``verify.deep.gather_references``: ``clef_manifest.json``
BLAKE3, the Hugging Face cache blob names = sha256 / git blob sha1, ``local_dir`` download metadata
etags), hashed on ``verify.deep.ReferenceCheck``'s thread pool (every core: hashlib and blake3
release the GIL; sha256 and git-sha1 read 256 KiB at a time, BLAKE3 maps the file: bounded memory).
Which files: ``spec.layouts.read_at_start``, plus the manifest when it is a reference itself.

A mismatch refuses the start (``hash-mismatch``); a file with no reference is logged as unchecked
(a warning), never refused. On by default; off with ``check_references=False`` or, without code,
the environment variable ``CLEF_FORMAT_GATE_HASH=0`` (the keyword wins when given).

A plugin calls the gate more than once per start (the model's constructor, then ``load_weights``,
``head_config``, ``check_plugin_head``): a file whose digest matched is remembered for the life of
the process by its identity and change times (device, inode, size, mtime and ctime in ns, taken
before it was read and unchanged after), so later calls hash only what changed since; the gate's
streamed checks (``proven`` / ``remember``) are remembered the same way, over every file.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Callable, TypeVar

from clef_format.errors import UsageError
from clef_format.read.manifest import MANIFEST_NAME
from clef_format.spec.layouts import read_at_start

if TYPE_CHECKING:
    from concurrent.futures import Future

    from clef_format.read.checkpoint import Checkpoint
    from clef_format.spec.findings import Finding
    from clef_format.verify.deep import Reference, ReferenceCheck

#: The environment variable that turns the gate's hashing off (``0``, ``false``, ``no``, ``off``) for
#: deployments that check the files elsewhere; unset, empty or ``1``/``true``/``yes``/``on``: on.
ENV = "CLEF_FORMAT_GATE_HASH"
_OFF = frozenset({"0", "false", "no", "off"})
_ON = frozenset({"", "1", "true", "yes", "on"})

log = logging.getLogger("clef_format.gate")
T = TypeVar("T")

_lock = threading.Lock()
_verified: set[tuple[object, ...]] = set()  # stat keys of files (and checkpoints) proven in this process
_logged: set[tuple[str, tuple[str, ...]]] = set()  # (root, unchecked files) already warned about


#: Unchecked files named in the gate's log line (the rest counted), as findings are capped.
LOGGED_NAMES = 20


def hashing_wanted(check_references: bool | None) -> bool:
    """The keyword when given, else ``CLEF_FORMAT_GATE_HASH`` (default on); a value it does not know is a
    ``UsageError``: an opt-out that silently did nothing would be worse than none."""
    if check_references is not None:
        if not isinstance(check_references, bool):
            raise UsageError(f"check_references={check_references!r} is not a bool",
                             fix="pass check_references=True or False, or leave it out (the environment decides)")
        return check_references
    value = os.environ.get(ENV, "").strip().lower()
    if value in _OFF:
        return False
    if value in _ON:
        return True
    raise UsageError(f"{ENV}={os.environ[ENV]!r} is neither on nor off",
                     fix=f"set {ENV}=0 to skip the gate's hashing (deployments that check the files elsewhere), "
                         f"or unset it / {ENV}=1 to keep it")


def file_key(path: str) -> tuple[object, ...] | None:
    """What changes when a file's bytes may have: identity and change times (None: cannot be stat'ed)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _stat_key(ref: "Reference") -> tuple[object, ...] | None:
    key = file_key(ref.path)
    return None if key is None else (ref.algorithm, ref.digest, *key)


def checkpoint_key(ck: "Checkpoint", what: str) -> tuple[object, ...] | None:
    """``what`` was proven on these files as they are now: every file of the checkpoint by ``file_key``."""
    keys = []
    for rel in sorted(ck.files):
        key = file_key(ck.path(rel))
        if key is None:
            return None
        keys.append((rel, key))
    return (what, str(ck.root), tuple(keys))


def proven(key: tuple[object, ...] | None) -> bool:
    """Whether ``key`` (a ``checkpoint_key``) was remembered in this process."""
    with _lock:
        return key is not None and key in _verified


def remember(key: tuple[object, ...] | None, ck: "Checkpoint", what: str) -> None:
    """Remember ``key`` as proven, when the files are still as they were when it was taken."""
    if key is not None and checkpoint_key(ck, what) == key:
        with _lock:
            _verified.add(key)




def forget_verified() -> None:
    """Forget every file proven in this process: the next gate hashes everything again (benchmarks, tests)."""
    with _lock:
        _verified.clear()
        _logged.clear()


def checked_here(rel: str) -> bool:
    """The files the gate hashes: what the engine or the plugin reads, and the manifest when it is one of
    the references (a shipped manifest is checked against its own blob name before it is believed)."""
    return rel == MANIFEST_NAME or read_at_start(rel)


class ContentCheck:
    """One gate's hashing, started at once; ``after`` queues the gate's other streamed checks behind it."""

    def __init__(self, ck: "Checkpoint") -> None:
        from clef_format.verify.deep import ReferenceCheck

        self.ck = ck
        self._before: dict[str, tuple[object, ...] | None] = {}  # each file's stat key before it is hashed
        self.run: ReferenceCheck = ReferenceCheck(ck, checked_here, skip=self._proven)

    def _proven(self, ref: "Reference") -> bool:
        key = self._before[ref.path] = _stat_key(ref)
        with _lock:
            return key is not None and key in _verified

    def after(self, fn: Callable[[], T]) -> "Future[T]":
        return self.run.after(fn)

    def finish(self) -> list["Finding"]:
        """Wait for the hashes; the errors that refuse the start. Logs what could not be checked."""
        run = self.run
        errors = run.finish()
        for f in run.findings:  # from reading the references: a size the manifest contradicts, a listed file absent
            if f.code in ("hash-mismatch", "missing-file") and f.file is not None and checked_here(f.file):
                errors.append(f)
        with _lock:  # remembered only when unchanged while it was hashed (a write during the read: hashed again)
            for rel in run.matched:
                ref = run.hashed[rel]
                key = self._before.get(ref.path)
                if key is not None and _stat_key(ref) == key:
                    _verified.add(key)
        self._log(errors)
        return errors

    def _log(self, errors: list["Finding"]) -> None:
        run, root = self.run, str(self.ck.root)
        unusable = [f for f in run.findings if f.code not in ("hash-mismatch", "missing-file")]
        unchecked = tuple(run.unchecked)
        with _lock:
            first = (root, unchecked) not in _logged
            _logged.add((root, unchecked))
        if unchecked and first:
            from clef_format.verify.deep import unchecked_fix

            shown = ", ".join(unchecked[:LOGGED_NAMES])
            if len(unchecked) > LOGGED_NAMES:
                shown += f" and {len(unchecked) - LOGGED_NAMES} more (clef-format verify --deep lists them all)"
            log.warning("clef-format gate: %d file(s) of %s have no download reference and were not checked: %s "
                        "(no Hugging Face cache blob name, no usable local_dir download metadata, no %s entry); "
                        "fix: %s", len(unchecked), root, shown, MANIFEST_NAME, unchecked_fix(self.ck))
        for f in unusable:
            if first:
                log.warning("clef-format gate: a reference could not be used (%s): %s", f.code, f.message)
        if run.hashed and not errors:
            sources = sorted({r.source for r in run.hashed.values()})
            log.info("clef-format gate: %d file(s) of %s (%.2f GB) match their references (%s)%s", len(run.hashed),
                     root, run.total / 1e9, "; ".join(sources),
                     f", {len(run.skipped)} unchanged since checked" if run.skipped else "")


def content_check(ck: "Checkpoint", hashing: bool, check_references: bool | None) -> ContentCheck | None:
    """The gate's hashing started on ``ck``, or None when it is turned off (logged, with what turned it off)."""
    if not hashing:
        log.info("clef-format gate: content hashing off (%s): %s not checked against its references",
                 "check_references=False" if check_references is False else f"{ENV}={os.environ.get(ENV)}", ck.root)
        return None
    return ContentCheck(ck)
