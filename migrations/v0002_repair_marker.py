"""layout-2-unmarked -> layout-2: add the missing ``requires_clef_vllm`` marker (the 2026-10-07 downloads).

Only the joint head config changes. The step is allowed only when the int8 tables file verifies
(structure, metadata, every scale finite, every value in [-127, 127]); otherwise the download is
broken in a way a marker cannot fix, and the fix is to re-download. Irreversible: there is no
reason to ever produce the unmarked state again.
"""

from __future__ import annotations

from clef_format.errors import StepRefused
from clef_format.migrate.build import carry_rest, write_head_config
from clef_format.migrate.plan import Plan
from clef_format.read.checkpoint import Checkpoint
from clef_format.spec import layouts as L
from clef_format.spec.marker import with_marker

revision = "0002_repair_marker"
down_revision = "0001_int8_tables"
from_layout = L.Layout.LAYOUT_2_UNMARKED.value
to_layout = L.Layout.LAYOUT_2.value
description = "repair: add the requires_clef_vllm marker when the int8 tables verify"
repair = True
#: The tables file is read in full before repairing (the value rule of spec.tables_format).
DEEP_CHECK = True


def upgrade(ck: Checkpoint) -> Plan:
    if not isinstance(ck.head_config, dict):
        raise StepRefused(f"{L.HEAD_CONFIG} is missing or not a JSON object")
    plan = Plan(revision, "upgrade", from_layout, to_layout, ck.root, fixes=frozenset({"marker-missing"}))
    write_head_config(plan, with_marker(ck.head_config))
    plan.reads[L.HEAD_CONFIG] = ck.files.get(L.HEAD_CONFIG, 0)
    plan.reads[L.TABLES] = ck.files.get(L.TABLES, 0)
    carry_rest(plan, ck)
    plan.notes.append("writes only the marker; the int8 tables are checked in full first and kept as they are")
    return plan


def downgrade(ck: Checkpoint) -> Plan:
    raise StepRefused("the repair cannot be undone: layout-2-unmarked must never exist; "
                      "to serve with clef-vllm 0.1.x migrate --to layout-1")
