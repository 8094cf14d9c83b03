"""The config rules that no tensor shape shows: each edit of a valid checkpoint's config is reported
with its code, names the key and carries a fix (tests/scenarios/test_fixes.py applies the edit fixes)."""

from __future__ import annotations

import json
import re
from typing import Any, Callable

import pytest

from clef_format.spec import layouts as L
from clef_format.verify.run import verify

#: ``set "a.b.c": <json> in FILE``: the one phrasing of an edit fix (config_rules.set_fix, the marker fix).
SET_FIX = re.compile(r'set "([^"]+)": (.+) in (\S+)$')


def apply_set_fix(root, fix: str) -> None:
    m = SET_FIX.search(fix)
    assert m, fix
    key, value, rel = m.group(1), json.loads(m.group(2)), m.group(3)
    path = root / rel
    obj = json.loads(path.read_text())
    *parents, leaf = key.split(".")
    node = obj
    for k in parents:
        node = node[k]
    node[leaf] = value
    path.write_text(json.dumps(obj, indent=2))


def _set(path: str, value: Any) -> Callable[[dict], None]:
    def edit(obj: dict) -> None:
        *parents, leaf = path.split(".")
        for k in parents:
            obj = obj[k]
        if value is _REMOVE:
            obj.pop(leaf)
        else:
            obj[leaf] = value
    return edit


_REMOVE = object()

