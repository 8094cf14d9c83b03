"""clef-format manifest PATH [--json] [--force]: write clef_manifest.json (BLAKE3 per file) for fast --deep.

Refuses (exit 1) inside a Hugging Face cache snapshot, which is never written (its blob names already
serve as a manifest), and when reading the checkpoint found errors (a truncated, unsafe or escaping
file): a manifest must not bless a broken download. ``--force`` writes one anyway.
"""

from __future__ import annotations

import argparse
import json

from clef_format.cli.main import EXIT_FINDINGS, EXIT_OK, CouldNotRun


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="checkpoint directory (not a Hugging Face cache snapshot)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--force", action="store_true", help="write even if reading the checkpoint found errors")


def _refuse(args: argparse.Namespace, message: str, findings: list[dict[str, object]] | None = None) -> int:
    if args.json:
        print(json.dumps({"path": args.path, "ok": False, "written": None, "error": message,
                          "findings": findings or []}, indent=2))
    else:
        import sys

        print(f"clef-format manifest: {message}", file=sys.stderr)
        for f in findings or []:
            print(f"  {f['code']}: {f['message']}", file=sys.stderr)
    return EXIT_FINDINGS


def run(args: argparse.Namespace) -> int:
    from clef_format.read.checkpoint import read_checkpoint
    from clef_format.read.hashing import HashTask, hash_many, progress_bar
    from clef_format.read.hf_cache import PathNotFound, locate_checkpoint
    from clef_format.read.manifest import ALGORITHM, build_manifest, manifest_files, write_manifest

    try:
        root = locate_checkpoint(args.path)
    except PathNotFound as exc:
        raise CouldNotRun(str(exc)) from None
    ck = read_checkpoint(root)
    if ck.hf_snapshot:
        return _refuse(args, f"{root} is a Hugging Face cache snapshot, which clef-format never writes to; "
                             "`clef-format verify --deep` already checks it against the cache's blob names")
    errors = [f.to_dict() for f in ck.findings if f.severity == "error"]
    if errors and not args.force:
        return _refuse(args, "reading the checkpoint found errors; a manifest would record a broken download "
                             "(fix them, or pass --force)", errors)
    files = manifest_files(ck)
    tasks = [HashTask(rel, ck.path(rel), ALGORITHM, size) for rel, size in files.items()]
    with progress_bar(sum(files.values()), f"hashing {len(tasks)} file(s)") as advance:
        results = hash_many(tasks, advance)
    unreadable = [f"{r.key}: {r.error}" for r in results if r.digest is None]
    if unreadable:
        raise CouldNotRun("cannot read " + "; ".join(unreadable))
    digests = {r.key: r.digest for r in results if r.digest is not None}
    try:
        target = write_manifest(root, build_manifest(digests, files))
    except OSError as exc:
        raise CouldNotRun(f"cannot write the manifest in {root}: {exc.strerror or exc}") from None
    if args.json:
        print(json.dumps({"path": args.path, "ok": True, "written": target, "algorithm": ALGORITHM,
                          "files": len(digests), "bytes": sum(files.values())}, indent=2))
    else:
        print(f"wrote {target}: {len(digests)} file(s), {sum(files.values()) / 1e9:.2f} GB, {ALGORITHM}")
    return EXIT_OK
