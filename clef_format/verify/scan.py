"""scan: every Clef copy found, each verified as ``clef-format verify`` verifies it, one row per copy.

Pure reading: discovery is ``read.copies``, judging is ``verify.run.verify_checkpoint`` on each copy
(the same checks, the same findings, ``--deep`` included), and a row adds only what a table of copies
needs: where the copy is, its verdict, which plugin versions can serve it, its size and its first fix.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from clef_format.progress import Progress
    from clef_format.read.installed_plugin import InstalledPlugin

from clef_format.read.copies import Copy, Walk, files_on_disk
from clef_format.records import Record
from clef_format.report import Report, make_report
from clef_format.spec.findings import error

#: Verdicts, in the order a table shows them (worst first).
VERDICTS = ("BROKEN", "unreadable", "warnings", "OK")


class Row(Record):
    """One copy and its verify report."""

    copy: Copy
    report: Report
    verdict: str
    serves_with: str
    files: dict[tuple[int, int], int]  # what it holds on disk: (st_dev, st_ino) -> bytes
    fix: str | None

    @property
    def size(self) -> int:
        return sum(self.files.values())

    @property
    def to_migrate(self) -> bool:
        return bool(self.fix) and "clef-format migrate" in (self.fix or "")

    @property
    def to_redownload(self) -> bool:
        return self.verdict == "BROKEN" and not self.to_migrate and "download" in (self.fix or "")

    def to_dict(self) -> dict[str, Any]:
        c = self.copy
        return {**self.report.to_dict(), "where": c.display, "repo_id": c.repo_id, "revision": c.revision,
                "refs": list(c.refs), "verdict": self.verdict, "serves_with": self.serves_with,
                "size_on_disk": self.size, "fix": self.fix}


class Totals(Record):
    """The copies counted by verdict and by what fixes them; ``bytes`` on disk, a shared blob once."""

    copies: int
    broken: int
    unreadable: int
    warnings: int
    ok: int
    to_migrate: int
    to_redownload: int
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return self._asdict()

    @classmethod
    def of(cls, rows: list[Row]) -> Totals:
        return cls(len(rows), sum(r.verdict == "BROKEN" for r in rows), sum(r.verdict == "unreadable" for r in rows),
                   sum(r.verdict == "warnings" for r in rows), sum(r.verdict == "OK" for r in rows),
                   sum(r.to_migrate for r in rows), sum(r.to_redownload for r in rows), unique_bytes(rows))


class ScanDetails(Record):
    """scan's own keys: the roots searched, one row per copy (worst first), the totals, and with
    ``--fixable --json`` the command (or advice) per BROKEN copy."""

    roots: list[str]
    rows: tuple[Row, ...]
    totals: Totals
    commands: list[dict[str, str]] | None = None

    @property
    def capped_after(self) -> str | None:
        return "totals"

    def to_dict(self) -> dict[str, Any]:
        out = {"roots": list(self.roots), "rows": [r.to_dict() for r in self.rows], "totals": self.totals.to_dict()}
        if self.commands is not None:
            out["commands"] = list(self.commands)
        return out


def unique_bytes(rows: list[Row]) -> int:
    """Bytes on disk of all the copies together: a blob shared by revisions counted once."""
    seen: dict[tuple[int, int], int] = {}
    for row in rows:
        seen.update(row.files)
    return sum(seen.values())


def verdict_of(report: Report) -> str:
    if report.could_not_run:
        return "unreadable"
    if not report.ok:
        return "BROKEN"
    return "warnings" if any(f.severity == "warning" for f in report.findings) else "OK"


def first_fix(report: Report) -> str | None:
    """The fix of the first error, else of the first warning (the one thing to do first)."""
    for severity in ("error", "warning"):
        for f in report.findings:
            if f.severity == severity and f.fix:
                return f.fix
    return None


def _unreadable_report(copy: Copy) -> Report:
    finding = error("unreadable", f"{copy.path}: cannot be listed ({copy.unreadable})",
                    fix="make the folder readable (permissions), then scan again")
    return make_report("verify", copy.display, None, [finding])


def judge(copy: Copy, deep: bool = False, installed: InstalledPlugin | None = None) -> Row:
    """verify's report of one copy, as a row; a copy that cannot be read is a row saying so, never an exception.

    The same call as ``clef-format verify``: every check, the plugin shipped in ``vllm_plugin/`` and the
    clef-vllm installed (``installed``, looked up once by the caller)."""
    from clef_format.errors import CouldNotRun
    from clef_format.read.checkpoint import read_checkpoint
    from clef_format.spec.compat import servable_by
    from clef_format.verify.options import VerifyOptions
    from clef_format.verify.run import verify_checkpoint

    serves = "none"
    if copy.unreadable is not None:
        report = _unreadable_report(copy)
    else:
        try:
            ck = read_checkpoint(copy.path, copy.display)  # its fixes name it as verify of WHERE does
            report = verify_checkpoint(ck, copy.display, VerifyOptions(deep=deep), bundled=True, installed=installed)
            serves = servable_by(ck.layout, ck.head_config)
        except CouldNotRun as exc:
            report = make_report("verify", copy.display, None, [error(exc.code, str(exc), fix=exc.fix)])
        except OSError as exc:
            report = _unreadable_report(copy._replace(unreadable=exc.strerror or str(exc)))
    files = files_on_disk(copy.path) if copy.unreadable is None else {}
    return Row(copy, report, verdict_of(report), serves, files, first_fix(report))


def scan(walk: Walk, deep: bool = False, progress: Progress | None = None, workers: int | None = None,
         installed: InstalledPlugin | None = None) -> list[Row]:
    """Verify every copy of ``walk``; rows sorted worst verdict first, then by where.

    Copies are judged in parallel processes, one per core (verify is CPU-bound Python; measured in
    benchmarks/RESULTS.md, "scan"), forked after the verify modules are imported; one core or a
    handful of copies: in this process.
    """
    import os

    from clef_format.progress import NO_PROGRESS

    advance = (progress or NO_PROGRESS).add("verifying copies", len(walk.copies), unit=" copies")
    cores = len(os.sched_getaffinity(0))
    workers = min(workers or cores, 4 * cores, len(walk.copies))  # never more processes than copies
    rows: list[Row] = []
    if workers < 2 or len(walk.copies) < 4:
        for copy in walk.copies:
            rows.append(judge(copy, deep, installed))
            advance(1)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        import clef_format.read.checkpoint  # noqa: F401  imported once, before the fork
        import clef_format.verify.run  # noqa: F401

        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
        try:
            for future in as_completed([pool.submit(judge, copy, deep, installed) for copy in walk.copies]):
                rows.append(future.result())  # records all the way down: the row comes back as it was made
                advance(1)
        except BaseException:  # Ctrl-C: the workers stop now, not after the copies they are hashing
            for child in multiprocessing.active_children():
                child.terminate()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
    rows.sort(key=lambda r: (VERDICTS.index(r.verdict), r.copy.display))
    return rows
