"""File hashing for ``verify --deep`` and ``manifest``: every file read once, many files at a time.

Three algorithms, each chosen by what a file can be checked against:

* ``sha256``   the etag of a Git LFS file in a Hugging Face cache (the blob name) or ``local_dir`` metadata;
* ``git-sha1`` the etag of a small (non-LFS) file: ``sha1(b"blob <len>\\0" + content)``, git's blob id;
* ``blake3``   clef-format's own manifest: a tree hash that BLAKE3 computes on every core at once
               (about 3x hashlib.sha256 on one core, more with cores), so a manifest check costs a
               fraction of a whole-file sha256 pass.

hashlib and blake3 release the GIL while hashing, so plain threads use every core. Files are
started largest first: with whole-file sha256 (which cannot be split) the total time is then the
time of the largest file, every other file being hashed in its shadow on the other cores.
"""

from __future__ import annotations

import errno
import hashlib
import os
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterable, NamedTuple, Protocol, TypeVar

from clef_format.spec.findings import Finding, error

ALGORITHMS = ("sha256", "git-sha1", "blake3")

#: Read size for the sha family: small enough that a chunk is hashed while still in the CPU caches
#: (hashlib.file_digest's own size; measured 3-6% faster than 32 MiB chunks here); GIL hand-offs stay cheap.
CHUNK = 256 * 1024

#: Read size for BLAKE3: large enough that blake3 splits each read across the cores, small enough to stay
#: in the caches (measured: 1-4 MiB within 10% of a memory map, 16-64 MiB 40% slower; benchmarks/RESULTS.md).
BLAKE3_CHUNK = 4 * 1024 * 1024

Progress = Callable[[int], None]
T = TypeVar("T")


class HashTask(NamedTuple):
    """One file to hash with one algorithm; ``key`` is what the caller matches the result on."""

    key: str
    path: str
    algorithm: str
    size: int


class HashResult(NamedTuple):
    key: str
    algorithm: str
    digest: str | None  # hex; None when the file could not be read
    error: str | None = None
    changed: bool = False  # the read failed because the file changed size meanwhile (it is being written)


class ChangedWhileRead(OSError):
    """The file changed size while it was read: someone writes it; reading it again later may succeed."""

    @classmethod
    def cut(cls, what: str) -> "ChangedWhileRead":
        """A read that came back short while ``what`` was read: a regular file reads short only at its end,
        so it was cut or rewritten after its header was read."""
        import errno

        return cls(errno.EIO, f"the file changed size while {what} (it ends before the tensors its header lists): "
                              "it is being written or truncated")


#: The fix of a file that changed size while it was read (hashed or decoded): nothing is wrong with access.
CHANGED_FIX = ("run it again once nothing else writes the checkpoint (a download or a copy still in progress "
               "changes a file's size)")
#: The fix of a file whose read failed otherwise (access, or an I/O error of the disk).
UNREADABLE_FIX = "check permissions, or re-download the file"


def read_failure(rel: str, what: str, exc: OSError) -> Finding:
    """``unreadable`` (could not run, exit 2: a read that failed says nothing about the content) for ``rel``,
    with the fix for its cause: the file changed size while read (``ChangedWhileRead``), or access."""
    return error("unreadable", f"{rel} cannot be read {what}: {exc.strerror or exc}", file=rel,
                 fix=CHANGED_FIX if isinstance(exc, ChangedWhileRead) else UNREADABLE_FIX)


class _Hasher(Protocol):
    def update(self, data: memoryview, /) -> object: ...

    def hexdigest(self) -> str: ...


