"""Read-only checks migrate needs beyond verify's structural ones (no writes, no torch).

The rule is ``spec.tables_format``'s, applied by ``verify.checks.tables.table_content_findings``:
the same that ``verify --deep`` reports.
"""

from __future__ import annotations

from clef_format.read.checkpoint import Checkpoint
from clef_format.spec.findings import Finding


def table_content_problems(ck: Checkpoint) -> list[Finding]:
    """Every table value that breaks the format (int8 -128, a NaN/Inf in a float table), as verify findings."""
    from clef_format.verify.checks.tables import table_content_findings

    return table_content_findings(ck)
