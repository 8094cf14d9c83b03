"""``clef-format layers``: the per-layer view with verify's verdict, both from one ``verify_checkpoint``
call (the one ``verify --layers`` makes), as a report of its own."""

from __future__ import annotations

from clef_format.read.checkpoint import open_checkpoint
from clef_format.report import Report, make_report
from clef_format.spec.findings import error
from clef_format.spec.layouts import CONFIG
from clef_format.verify.layers import LayersDetails
from clef_format.verify.options import VerifyOptions
from clef_format.verify.run import VerifyDetails, verify_checkpoint
from clef_format.verify.vllm_build import build_vllm
from clef_format.vllm_rules import names as vllm_names


def layers_report(path: str, version: str = vllm_names.DEFAULT_VLLM) -> Report:
    """``clef-format layers``: the view plus verify's findings (its verdict: the same checks, one rule), both
    from one ``verify_checkpoint`` (as ``verify --layers``).

    Reading problems of config.json (unreadable, not JSON, bad keys) are the report's findings and
    there is no view; a view whose layers vLLM cannot build carries those errors as findings.
    """
    ck = open_checkpoint(path)
    reading = [f for f in ck.findings if f.file in (CONFIG, None) or f.code == "unreadable"]
    if ck.config is None or ck.model is None or ck.unreadable:
        missing = [] if ck.has(CONFIG) or reading else [error("missing-file", f"{CONFIG} is missing", file=CONFIG,
                                                             fix="restore config.json from the original download")]
        return make_report("layers", path, str(ck.layout), reading + missing, LayersDetails(version, None))
    # the verdict is verify's: a view of a config vLLM refuses, or of a folder without its weights, is BROKEN
    verified = verify_checkpoint(ck, path, VerifyOptions(vllm_version=version, layers=True), bundled=True)
    findings = list(verified.findings)
    assert isinstance(verified.details, VerifyDetails)
    view = verified.details.layers
    if view is None and not any(f.severity == "error" for f in findings):
        findings.append(error("quant-config-invalid", str(build_vllm(ck.model, version).refused), file=CONFIG))
    return make_report("layers", path, str(ck.layout), findings, LayersDetails(version, view))