def _stream(path: str, make: Callable[[int], _Hasher], chunk: int, progress: Progress | None) -> str:
    """Feed the whole file to a hasher made for its size through plain reads into one reused buffer, never a memory map.

    A mapped file that shrinks under the reader kills the process with SIGBUS (no exception, no
    finding); a read just returns less. So the size is taken once, and a file that ends early or
    grows while it is read raises ``OSError`` (a finding for the caller, never a signal)."""
    with open(path, "rb", buffering=0) as fh:
        size = os.fstat(fh.fileno()).st_size
        h = make(size)
        buf = bytearray(min(chunk, max(size, 1)))
        view = memoryview(buf)
        done = 0
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            h.update(view[:n])
            done += n
            if progress is not None:
                progress(n)
        if done != size or os.fstat(fh.fileno()).st_size != size:
            raise ChangedWhileRead(errno.EIO, f"the file changed size while it was hashed ({size} bytes when opened, "
                                     f"{done} read): it is being written or truncated", path)
    return h.hexdigest()


def _hash_chunked(path: str, algorithm: str, progress: Progress | None) -> str:
    """sha256 or git blob sha1, reading into one reused buffer (no per-chunk allocation)."""
    def make(size: int) -> _Hasher:
        if algorithm == "git-sha1":
            return hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False)
        return hashlib.sha256()

    return _stream(path, make, CHUNK, progress)


def _hash_blake3(path: str, progress: Progress | None) -> str:
    """BLAKE3 over large reads, multi-threaded inside blake3 (the GIL is released throughout)."""
    import blake3

    return _stream(path, lambda _size: blake3.blake3(max_threads=blake3.blake3.AUTO), BLAKE3_CHUNK, progress)


def hash_file(path: str, algorithm: str, progress: Progress | None = None) -> str:
    """The hex digest of one file under ``algorithm`` (one of ``ALGORITHMS``)."""
    if algorithm == "blake3":
        return _hash_blake3(path, progress)
    if algorithm in ("sha256", "git-sha1"):
        return _hash_chunked(path, algorithm, progress)
    raise ValueError(f"unknown hash algorithm {algorithm!r}")


def git_blob_sha1(data: bytes) -> str:
    """git's blob id of ``data`` (the etag the Hub gives a non-LFS file)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _run(task: HashTask, progress: Progress | None) -> HashResult:
    try:
        return HashResult(task.key, task.algorithm, hash_file(task.path, task.algorithm, progress))
    except OSError as exc:
        return HashResult(task.key, task.algorithm, None, exc.strerror or str(exc), isinstance(exc, ChangedWhileRead))


class HashPool:
    """Hash many files concurrently, largest first; ``results()`` waits for them all.

    Started before other deep work (scale decoding) so that work runs in the shadow of the hashing.
    While running it lowers the interpreter's switch interval: a hashing thread that finishes a
    chunk then waits at most 0.5 ms for the GIL instead of 5 ms when another thread runs Python.
    """

    def __init__(self, tasks: Iterable[HashTask], progress: Progress | None = None,
                 workers: int | None = None) -> None:
        self.tasks = sorted(tasks, key=lambda t: -t.size)
        self._workers = max(1, min(workers or os.cpu_count() or 1, len(self.tasks) or 1))
        self._pool: ThreadPoolExecutor | None = None
        self._futures: list[Future[HashResult]] = []
        self._progress = progress
        self._switch = sys.getswitchinterval()

    def start(self) -> "HashPool":
        if self.tasks:
            sys.setswitchinterval(min(self._switch, 0.0005))
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="clef-hash")
            self._futures = [self._pool.submit(_run, t, self._progress) for t in self.tasks]
        return self

    def after(self, fn: Callable[[], T]) -> "Future[T]":
        """Queue ``fn`` behind every file: it runs on the first worker to run out of files, in the largest
        file's shadow, instead of on a third thread that would take CPU from the largest file's hash."""
        if self._pool is None:
            done: Future[T] = Future()
            try:
                done.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
                done.set_exception(exc)
            return done
        return self._pool.submit(fn)

    def results(self) -> list[HashResult]:
        try:
            return [f.result() for f in self._futures]
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
            sys.setswitchinterval(self._switch)


def hash_many(tasks: Iterable[HashTask], progress: Progress | None = None,
              workers: int | None = None) -> list[HashResult]:
    """Hash every task concurrently and return the results (in largest-first order)."""
    return HashPool(tasks, progress, workers).start().results()
