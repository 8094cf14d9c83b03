"""config.json values that vLLM or transformers refuse, or that make them build a model these weights
do not fit, although every tensor shape agrees (``vllm_rules.config_rules``)."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from clef_format.verify.vllm_build import VllmBuild
    from typing import Iterator

from clef_format.read.checkpoint import Checkpoint
from clef_format.verify.options import DEFAULTS, VerifyOptions
from clef_format.spec import layouts as L
from clef_format.spec.findings import Finding, error
from clef_format.vllm_rules.config_rules import config_problems


def check_config(ck: Checkpoint, opts: VerifyOptions = DEFAULTS, vllm: VllmBuild | None = None) -> Iterator[Finding]:
    if ck.config is None or ck.model is None:
        return
    # every known layout stores both tables (backbone, int8 tables file or the release)
    tables_stored = ck.layout != L.Layout.UNKNOWN or all(t in ck.backbone for t in ck.tables)
    for p in config_problems(ck.config, ck.model, tables_stored):
        yield error("config-invalid", p.message, file=L.CONFIG, fix=p.fix)
