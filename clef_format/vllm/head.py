"""The joint head config a plugin builds ``JointSchemaHead(**config)`` from, for its own version."""

from __future__ import annotations

from typing import Any

from clef_format.errors import IncompatibleError
from clef_format.spec.joint_head import HeadConfigError, parse_head_config
from clef_format.spec.marker import without_marker
from clef_format.vllm.gate import CheckpointSource, check_checkpoint


def head_config(source: CheckpointSource, plugin_version: str) -> dict[str, Any]:
    """The head config without the marker, after the (checkpoint, plugin version) pair is checked.

    Refuses (``IncompatibleError``) what ``check_checkpoint`` refuses, and a config that
    ``JointSchemaHead(**config)`` would reject: missing keys (``head-incomplete``) or keys the
    head does not take (``head-unexpected``). The marker is taken out because the head's
    constructor does not accept it: it exists precisely to break plugins that do not remove it.
    """
    ck = check_checkpoint(source, plugin_version)
    raw = ck.head_config
    try:
        _, unknown = parse_head_config(raw)
    except HeadConfigError as exc:
        raise IncompatibleError("head-incomplete", str(exc),
                                "re-download clef_head/joint_head_config.json from the same revision") from None
    if unknown:
        raise IncompatibleError("head-unexpected", f"joint head config has keys the head does not take: {unknown}",
                                "re-download clef_head/joint_head_config.json from the same revision")
    assert isinstance(raw, dict)
    return without_marker(raw)
