"""layout-1 -> layout-2: the BF16 tables leave the backbone for int8 ``clef_head/tables_int8.safetensors``.

upgrade: quantize ``embed_tokens`` and ``lm_head`` row block by row block (format: clef_format.spec.tables_format),
rewrite each backbone file that held them without them (every other tensor copied byte for byte,
header metadata kept, index kept consistent), add the ``requires_clef_vllm`` marker.
downgrade: decode the int8 tables back into the backbone and drop the marker, for clef-vllm 0.1.x.
The decoded tables are NOT the original BF16: they carry the int8 error (about 1% relative).
"""

from __future__ import annotations

import json

from clef_format.errors import StepRefused
from clef_format.migrate.build import carry_rest, rewrite_backbone, table_info, write_head_config
from clef_format.migrate.plan import Decoded, Plan, QuantScales, QuantValues, Safetensors, TensorOut
from clef_format.read.checkpoint import Checkpoint
from clef_format.spec import layouts as L
from clef_format.spec import tables_format as TF
from clef_format.spec.marker import with_marker, without_marker

revision = "0001_int8_tables"
down_revision = None
from_layout = L.Layout.LAYOUT_1.value
to_layout = L.Layout.LAYOUT_2.value
description = "int8 tables in clef_head/tables_int8.safetensors + requires_clef_vllm marker (2026-10-07)"

SOURCE_DTYPES = TF.SOURCE_DTYPES
#: The tables are checked in full against the format's rule before either direction runs: a NaN in a
#: BF16 table (upgrade) or an int8 -128 (downgrade) refuses, as ``verify --deep`` reports it.
DEEP_CHECK = True
#: Directions whose writer applies that rule itself to every row it reads (the upgrade's quantizer
#: raises ``NonFiniteRows`` before the swap, and the run is rolled back): a real run skips the
#: separate scan, which would read both tables a second time; a dry run still scans.
STREAM_CHECKED = frozenset({"upgrade"})


def _head_config(ck: Checkpoint) -> dict:
    if not isinstance(ck.head_config, dict):
        raise StepRefused(f"{L.HEAD_CONFIG} is missing or not a JSON object")
    return ck.head_config


def upgrade(ck: Checkpoint) -> Plan:
    plan = Plan(revision, "upgrade", from_layout, to_layout, ck.root, fixes=frozenset({"legacy-layout"}))
    values: list[TensorOut] = []
    scales: list[TensorOut] = []
    dtypes = set()
    for name in ck.tables:
        if name not in ck.backbone:
            raise StepRefused(f"{name} is not in the backbone: nothing to quantize")
        rel, info, offset = table_info(ck, name)
        if info.dtype not in SOURCE_DTYPES or len(info.shape) != 2:
            raise StepRefused(f"{name} is {info.dtype}{list(info.shape)}; expected a 2-D BF16/F16/F32 table")
        rows, hidden = info.shape
        dtypes.add(info.dtype)
        values.append(TensorOut(name, TF.VALUE_DTYPE, (rows, hidden), QuantValues(name, rel, offset, info.dtype, rows, hidden)))
        scales.append(TensorOut(TF.scale_name(name), TF.SCALE_DTYPE, (rows, 1), QuantScales(name, rows)))
        plan.reads[rel] = plan.reads.get(rel, 0) + info.nbytes
    if len(dtypes) != 1:
        raise StepRefused(f"the two tables have different dtypes {sorted(dtypes)}")
    (dtype,) = dtypes
    metadata = TF.metadata_for(dtype, {})
    plan.outputs.append(Safetensors(L.TABLES, tuple(values + scales), metadata, quality_metadata=True))
    rewrite_backbone(plan, ck, drop=ck.tables)
    write_head_config(plan, with_marker(_head_config(ck)))
    carry_rest(plan, ck)
    plan.notes.append(f"quantizes {', '.join(ck.tables)} ({dtype}) to int8 with one scale per row; "
                      "the BF16 originals are removed from the backbone")
    return plan


def downgrade(ck: Checkpoint) -> Plan:
    plan = Plan(revision, "downgrade", to_layout, from_layout, ck.root)
    header = ck.headers.get(L.TABLES)
    if header is None:
        raise StepRefused(f"{L.TABLES} is missing or unreadable: nothing to decode")
    dtype = header.metadata.get("source_dtype", "BF16")
    if dtype not in SOURCE_DTYPES:
        dtype = "BF16"
    added = []
    for name in sorted(ck.tables):
        q = header.tensors.get(name)
        s = header.tensors.get(TF.scale_name(name))
        if q is None or s is None or len(q.shape) != 2:
            raise StepRefused(f"{L.TABLES} lacks {name} or its scale")
        rows, hidden = q.shape
        added.append(TensorOut(name, dtype, (rows, hidden), Decoded(
            name, L.TABLES, header.data_start + q.begin, header.data_start + s.begin, rows, hidden, dtype)))
    plan.reads[L.TABLES] = ck.files[L.TABLES]
    rewrite_backbone(plan, ck, add=added)
    write_head_config(plan, without_marker(_head_config(ck)))
    plan.removed.append(L.TABLES)
    carry_rest(plan, ck)
    quality = header.metadata.get("quality", "")
    try:
        figures = {k: v.get("rel_error") for k, v in json.loads(quality).items()}
    except (ValueError, AttributeError):
        figures = {}
    plan.notes.append(
        f"the tables come back DECODED FROM INT8 as {dtype}, not the original BF16 download"
        + (f" (relative error {figures})" if figures else "")
        + "; for the exact original tables, re-download the layout-1 revision")
    return plan
