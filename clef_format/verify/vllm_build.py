"""What vLLM builds from a checkpoint's config on one vLLM version: its layers, the quantization config
as vLLM parses and maps it, and the scheme decided for each layer.

Built once per verify (``verify.run.verify_checkpoint``) and shared by the pattern check, the global-scale
check and the per-layer view, which otherwise each built the model and resolved every layer again.
"""

from __future__ import annotations

from clef_format.records import Record
from clef_format.spec import schemes
from clef_format.spec.model_spec import ModelConfig
from clef_format.vllm_rules import matching as R
from clef_format.vllm_rules import names as vllm_names
from clef_format.vllm_rules.names import VllmModel


class VllmBuild(Record):
    """``quant``/``vquant``: the config as vLLM parses it and after its name mapper (``None`` without a
    quantization_config, or when vLLM refuses it: ``refused`` holds why); ``decisions``: per layer of
    ``model.layers``, in order (empty when refused); ``in_play``: the version-table rows the config meets
    (``None`` when refused)."""

    version: str
    model: VllmModel
    quant: R.QuantConfig | None
    vquant: R.VllmQuant | None
    decisions: tuple[R.Decision, ...]
    in_play: frozenset[str] | None
    refused: str | None = None


def build_vllm(cfg: ModelConfig, version: str) -> VllmBuild:
    """The build of ``cfg`` on vLLM ``version`` (``vllm_rules.matching``'s ``get_quant_method`` per layer)."""
    model = vllm_names.build(cfg, version)
    if cfg.quantization is None:
        return VllmBuild(version, model, None, None, tuple(R.Decision(l.name, schemes.UNQUANTIZED) for l in model.layers),
                         frozenset())
    try:
        qc = R.parse_quant_config(cfg.quantization, version)
    except R.QuantConfigError as e:
        return VllmBuild(version, model, None, None, (), None, str(e))
    vq = R.vllm_view(qc, model)
    return VllmBuild(version, model, qc, vq, tuple(R.resolve_layer(l, vq, model) for l in model.layers),
                     R.rules_in_play(qc, vq, model))
