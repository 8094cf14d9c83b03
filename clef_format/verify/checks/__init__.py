"""Checks: pure functions from a ``Checkpoint``, the ``VerifyOptions`` and what vLLM builds from its config
(``VllmBuild``, ``None`` without a parsed config) to findings. ``CHECKS`` is the order verify runs them."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Callable, Iterable

from clef_format.read.checkpoint import Checkpoint
from clef_format.spec.findings import Finding
from clef_format.verify.checks.backbone import check_backbone
from clef_format.verify.checks.cache import check_cache
from clef_format.verify.checks.config import check_config
from clef_format.verify.checks.global_scales import check_global_scales, check_scalar_scales
from clef_format.verify.checks.head import check_head
from clef_format.verify.checks.layout import check_layout
from clef_format.verify.checks.patterns import check_patterns
from clef_format.verify.checks.tables import check_tables

if TYPE_CHECKING:
    from clef_format.verify.options import VerifyOptions
    from clef_format.verify.vllm_build import VllmBuild

    Check = Callable[[Checkpoint, VerifyOptions, VllmBuild | None], Iterable[Finding]]

CHECKS: list[Check] = [
    check_layout,
    check_config,
    check_backbone,
    check_tables,
    check_head,
    check_cache,
    check_patterns,
    check_scalar_scales,
    check_global_scales,
]
