"""Pure building blocks the steps of ``migrations/`` compose plans from (no I/O)."""

from __future__ import annotations

from typing import Iterable

from clef_format.errors import StepRefused
from clef_format.migrate.plan import FileBytes, IndexFile, JsonFile, Plan, Safetensors, TensorOut, aligned_insert_index
from clef_format.read.checkpoint import Checkpoint
from clef_format.read.safetensors import TensorInfo
from clef_format.spec import layouts as L


def source_tensors(ck: Checkpoint, rel: str) -> list[TensorOut]:
    """Every tensor of a source file in data order, as verbatim byte ranges."""
    header = ck.headers[rel]
    ordered = sorted(header.tensors.items(), key=lambda kv: kv[1].begin)
    return [TensorOut(name, info.dtype, info.shape, FileBytes(rel, header.data_start + info.begin, info.nbytes))
            for name, info in ordered]


def table_info(ck: Checkpoint, name: str) -> tuple[str, TensorInfo, int]:
    """(file, header entry, absolute data offset) of a table stored in the backbone."""
    rel = ck.tensor_file[name]
    info = ck.backbone[name]
    return rel, info, ck.headers[rel].data_start + info.begin


def rewrite_backbone(plan: Plan, ck: Checkpoint, drop: Iterable[str] = (), add: Iterable[TensorOut] = (),
                     add_to: str | None = None) -> None:
    """Plan new backbone files without ``drop`` and with ``add`` (into ``add_to``); keep the index consistent."""
    drop = set(drop)
    added = list(add)
    touched = {ck.tensor_file[n] for n in drop if n in ck.tensor_file}
    if added:
        touched.add(add_to or ck.backbone_files[0])
    for rel in sorted(touched):
        if rel not in ck.headers:
            raise StepRefused(f"{rel} has no readable header")
        tensors = [t for t in source_tensors(ck, rel) if t.name not in drop]
        if added and rel == (add_to or ck.backbone_files[0]):
            at = aligned_insert_index(tensors)
            tensors[at:at] = added
        plan.outputs.append(Safetensors(rel, tuple(tensors), dict(ck.headers[rel].metadata), mode_from=rel))
        plan.reads[rel] = plan.reads.get(rel, 0) + sum(t.nbytes for t in tensors if isinstance(t.source, FileBytes))
    if L.BACKBONE_INDEX in ck.files:
        dropped_bytes = sum(ck.backbone[n].nbytes for n in drop if n in ck.backbone)
        added_bytes = sum(t.nbytes for t in added)
        target = add_to or ck.backbone_files[0]
        plan.outputs.append(IndexFile(L.BACKBONE_INDEX, tuple(sorted(drop)), tuple((t.name, target) for t in added),
                                      added_bytes - dropped_bytes, ck.files[L.BACKBONE_INDEX] + 200 * len(added)))
        plan.reads[L.BACKBONE_INDEX] = ck.files[L.BACKBONE_INDEX]


def write_head_config(plan: Plan, head_config: dict) -> None:
    plan.outputs.append(JsonFile(L.HEAD_CONFIG, head_config, mode_from=L.HEAD_CONFIG))


def carry_rest(plan: Plan, ck: Checkpoint) -> None:
    """Every other file of the checkpoint goes over unchanged (linked where possible)."""
    written = {o.rel for o in plan.outputs}
    for rel, size in ck.files.items():
        if rel not in written and rel not in plan.removed:
            plan.carried[rel] = size
