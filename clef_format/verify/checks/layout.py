"""Layout-level checks: required files, the version marker, where the tables are."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from clef_format.verify.vllm_build import VllmBuild
    from typing import Iterator

from clef_format.read.checkpoint import Checkpoint
from clef_format.verify.options import DEFAULTS, VerifyOptions
from clef_format.spec import layouts as L
from clef_format.spec.findings import Finding, error, warning
from clef_format.spec.layouts import Layout, migrate_command
from clef_format.spec.marker import MarkerError, parse_marker


def check_layout(ck: Checkpoint, opts: VerifyOptions = DEFAULTS, vllm: VllmBuild | None = None) -> Iterator[Finding]:
    path = ck.name  # what printed commands call it (the PATH given)
    layout = ck.layout
    if not ck.backbone_files and not ck.reported(L.BACKBONE_SINGLE) and not any(
            f.code in ("missing-file", "bad-header") or f.file == L.BACKBONE_INDEX
            for f in ck.findings):  # a reader finding already says why
        what = (f"{L.BACKBONE_INDEX} maps no tensor to a shard" if ck.has(L.BACKBONE_INDEX)
                else f"neither {L.BACKBONE_SINGLE} nor {L.BACKBONE_INDEX}")
        yield error("missing-file", f"no backbone: {what}",
                    file=L.BACKBONE_SINGLE, fix="download the checkpoint again; the backbone weights are missing")
    if layout is Layout.UNKNOWN:
        if ck.backbone_files:
            yield error("unknown-layout", "the files match no Clef layout (no joint head, or tables nowhere)",
                        fix=f"compare with the layouts in `clef-format verify --help`; re-download {path}")
    # a file the reader already reported as missing (a broken symlink, a cache blob deleted) is one finding;
    # one there but never read (ck.reported: path-escape, special-file) is not missing at all
    reported = {f.file for f in ck.findings if f.code == "missing-file"}
    for rel in L.required_files(layout):
        if not ck.has(rel) and rel not in ck.bad_headers and rel not in reported and not ck.reported(rel):
            yield error("missing-file", f"{rel} is missing ({layout} requires it)", file=rel,
                        fix="download this file from the same revision of the checkpoint")
    indexed = ck.has(L.BACKBONE_INDEX)  # with an index, vLLM loads only the shards it names
    for rel in sorted(ck.files):  # without one, it loads every file its *.safetensors glob finds
        if (L.vllm_globs(rel) and not indexed and ck.backbone_files
                and rel not in ck.backbone_files and rel not in L.required_files(layout)):
            yield error("stray-weights", f"{rel} is not part of the backbone ({', '.join(ck.backbone_files)}), but "
                        "vLLM loads every top-level, non-hidden .safetensors file beside it: its tensors would be "
                        "loaded too",
                        file=rel, fix=f"remove or move {rel} out of the checkpoint folder")
    for rel in L.TOKENIZER_FILES:  # by name and size only: a multi-MB tokenizer is never parsed here
        if (layout is not Layout.UNKNOWN and rel not in reported and not ck.reported(rel)
                and (not ck.has(rel) or ck.files[rel] == 0)):
            state = "missing" if not ck.has(rel) else "empty (0 bytes)"
            yield warning("missing-file", f"{rel} is {state}: serving needs the tokenizer", file=rel,
                          fix="download the tokenizer files from the same revision")

    embed, lm_head = ck.tables
    in_backbone = [t for t in (embed, lm_head) if t in ck.backbone]
    has_tables_file = ck.has(L.TABLES) or L.TABLES in ck.bad_headers
    if layout is Layout.LAYOUT_1:
        yield warning("legacy-layout",
                      "layout-1: BF16 tables inside the backbone; only clef-vllm < 0.2.0 serves it (the int8 layout-2 "
                      "tables take half the bytes on disk and in GPU memory)",
                      fix=f"{migrate_command(path, Layout.LAYOUT_2, ck.hf_snapshot)}; the result is served only by "
                          "clef-vllm>=0.2.0 (a clef-vllm 0.1.x serves this layout-1 as it is: migrate when you "
                          "upgrade the plugin)")

    if layout in (Layout.LAYOUT_1, Layout.ORIGINAL_RELEASE):
        for t in (embed, lm_head):
            if t not in ck.backbone:
                yield error("tables-missing", f"{t} is missing from the backbone ({layout} holds both tables there)",
                            tensor=t, fix="re-download the backbone")
    if layout is Layout.LAYOUT_2_UNMARKED:
        yield error("marker-missing",
                    f"int8 tables present but {L.HEAD_CONFIG} has no {L.MARKER_KEY} marker: an old plugin would "
                    "start and serve wrong answers (the 2026-10-07 downloads)",
                    file=L.HEAD_CONFIG, fix=migrate_command(path, Layout.LAYOUT_2, ck.hf_snapshot))
    if layout in (Layout.LAYOUT_2, Layout.LAYOUT_2_UNMARKED):
        if in_backbone and has_tables_file:
            for t in in_backbone:
                yield error("tables-duplicated", f"{t} is both in the backbone and in {L.TABLES}", tensor=t,
                            file=ck.tensor_file[t],
                            fix=f"re-download the backbone files of this revision: in {layout} they do not hold the "
                                f"tables ({L.TABLES} does); no migration removes a duplicate")
        elif not has_tables_file:
            yield error("tables-missing", f"{L.TABLES} is missing" + (
                f" (and the backbone still holds {', '.join(in_backbone)})" if in_backbone else ""),
                file=L.TABLES, fix="download clef_head/tables_int8.safetensors from the same revision")
    if isinstance(ck.head_config, dict) and L.MARKER_KEY in ck.head_config:
        problem = marker_problem_of(ck.head_config[L.MARKER_KEY])
        if problem is not None:
            from clef_format.spec.compat import marker_fix

            yield error("marker-invalid", problem, file=L.HEAD_CONFIG, fix=marker_fix(path, ck.hf_snapshot))


def marker_problem_of(value: object) -> str | None:
    """Why a marker value is invalid (not a specifier, admits a version below 0.2.0, or none), or ``None``.
    The marker this project writes is known valid without importing packaging."""
    if value == L.MARKER_VALUE:
        return None
    from clef_format.spec.compat import marker_problem

    try:
        return marker_problem(parse_marker(value))
    except MarkerError as exc:
        return str(exc)
