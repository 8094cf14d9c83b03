"""Single mutations of the engine tier's baselines, for the differential (test_differential.py).

Each mutation is one edit of one baseline checkpoint (a copy of it): a value, a name, a config
value, the marker, or a file. ``told_by`` says which fact could tell the edit apart from the
baseline without running the engine:

- ``"rule"``: a rule the format or the engine states (a tensor vLLM needs, the table rule of
  docs/FORMAT.md, the digest the tables file records, the marker against the plugin version, JSON
  and Python that must parse);
- ``"reference"``: only the download's own reference (``clef_manifest.json``, cache blob names,
  local_dir etags): the edited bytes are valid, only a hash of the original can say they changed;
- ``None``: nothing should tell, because nothing loads differently (format strictness).

The set is chosen to cover the five classes of issue 23 with one engine start each (the reasoning
and the cost are in docs/ENGINE.md, "The differential").
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from clef_format.spec import layouts as L
from clef_format.spec import tables_format as TF

EMBED, LM_HEAD = L.EMBED_TOKENS, L.LM_HEAD
LAYER = "model.language_model.layers"
#: tokens of the engine tier's prompts (engines.PROMPTS): an edited row must be one the prompts use
PROMPT_TOKENS = (5, 9, 33)


def _edit_safetensors(path: Path, edit: Callable[[dict[str, torch.Tensor], dict[str, str]], None]) -> None:
    """Load every tensor and the metadata of ``path``, let ``edit`` change them, write the file back."""
    with safe_open(str(path), "pt") as f:
        meta = dict(f.metadata() or {})
    tensors = load_file(path)
    edit(tensors, meta)
    save_file(tensors, str(path), metadata=meta)


def _tables(edit: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Path], None]:
    return lambda root: _edit_safetensors(root / L.TABLES, lambda t, _m: edit(t))


def _backbone(edit: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Path], None]:
    return lambda root: _edit_safetensors(root / L.BACKBONE_SINGLE, lambda t, _m: edit(t))


def _json(rel: str, edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        data = json.loads((root / rel).read_text())
        edit(data)
        (root / rel).write_text(json.dumps(data, indent=2) + "\n")

    return apply


def _scale_times(name: str, row: int, factor: float) -> Callable[[dict[str, torch.Tensor]], None]:
    def edit(t: dict[str, torch.Tensor]) -> None:
        t[TF.scale_name(name)][row] *= factor

    return edit


def _int8_set(name: str, row: int, col: int, value: int) -> Callable[[dict[str, torch.Tensor]], None]:
    def edit(t: dict[str, torch.Tensor]) -> None:
        t[name][row, col] = value

    return edit


def _negate_row(name: str, row: int) -> Callable[[dict[str, torch.Tensor]], None]:
    def edit(t: dict[str, torch.Tensor]) -> None:
        t[name][row] = -t[name][row]

    return edit


def _swap_tables(t: dict[str, torch.Tensor]) -> None:
    for a, b in ((EMBED, LM_HEAD), (TF.scale_name(EMBED), TF.scale_name(LM_HEAD))):
        t[a], t[b] = t[b], t[a]


def _replace(name: str, by: str) -> Callable[[dict[str, torch.Tensor]], None]:
    def edit(t: dict[str, torch.Tensor]) -> None:
        assert t[name].shape == t[by].shape and t[name].dtype == t[by].dtype
        t[name] = t[by].clone()

    return edit


def _fp8_scale_times(name: str, factor: float) -> Callable[[dict[str, torch.Tensor]], None]:
    def edit(t: dict[str, torch.Tensor]) -> None:
        t[name] = (t[name].float() * factor).to(t[name].dtype)

    return edit


def _drop(name: str) -> Callable[[dict[str, torch.Tensor]], None]:
    return lambda t: t.pop(name)


def _rename(name: str, to: str) -> Callable[[dict[str, torch.Tensor]], None]:
    return lambda t: t.__setitem__(to, t.pop(name))


def _to_f32(name: str) -> Callable[[dict[str, torch.Tensor]], None]:
    return lambda t: t.__setitem__(name, t[name].float())


def _extra_table_tensor(t: dict[str, torch.Tensor]) -> None:
    t["extra.weight"] = torch.ones(4, dtype=torch.float32)


def _text_config(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    return _json(L.CONFIG, lambda c: edit(c.get("text_config", c)))


def _set_rope_theta(value: float) -> Callable[[dict], None]:
    return lambda tc: tc["rope_parameters"].__setitem__("rope_theta", value)


def _marker(spec: str) -> Callable[[Path], None]:
    return _json(L.HEAD_CONFIG, lambda h: h.__setitem__(L.MARKER_KEY, spec))


def _truncate(rel: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        data = (root / rel).read_bytes()
        (root / rel).write_bytes(data[: len(data) // 2])

    return apply


def _syntax_error(root: Path) -> None:
    with open(root / L.HEAD_CODE, "a") as fh:
        fh.write("\ndef broken(:\n    pass\n")


def _duplicate_key(root: Path) -> None:
    """``"model_type"`` of config.json written twice with the same value (the text, not a dict, holds it)."""
    text = (root / L.CONFIG).read_text()
    config = json.loads(text)
    key, value = "model_type", config["model_type"]
    i = text.index("{") + 1
    (root / L.CONFIG).write_text(text[:i] + f"\n  {json.dumps(key)}: {json.dumps(value)}," + text[i:])


def _index(edit: Callable[[dict[str, str]], None]) -> Callable[[Path], None]:
    return _json(L.BACKBONE_INDEX, lambda idx: edit(idx["weight_map"]))


def _index_drop(name: str) -> Callable[[dict[str, str]], None]:
    return lambda wm: wm.pop(name)


def _index_other_shard(name: str) -> Callable[[dict[str, str]], None]:
    def edit(wm: dict[str, str]) -> None:
        shards = sorted(set(wm.values()))
        wm[name] = next(s for s in shards if s != wm[name])

    return edit


@dataclass(frozen=True)
class Mutation:
    id: str
    baseline: str  # a name of checkpoints.CASES (or checkpoints.BASELINES)
    kind: str  # values | names | configs | markers | files | none
    told_by: str | None
    apply: Callable[[Path], None]
    what: str


def _l(i: int, rest: str) -> str:
    return f"{LAYER}.{i}.{rest}"


B, F, S = "layout-2", "layout-2-fp8-text", "layout-2-2-shards"
_FP8_SCALE = "model.layers.0.mlp.down_proj.weight_scale"
_SHARDED = _l(3, "mlp.up_proj.weight")

MUTATIONS: tuple[Mutation, ...] = (
    Mutation("baseline-2-shards", S, "none", None, lambda root: None, "the 2-shard copy itself (a control)"),
    # values
    Mutation("table-row-scale-x2", B, "values", "rule", _tables(_scale_times(EMBED, PROMPT_TOKENS[0], 2.0)),
             f"embed_tokens' scale of row {PROMPT_TOKENS[0]} doubled"),
    Mutation("table-zero-scale", B, "values", "rule", _tables(_scale_times(EMBED, PROMPT_TOKENS[1], 0.0)),
             f"embed_tokens' scale of row {PROMPT_TOKENS[1]} set to 0 (its int8 values are not zero)"),
    Mutation("table-int8-minus-128", B, "values", "rule", _tables(_int8_set(EMBED, PROMPT_TOKENS[2], 0, -128)),
             f"embed_tokens[{PROMPT_TOKENS[2]}, 0] set to -128"),
    Mutation("lm-head-row-negated", B, "values", "rule", _tables(_negate_row(LM_HEAD, PROMPT_TOKENS[1])),
             f"lm_head's int8 row {PROMPT_TOKENS[1]} negated"),
    Mutation("tables-swapped", B, "values", "rule", _tables(_swap_tables),
             "embed_tokens and lm_head swapped in the tables file (same shapes)"),
    Mutation("backbone-layer-replaced", B, "values", "reference",
             _backbone(_replace(_l(0, "mlp.down_proj.weight"), _l(1, "mlp.down_proj.weight"))),
             "layer 0's mlp.down_proj replaced by layer 1's (same shape and dtype)"),
    Mutation("fp8-weight-scale-x2", F, "values", "reference", _backbone(_fp8_scale_times(_FP8_SCALE, 2.0)),
             f"{_FP8_SCALE} doubled"),
    # names
    Mutation("backbone-tensor-dropped", B, "names", "rule", _backbone(_drop(_l(1, "mlp.up_proj.weight"))),
             "layer 1's mlp.up_proj dropped from the backbone"),
    Mutation("backbone-tensor-renamed", B, "names", "rule",
             _backbone(_rename(_l(1, "mlp.up_proj.weight"), _l(1, "mlp.up_proj.weights"))),
             "layer 1's mlp.up_proj.weight renamed ...weights"),
    Mutation("index-entry-missing", S, "names", None, _index(_index_drop(_SHARDED)),
             "one backbone tensor missing from model.safetensors.index.json (still in its shard)"),
    Mutation("index-wrong-shard", S, "names", None, _index(_index_other_shard(_SHARDED)),
             "one index entry naming the other shard"),
    # configs
    Mutation("rms-norm-eps-changed", B, "configs", "reference", _text_config(lambda tc: tc.update(rms_norm_eps=1e-2)),
             "rms_norm_eps 1e-06 -> 1e-02"),
    Mutation("rope-theta-changed", B, "configs", "reference", _text_config(_set_rope_theta(1e6)),
             "rope_theta 1e4 -> 1e6"),
    Mutation("config-key-removed", B, "configs", None, _text_config(lambda tc: tc.pop("rms_norm_eps")),
             "rms_norm_eps removed (the classes' default is the same 1e-06)"),
    # markers
    Mutation("marker-excludes-plugin", B, "markers", "rule", _marker(">=0.3.0"),
             "requires_clef_vllm >=0.3.0 (the installed plugin is 0.2.1)"),
    # files
    Mutation("tokenizer-truncated", B, "files", "rule", _truncate("tokenizer.json"), "tokenizer.json cut in half"),
    Mutation("head-code-syntax-error", B, "files", "rule", _syntax_error,
             "joint_schema_model.py with a syntax error appended"),
    Mutation("tables-extra-tensor", B, "files", None, _tables(_extra_table_tensor),
             "an extra F32 tensor in the tables file"),
    Mutation("bf16-stored-as-f32", B, "files", None, _backbone(_to_f32(_l(0, "input_layernorm.weight"))),
             "layer 0's input_layernorm stored as F32 (same values)"),
    Mutation("config-duplicate-key", B, "files", None, _duplicate_key,
             "config.json with model_type written twice, same value"),
)

BY_ID = {m.id: m for m in MUTATIONS}


def make(mutation: Mutation, baseline: Path, root: Path) -> Path:
    """A copy of ``baseline`` at ``root`` with ``mutation`` applied."""
    shutil.copytree(baseline, root)
    mutation.apply(root)
    return root
