"""Per-layer view: what vLLM builds for each decoder layer, and whether the weights fit a 16 GB card.

Pure: takes config.json (a dict), returns rows and a memory estimate. Weight bytes per layer come
from ``schemes.weight_bytes`` (the group's bits per weight and its scales); the tables (embed_tokens, lm_head) are counted as vLLM
holds them for a layout-2 checkpoint served by the clef plugin when ``int8_tables`` is set.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from clef_format.read.safetensors import numel
from clef_format.spec import schemes
from clef_format.spec.model_spec import ModelConfig, parse_config, plain_params
from clef_format.verify.vllm_build import VllmBuild, build_vllm
from clef_format.vllm_rules import matching
from clef_format.vllm_rules import names as vllm_names

GIB = 1024**3
CARD_BYTES = 16 * GIB
#: Left for CUDA context, activations and a useful KV cache on a 16 GB card (vLLM's default
#: gpu_memory_utilization 0.9 leaves 1.6 GB; we ask for 2 GiB more for the cache itself).
HEADROOM_BYTES = int(3.6 * GIB)


@dataclass(frozen=True)
class LayerRow:
    index: int
    attention: str  # linear_attention | full_attention
    groups: dict[str, str]  # projection group (vLLM layer suffix) -> scheme or "error: ..."
    weight_bytes: int


@dataclass(frozen=True)
class LayersView:
    arch: str
    rows: list[LayerRow]
    other: dict[str, str] = field(default_factory=dict)  # lm_head, vision -> scheme summary
    weight_bytes: int = 0
    fits_16gb: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["weight_gib"] = round(self.weight_bytes / GIB, 3)
        return d


def _bytes(d: matching.Decision, entry: matching.Entry | None, out_features: int, in_features: int) -> int:
    """The layer's weight bytes under the scheme vLLM builds (its group's bits and scales); a layer vLLM
    cannot build, or builds unquantized, counts as BF16 (an upper bound)."""
    if d.error is not None or d.scheme == schemes.UNQUANTIZED or entry is None:
        return schemes.weight_bytes(None, out_features, in_features)
    return schemes.weight_bytes(entry.weights.raw, out_features, in_features)


def layers_view(config: Mapping[str, Any], int8_tables: bool = True, version: str = vllm_names.DEFAULT_VLLM) -> LayersView:
    """Rows per decoder layer plus the memory estimate of a config.json (a dict). Raises ConfigError /
    QuantConfigError."""
    cfg = parse_config(dict(config))
    built = build_vllm(cfg, version)
    if built.refused is not None:
        raise matching.QuantConfigError(built.refused)
    return view_of(cfg, built, int8_tables)


def view_of(cfg: ModelConfig, built: VllmBuild, int8_tables: bool = True) -> LayersView:
    """The view of ``cfg`` from ``built``, its build on one vLLM version (not refused): the layers and the
    scheme decided for each, as the pattern check saw them."""
    model = built.model
    decisions = {d.layer: d for d in built.decisions}
    targets = built.vquant.targets if built.vquant is not None else {}
    per_layer: dict[int, dict[str, str]] = {}
    layer_bytes: dict[int, int] = {}
    other: dict[str, set[str]] = {}
    total = 0
    for layer in model.layers:
        d = decisions[layer.name]
        label = d.scheme if d.error is None else f"error: {d.error_kind}"
        size = sum(_bytes(d, targets.get(d.target or ""), s.out_features, s.in_features) for s in layer.shards)
        if layer.group == "lm_head" and int8_tables and d.scheme == schemes.UNQUANTIZED:
            size = layer.out_features * (layer.in_features + 4)  # int8 rows + one F32 scale per row
        total += size
        if layer.layer is None:
            other.setdefault(layer.group, set()).add(label or "?")
            continue
        per_layer.setdefault(layer.layer, {})[layer.name.rsplit(".", 2)[-2] + "." + layer.name.rsplit(".", 1)[-1]] = label or "?"
        layer_bytes[layer.layer] = layer_bytes.get(layer.layer, 0) + size
    vocab, hidden = cfg.text.vocab_size, cfg.text.hidden_size
    total += vocab * (hidden + 4) if int8_tables else vocab * hidden * 2  # embed_tokens
    total += sum(numel(s) for s in plain_params(cfg).values()) * 2  # norms, conv1d, A_log...
    rows = [LayerRow(i, cfg.text.layer_types[i], per_layer.get(i, {}), layer_bytes.get(i, 0))
            for i in range(cfg.text.num_layers)]
    return LayersView(model.arch, rows, {k: "/".join(sorted(v)) for k, v in other.items()}, total,
                      total + HEADROOM_BYTES <= CARD_BYTES)


@dataclass(frozen=True)
class LayersDetails:
    """``clef-format layers``' own keys: the vLLM version whose rules the view follows, then the view's
    keys; none when config.json gives no view."""

    vllm_version: str
    view: LayersView | None

    @property
    def capped_after(self) -> str | None:
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"vllm_version": self.vllm_version, **self.view.to_dict()} if self.view is not None else {}