#: (id, build, file, edit, code, key the finding names, whether the fix is an edit that works)
CASES = [
    ("architectures-other", "hybrid", L.CONFIG, _set("architectures", ["Qwen3_5ForCausalLM"]), "config-invalid",
     "architectures", True),
    ("architectures-unknown", "bf16", L.CONFIG, _set("architectures", ["Qwen3_5ForConditionalGeneration-x"]),
     "config-invalid", "architectures", True),
    ("model_type-other", "bf16", L.CONFIG, _set("model_type", "qwen3_5_moe"), "config-invalid", "model_type", True),
    ("model_type-removed", "bf16", L.CONFIG, _set("model_type", _REMOVE), "config-invalid", "model_type", True),
    ("text-model_type", "bf16", L.CONFIG, _set("text_config.model_type", "qwen3_5_moe_text"), "config-invalid",
     "text_config.model_type", True),
    ("hidden_act", "bf16", L.CONFIG, _set("text_config.hidden_act", "gelu"), "config-invalid",
     "text_config.hidden_act", True),
    ("vision-hidden_act", "bf16", L.CONFIG, _set("vision_config.hidden_act", "gelu-x"), "config-invalid",
     "vision_config.hidden_act", True),
    ("rope_type", "bf16", L.CONFIG, _set("text_config.rope_parameters.rope_type", "default-x"), "config-invalid",
     "rope_type", True),
    ("partial_rotary_factor", "bf16", L.CONFIG, _set("text_config.rope_parameters.partial_rotary_factor", 1.5),
     "config-invalid", "partial_rotary_factor", True),
    ("vision-num_heads", "bf16", L.CONFIG, _set("vision_config.num_heads", 3), "config-invalid",
     "vision_config.num_heads", False),
    ("token-id-shared", "bf16", L.CONFIG, _set("vision_start_token_id", 503), "config-invalid",
     "vision_start_token_id", False),
    ("token-id-out-of-vocab", "bf16", L.CONFIG, _set("image_token_id", 512), "config-invalid", "image_token_id", False),
    ("token-id-default-out-of-vocab", "bf16", L.CONFIG, _set("video_token_id", _REMOVE), "config-invalid",
     "video_token_id", False),
    ("tie-text", "hybrid", L.CONFIG, _set("text_config.tie_word_embeddings", True), "config-invalid",
     "text_config.tie_word_embeddings", True),
    ("tie-top", "hybrid", L.CONFIG, _set("tie_word_embeddings", True), "config-invalid", "tie_word_embeddings", True),
    ("tie-string", "hybrid", L.CONFIG, _set("tie_word_embeddings", "true"), "config-invalid", "tie_word_embeddings",
     True),
    ("rms_norm_eps-string", "bf16", L.CONFIG, _set("text_config.rms_norm_eps", "1e-6"), "config-invalid",
     "text_config.rms_norm_eps", True),
    ("max_position_embeddings-string", "bf16", L.CONFIG, _set("text_config.max_position_embeddings", "32768"),
     "config-invalid", "text_config.max_position_embeddings", True),
    ("use_cache-word", "bf16", L.CONFIG, _set("text_config.use_cache", "yes"), "config-invalid",
     "text_config.use_cache", False),
    ("mrope_section-sum", "bf16", L.CONFIG, _set("text_config.rope_parameters.mrope_section", [1, 1, 1]),
     "config-invalid", "text_config.rope_parameters.mrope_section", False),
    ("mrope_section-not-numbers", "bf16", L.CONFIG, _set("text_config.rope_parameters.mrope_section", "1,1"),
     "config-invalid", "text_config.rope_parameters.mrope_section", False),
    ("rms_norm_eps-nan", "bf16", L.CONFIG, _set("text_config.rms_norm_eps", float("nan")), "config-invalid",
     "text_config.rms_norm_eps", True),
    ("rms_norm_eps-inf", "bf16", L.CONFIG, _set("text_config.rms_norm_eps", float("inf")), "config-invalid",
     "text_config.rms_norm_eps", True),
    ("rms_norm_eps-negative", "bf16", L.CONFIG, _set("text_config.rms_norm_eps", -1e-06), "config-invalid",
     "text_config.rms_norm_eps", True),
    ("rope_theta-nan", "bf16", L.CONFIG, _set("text_config.rope_parameters.rope_theta", float("nan")),
     "config-invalid", "text_config.rope_parameters.rope_theta", False),
    ("rope_theta-negative", "bf16", L.CONFIG, _set("text_config.rope_parameters.rope_theta", -10000.0),
     "config-invalid", "text_config.rope_parameters.rope_theta", False),
    ("rope_theta-infinite", "bf16", L.CONFIG, _set("text_config.rope_parameters.rope_theta", float("-inf")),
     "config-invalid", "text_config.rope_parameters.rope_theta", False),
    ("rms_norm_eps-float32-infinite", "bf16", L.CONFIG, _set("text_config.rms_norm_eps", 1e39), "config-invalid",
     "text_config.rms_norm_eps", True),
    ("rope_theta-float32-zero", "bf16", L.CONFIG, _set("text_config.rope_parameters.rope_theta", 1e-50),
     "config-invalid", "text_config.rope_parameters.rope_theta", False),
    ("rope_theta-float32-inverse-infinite", "bf16", L.CONFIG, _set("text_config.rope_parameters.rope_theta", 1e-39),
     "config-invalid", "text_config.rope_parameters.rope_theta", False),
    ("rope_theta-float32-infinite", "bf16", L.CONFIG, _set("text_config.rope_parameters.rope_theta", 1e39),
     "config-invalid", "text_config.rope_parameters.rope_theta", False),
    ("mrope_section-float", "bf16", L.CONFIG, _set("text_config.rope_parameters.mrope_section", [1.0, 1, 0]),
     "config-invalid", "text_config.rope_parameters.mrope_section", False),
    ("mrope_section-bool", "bf16", L.CONFIG, _set("text_config.rope_parameters.mrope_section", [1, True, 0]),
     "config-invalid", "text_config.rope_parameters.mrope_section", False),
    ("mrope_section-negative", "bf16", L.CONFIG, _set("text_config.rope_parameters.mrope_section", [3, -1, 0]),
     "config-invalid", "text_config.rope_parameters.mrope_section", False),
    ("max_position_embeddings-negative", "bf16", L.CONFIG, _set("text_config.max_position_embeddings", -1),
     "config-invalid", "text_config.max_position_embeddings", False),
    ("max_position_embeddings-huge", "bf16", L.CONFIG, _set("text_config.max_position_embeddings", 10**19),
     "config-invalid", "text_config.max_position_embeddings", False),
    ("head-heads", "bf16", L.HEAD_CONFIG, _set("heads", 5), "head-config-invalid", "heads", False),
    ("head-feedforward", "bf16", L.HEAD_CONFIG, _set("feedforward", 128), "head-config-invalid", "feedforward", True),
]


