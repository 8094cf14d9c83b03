"""Joint head checks: its config parses for ``JointSchemaHead(**config)`` and its tensors are complete."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Iterator

from clef_format.read.checkpoint import Checkpoint
from clef_format.spec import layouts as L
from clef_format.spec.findings import Finding, error
from clef_format.spec.joint_head import HeadConfigError, config_problems, feedforward_of, head_problems, parse_head_config

_FIX = "re-download the joint head files of this revision"
#: Findings listed per head file (a hostile or foreign file must not flood the report).
_MAX_FINDINGS = 50


def check_head(ck: Checkpoint) -> Iterator[Finding]:
    weights, config_rel = L.head_files(ck.layout)
    if ck.head_config is None or not ck.has(config_rel):
        return
    try:
        cfg, unknown = parse_head_config(ck.head_config)
    except HeadConfigError as exc:
        yield error("head-incomplete", str(exc), file=config_rel, fix=_FIX)
        return
    if unknown:
        yield error("head-unexpected",
                    f"{config_rel} has keys {unknown} that JointSchemaHead(**config) does not accept",
                    file=config_rel, fix=f"remove {unknown} from {config_rel}")
    if ck.model is not None and cfg.hidden_size != ck.model.text.hidden_size:
        yield error("head-incomplete",
                    f"joint head hidden_size {cfg.hidden_size} differs from the backbone's {ck.model.text.hidden_size}",
                    file=config_rel, fix=_FIX)
    header = ck.headers.get(weights)
    if header is None:
        return
    tensors = {name: (info.dtype, info.shape) for name, info in header.tensors.items()}
    for p in config_problems(cfg, tensors):
        value = feedforward_of(tensors) if p.tensor == "feedforward" else None
        fix = (f'set "feedforward": {value} in {config_rel}' if value is not None else
               f"set {p.tensor} in {config_rel} to the value the head was trained with (the release: "
               f"{'16, dividing width 1024' if p.tensor == 'heads' else '4096'})")
        yield error("head-config-invalid", f"{config_rel}: {p.message}", file=config_rel, fix=fix)
    problems = head_problems(cfg, tensors)
    for p in problems[:_MAX_FINDINGS]:
        code = "head-unexpected" if p.kind == "unexpected" else "head-incomplete"
        yield error(code, f"{weights}: {p.message}", file=weights, tensor=p.tensor, fix=_FIX)
    if len(problems) > _MAX_FINDINGS:
        yield error("head-incomplete", f"{weights}: {len(problems) - _MAX_FINDINGS} more problem(s) not listed",
                    file=weights, fix=_FIX)
