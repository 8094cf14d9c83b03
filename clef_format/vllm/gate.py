"""The serving gate: refuse, at start-up, any (checkpoint, plugin version) pair that must not be served.

``check_checkpoint`` reads a checkpoint's structure (headers only, no torch), checks the pair with
``clef_format.spec.compat.check_pair``, then refuses on any error verify's layout and tables checks
find, so a plugin never starts on files verify would reject.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Union

from clef_format.errors import IncompatibleError
from clef_format.spec.compat import check_pair, marker_fix
from clef_format.spec.layouts import TABLES, Layout

if TYPE_CHECKING:
    from clef_format.read.checkpoint import Checkpoint

#: What the hooks accept as a checkpoint: a directory, a cached repo id, or one already read.
CheckpointSource = Union[str, "os.PathLike[str]", "Checkpoint"]


def check_checkpoint(source: CheckpointSource, plugin_version: str) -> "Checkpoint":
    """Refuse (``IncompatibleError``) a checkpoint this plugin version must not serve; else return it read.

    Order: the pair (``check_pair``: layout and marker against the version), then every error of
    reading the files and of verify's layout and tables checks (missing or misshapen tables file,
    bad headers, paths leaving the checkpoint ...). Headers only: no tensor data beyond the table
    scales' sign bits, no torch. Raises ``PathNotFound`` when the checkpoint does not exist.
    """
    from clef_format.read.checkpoint import open_checkpoint
    from clef_format.spec.marker import MarkerError, read_marker
    from clef_format.verify.checks.layout import check_layout
    from clef_format.verify.checks.tables import check_tables

    ck = open_checkpoint(source)
    if ck.unreadable:
        first = next(f for f in ck.findings if f.code == "unreadable")
        raise IncompatibleError("unreadable", first.message, first.fix or "make the checkpoint readable",
                                [f for f in ck.findings if f.code == "unreadable"])
    path, snapshot = str(ck.root), ck.hf_snapshot
    try:
        marker = read_marker(ck.head_config) if isinstance(ck.head_config, dict) else None
    except MarkerError as exc:
        raise IncompatibleError("marker-invalid", str(exc), marker_fix(path, snapshot)) from None
    check_pair(ck.layout, marker, plugin_version, path=path, snapshot=snapshot)
    if ck.layout is Layout.LAYOUT_2 and not ck.has(TABLES) and TABLES not in ck.bad_headers:
        raise IncompatibleError("tables-missing", f"the marker says layout-2 but {TABLES} is missing",
                                f"download {TABLES} from the same revision of the checkpoint")
    errors = [f for f in (*ck.findings, *check_layout(ck), *check_tables(ck)) if f.severity == "error"]
    if errors:
        first = errors[0]
        more = f" (and {len(errors) - 1} more: {', '.join(sorted({f.code for f in errors[1:]}))})" if len(errors) > 1 else ""
        raise IncompatibleError(first.code, first.message + more,
                                first.fix or f"run clef-format verify {path} and fix what it reports", errors)
    return ck