def broken(fresh, build: str, rel: str, edit: Callable[[dict], None]):
    """A valid layout-2 checkpoint of ``build`` with ``edit`` applied to ``rel``."""
    root = fresh("layout-2", build, num_layers=4)
    assert verify(str(root)).ok
    obj = json.loads((root / rel).read_text())
    edit(obj)
    (root / rel).write_text(json.dumps(obj, indent=2))
    return root


def findings_for(report, code: str, key: str) -> list:
    return [f for f in report.findings if f.code == code and key in f.message and f.severity == "error"]


@pytest.mark.parametrize("name, build, rel, edit, code, key, edit_fix", CASES, ids=[c[0] for c in CASES])
def test_config_rule_reports_the_key_and_its_fix_works(fresh, name, build, rel, edit, code, key, edit_fix):
    hits = findings_for(verify(str(broken(fresh, build, rel, edit))), code, key)
    assert hits, f"no {code} naming {key}"
    assert hits[0].file == rel and hits[0].fix
    assert bool(SET_FIX.search(hits[0].fix)) == edit_fix, hits[0].fix  # an edit exactly where one value is known


CONFIG_CASES = [c for c in CASES if c[2] == L.CONFIG]


@pytest.mark.parametrize("name, build, rel, edit, code, key, edit_fix", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_layers_reports_the_config_errors_verify_reports(fresh, name, build, rel, edit, code, key, edit_fix):
    """``layers`` showed a table of schemes for a config.json vLLM or transformers refuses, with OK."""
    from clef_format.verify.layers_report import layers_report

    root = broken(fresh, build, rel, edit)
    config_codes = ("config-invalid", "quant-config-invalid")

    def errors(report) -> set[tuple[str, str]]:
        return {(f.code, f.message) for f in report.findings if f.code in config_codes and f.severity == "error"}

    layers = layers_report(str(root))
    assert not layers.ok and errors(layers) == errors(verify(str(root))) and findings_for(layers, code, key)


@pytest.mark.parametrize("left", ["config-only", "backbone-deleted", "backbone-truncated"])
def test_layers_of_a_folder_without_its_weights_is_broken(fresh, left: str) -> None:
    """``layers`` said OK and "fits a 16 GB card" for a folder holding only config.json."""
    from clef_format.verify.layers_report import layers_report

    root = fresh("layout-2", "hybrid", num_layers=4)
    if left == "config-only":
        for p in sorted(root.rglob("*"), reverse=True):
            if p.name != L.CONFIG:
                p.rmdir() if p.is_dir() else p.unlink()
    elif left == "backbone-deleted":
        (root / L.BACKBONE_SINGLE).unlink()
    else:
        with open(root / L.BACKBONE_SINGLE, "r+b") as fh:
            fh.truncate(100)
    layers = layers_report(str(root))
    assert not layers.ok, layers
    errors = {(f.code, f.file) for f in layers.findings if f.severity == "error"}
    assert errors and errors <= {(f.code, f.file) for f in verify(str(root)).findings if f.severity == "error"}


def test_layers_of_a_valid_checkpoint_is_ok_with_verify_warnings(fresh) -> None:
    from clef_format.verify.layers_report import layers_report

    layers = layers_report(str(fresh("layout-1", "hybrid", num_layers=4)))
    assert layers.ok and [f.code for f in layers.findings] == ["legacy-layout"] and layers.details.view.rows


@pytest.mark.parametrize("build", ["nvfp4", "fp8", "hybrid", "mixed", "bf16"])
def test_published_builds_meet_every_config_rule(fresh, build):
    root = fresh("layout-2", build, num_layers=4)
    codes = verify(str(root)).codes()
    assert not {"config-invalid", "head-config-invalid", "quant-config-invalid"} & set(codes)


def test_text_only_and_full_size_configs_meet_the_config_rules():
    from clef_format.fixtures.configs import full_config, tiny_config
    from clef_format.spec.model_spec import parse_config
    from clef_format.vllm_rules.config_rules import config_problems

    for raw in (full_config(), tiny_config(), tiny_config(multimodal=False)):
        assert config_problems(raw, parse_config(raw)) == []


def test_head_dim_absent_reads_as_transformers_default():
    """transformers' Qwen3_5TextConfig defaults head_dim to 256, not hidden_size / num_attention_heads."""
    from clef_format.fixtures.configs import tiny_config
    from clef_format.spec.model_spec import parse_config

    raw = tiny_config()
    raw["text_config"].pop("head_dim")
    assert parse_config(raw).text.head_dim == 256


#: Config facts of compressed-tensors the stored tensors contradict where vLLM still serves them as stored.
SERVED_CASES = [
    ("weights-dynamic", "nvfp4", _set("quantization_config.config_groups.group_0.weights.dynamic", True),
     "weights.dynamic"),
    ("weights-dynamic-local", "nvfp4", _set("quantization_config.config_groups.group_0.weights.dynamic", "local"),
     "weights.dynamic"),
    ("status-removed", "hybrid", _set("quantization_config.quantization_status", _REMOVE), "quantization_status"),
    ("status-frozen", "fp8", _set("quantization_config.quantization_status", "frozen"), "quantization_status"),
    ("status-unknown", "fp8", _set("quantization_config.quantization_status", "COMPRESSED"), "quantization_status"),
]


@pytest.mark.parametrize("status", ["bogus", "COMPRESSED", "", "frozen", "initialized"])
def test_a_status_compressed_tensors_refuses_is_named_so(status: str) -> None:
    """The warning's words follow compressed-tensors' own QuantizationConfig: a value outside its enum is
    refused by it (not merely "not decompressed")."""
    import pydantic
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus

    from clef_format.spec.schemes import QUANTIZATION_STATUSES, quant_config_problems

    assert QUANTIZATION_STATUSES == tuple(s.value for s in QuantizationStatus)
    qc = {"config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"}}},
          "quant_method": "compressed-tensors", "quantization_status": status}
    try:
        QuantizationConfig.model_validate(qc)
        refused = False
    except pydantic.ValidationError:
        refused = True
    [(key, text, fix)] = quant_config_problems(qc)
    assert ("QuantizationConfig refuses it" in text) == refused and fix == "compressed"


