"""What one verify is asked to do: a record passed to ``verify_checkpoint`` and to every check.

The checks are pure functions of the checkpoint read and these options (and of what vLLM builds from
its config, ``verify.vllm_build``, built once from both); nothing reaches them as an attribute set on
the ``Checkpoint``.
"""

from __future__ import annotations

from clef_format.records import Record
from clef_format.vllm_rules.names import DEFAULT_VLLM


class VerifyOptions(Record):
    """``vllm_version``: whose matching rules the pattern check and the per-layer view follow (``None``:
    ``DEFAULT_VLLM``, and the report does not state one); ``plugin_version``: a clef-vllm version to check
    against the weights (``--plugin-version``); ``deep``: hash every file and decode every scale;
    ``layers``: add the per-layer view (``clef-format layers``) to the report."""

    vllm_version: str | None = None
    plugin_version: str | None = None
    deep: bool = False
    layers: bool = False

    @property
    def rules(self) -> str:
        """The vLLM version whose rules apply."""
        return self.vllm_version or DEFAULT_VLLM


#: A plain verify: the default vLLM rules, no plugin version, structure only, no per-layer view.
DEFAULTS = VerifyOptions()