@pytest.mark.parametrize("name, build, edit, key", SERVED_CASES, ids=[c[0] for c in SERVED_CASES])
def test_what_vllm_serves_but_transformers_does_not_load_is_a_warning_whose_fix_works(fresh, name, build, edit, key):
    """vLLM reads no quantization_status and ignores weights.dynamic for NVFP4: it serves these weights as
    stored, so the verdict is OK; transformers cannot load them, so a warning whose edit, followed, clears it."""
    root = broken(fresh, build, L.CONFIG, edit)
    report = verify(str(root))
    (hit,) = [f for f in report.findings if f.code == "quant-config-invalid"]
    assert report.ok and hit.severity == "warning" and key in hit.message and hit.file == L.CONFIG
    assert "vLLM serves the weights as stored" in hit.message
    apply_set_fix(root, hit.fix)
    after = verify(str(root))
    assert after.ok and "quant-config-invalid" not in after.codes()


def test_fp8_dynamic_weights_stay_refused_as_vllm_refuses_them(fresh):
    """vLLM refuses FP8 dynamic channel weights itself (compressed-tensors' validation): the resolver's
    finding alone, not a second one from the compressed-tensors facts."""
    root = fresh("layout-2", "fp8", num_layers=4)
    obj = json.loads((root / L.CONFIG).read_text())
    obj["quantization_config"]["config_groups"]["group_0"]["weights"]["dynamic"] = True
    (root / L.CONFIG).write_text(json.dumps(obj))
    found = [f for f in verify(str(root)).findings if f.code == "quant-config-invalid"]
    assert len(found) == 1 and found[0].message.startswith("vLLM refuses quantization_config")


@pytest.mark.parametrize("key", ["architectures", "model_type", "text_config.model_type", "text_config.hidden_act",
                                 "vision_config.hidden_act", "text_config.rope_parameters",
                                 "text_config.rope_parameters.rope_type",
                                 "text_config.rope_parameters.partial_rotary_factor", "vision_config.num_heads",
                                 "image_token_id", "tie_word_embeddings", "text_config.tie_word_embeddings",
                                 "text_config.rope_parameters.mrope_section", "text_config.rope_parameters.rope_theta",
                                 "text_config.rms_norm_eps", "text_config.max_position_embeddings"])
def test_any_json_value_in_a_rule_key_is_a_finding_never_a_crash(key):
    import copy

    from clef_format.fixtures.configs import tiny_config
    from clef_format.spec.model_spec import ConfigError, parse_config
    from clef_format.vllm_rules.config_rules import config_problems

    for value in (None, True, -1, 0, 1.5, "x", [], ["x"], [1], {}, {"a": 1}):
        raw = copy.deepcopy(tiny_config())
        *parents, leaf = key.split(".")
        node = raw
        for k in parents:
            node = node[k]
        node[leaf] = value
        try:
            cfg = parse_config(raw)
        except ConfigError:
            continue  # bad-config, reported by the reader
        for p in config_problems(raw, cfg):
            assert p.key and p.message and p.fix


def _tiny(**kw):
    """A private tiny config: tiny_config's nested dicts (rope_parameters) are shared between calls."""
    import copy

    from clef_format.fixtures.configs import tiny_config

    return copy.deepcopy(tiny_config(**kw))


def _problems(raw: dict) -> dict:
    """key -> (message, fix) of every config problem of ``raw`` (one per key in these cases)."""
    from clef_format.spec.model_spec import parse_config
    from clef_format.vllm_rules.config_rules import config_problems

    return {p.key: (p.message, p.fix) for p in config_problems(raw, parse_config(raw))}


def test_a_rope_type_only_one_version_builds_names_the_other_and_sets_default():
    raw = _tiny()
    raw["text_config"]["rope_parameters"]["rope_type"] = "xdrope"  # vLLM 0.28 only
    key = "text_config.rope_parameters.rope_type"
    message, fix = _problems(raw)[key]
    assert message == (f"{key} 'xdrope' is a RoPE type vLLM 0.33 (only 0.28) builds (ValueError: Unknown RoPE "
                       "scaling type)")
    assert fix == f'set "{key}": "default" in config.json'


def test_token_id_problems_say_when_the_id_is_transformers_default_and_how_to_fix():
    raw = _tiny()
    raw.pop("video_token_id", None)
    raw["vision_start_token_id"] = raw["image_token_id"]
    found = _problems(raw)
    message, fix = found["video_token_id"]
    assert message.startswith("video_token_id 248057 (absent: transformers' default 248057) is not a token id below "
                              "vocab_size 512")
    assert fix == "set video_token_id to the id the tokenizer gives that token (tokenizer.json added_tokens)"
    message, fix = found["vision_start_token_id"]
    assert message == (f"vision_start_token_id {raw['image_token_id']} is also image_token_id: the two special "
                       "tokens cannot share an id")
    assert fix == "set vision_start_token_id to the id the tokenizer gives that token (tokenizer.json added_tokens)"


def test_an_unknown_vision_activation_is_set_to_qwen_s():
    raw = _tiny()
    raw["vision_config"]["hidden_act"] = "gelu-x"
    assert _problems(raw)["vision_config.hidden_act"][1] == 'set "vision_config.hidden_act": "gelu_pytorch_tanh" in config.json'


def test_absent_vision_num_heads_reads_as_transformers_default_16():
    raw = _tiny()
    raw["vision_config"].pop("num_heads", None)
    raw["vision_config"]["hidden_size"] = 40  # not a multiple of 16
    message, _ = _problems(raw)["vision_config.num_heads"]
    assert message.startswith("vision_config.num_heads 16 does not divide vision_config.hidden_size 40")


def test_a_text_only_config_nested_in_text_config_is_read_there():
    """No vision_config but a text_config object: parse_config reads the text model there, so do the rules."""
    nested = _tiny()
    nested.pop("vision_config")
    nested["architectures"] = ["Qwen3_5ForCausalLM"]
    nested["model_type"] = "qwen3_5_text"
    nested["text_config"]["hidden_act"] = "gelu"
    assert list(_problems(nested)) == ["text_config.hidden_act"]


def test_a_text_only_config_with_the_multimodal_class_says_without_vision_config():
    raw = _tiny(multimodal=False)
    raw["architectures"] = ["Qwen3_5ForConditionalGeneration"]
    message, fix = _problems(raw)["architectures"]
    assert message.startswith("architectures[0] is 'Qwen3_5ForConditionalGeneration', but this config (without "
                              "vision_config) is served by Qwen3_5ForCausalLM: ")
    assert fix == 'set "architectures": ["Qwen3_5ForCausalLM"] in config.json'


def test_tied_embeddings_say_which_reader_drops_a_table():
    flat = _tiny(multimodal=False)
    flat["tie_word_embeddings"] = True
    assert _problems(flat)["tie_word_embeddings"][0].endswith(
        "(Clef's lm_head is untied): vLLM and transformers tie lm_head to embed_tokens, and one stored table is lost")
    top = _tiny()
    top["tie_word_embeddings"] = True
    message, fix = _problems(top)["tie_word_embeddings"]
    assert message.endswith("(Clef's lm_head is untied): transformers ties lm_head to embed_tokens and drops the "
                            "stored lm_head")
    assert fix == 'set "tie_word_embeddings": false in config.json'


@pytest.mark.parametrize("section, entry", [([1.0, 1, 0], "1.0 is not an integer"), ([1, True, 0], "true is not an integer"),
                                            ([3, -1, 0], "-1 is negative")])
def test_mrope_section_entries_name_the_entry_and_the_form_in_the_fix(section, entry):
    raw = _tiny()
    raw["text_config"]["rope_parameters"]["mrope_section"] = section
    key = "text_config.rope_parameters.mrope_section"
    message, fix = _problems(raw)[key]
    assert message.startswith(f"{key} is {json.dumps(section)}: its entry {entry}: vLLM's M-RoPE takes integer "
                              "counts >= 0")
    assert fix == f"set {key} to the export's sections (integers >= 0 summing to 2; Qwen3.5's split of 32 is [11, 11, 10])"
    raw["text_config"]["rope_parameters"]["mrope_section"] = [2, 0, 0]  # a 0 count is an empty split: accepted
    assert key not in _problems(raw)


def test_a_full_size_mrope_section_with_a_float_entry_gets_qwen_s_split():
    from clef_format.fixtures.configs import full_config

    raw = json.loads(json.dumps(full_config()))
    raw["text_config"]["rope_parameters"]["mrope_section"] = [11, 11.0, 10]
    key = "text_config.rope_parameters.mrope_section"
    assert _problems(raw)[key][1] == f'set "{key}": [11, 11, 10] in config.json'


def test_the_longest_rope_cache_is_torch_s_own() -> None:
    """MAX_ARANGE is where torch.arange(n, dtype=float) starts refusing (meta device: no memory involved)."""
    torch = pytest.importorskip("torch")
    from clef_format.vllm_rules.config_rules import MAX_ARANGE

    torch.arange(MAX_ARANGE, dtype=torch.float, device="meta")
    with pytest.raises(RuntimeError):
        torch.arange(MAX_ARANGE + 1, dtype=torch.float, device="meta")
