"""Quantize tiny random-weight Qwen3.5 models with the real llm-compressor, then dress each output as
a Clef release (layout 1). Run in the producer env (scripts/producer-env.sh) by scripts/producer-outputs.sh:

    python tests/tier_producer/generate.py OUT_DIR [NAME ...]

For every output NAME it writes ``OUT_DIR/NAME/`` (the Clef checkpoint, layout 1) and
``OUT_DIR/NAME.json`` (what was asked of the tool, the versions, or the error when the tool could
not produce it on CPU). Models come from the frozen tiny config (clef_format/fixtures/templates/),
random weights from a fixed seed; calibration data, where a scheme needs it, is random token ids.
Nothing of clef_format's rules is used: only the fixture builders that write the head, the
tokenizer files and the rest of what a release ships beside the backbone.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

from clef_format.fixtures.builders import add_release_parts
from clef_format.fixtures.configs import tiny_config
from clef_format.fixtures.quant import KEEP_BF16, layer_range_regex

NUM_LAYERS = 8
SPLIT = 4  # the mixed recipe: layers 0 .. SPLIT-1 FP8 W8A8, the rest NVFP4 W4A4
PROJ = r"(self_attn\.(q|k|v|o)_proj|linear_attn\.(in_proj_qkv|in_proj_z|out_proj)|mlp\.(gate|up|down)_proj)"


def hf_anchored(first: int, last: int) -> str:
    """A layer range written against the Hugging Face module names, anchored at the start."""
    alts = "|".join(str(i) for i in range(first, last + 1))
    return rf"re:^model\.language_model\.layers\.({alts})\.{PROJ}$"


def _fp8_weight_only() -> dict[str, Any]:
    return {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "symmetric": True,
                                                           "strategy": "channel", "dynamic": False}}}


def _mixed(first: str, rest: str) -> dict[str, Any]:
    from compressed_tensors.quantization import preset_name_to_scheme

    return {"group_0": preset_name_to_scheme("FP8_DYNAMIC", [first]),
            "group_1": preset_name_to_scheme("NVFP4", [rest])}


def _preset(name: str, group_size: int) -> dict[str, Any]:
    """A preset scheme of compressed-tensors with a group size that divides the tiny widths (64, 128)."""
    from compressed_tensors.quantization import preset_name_to_scheme

    scheme = preset_name_to_scheme(name, ["Linear"])
    scheme.weights = scheme.weights.model_copy(update={"group_size": group_size})
    return {"group_0": scheme}


KV_FP8 = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True}

#: name -> (QuantizationModifier keyword arguments, needs calibration data, save_pretrained extras).
#: "bf16" is the unquantized model itself: the oracle learns from it what vLLM says about the machine.
OUTPUTS: dict[str, tuple[Callable[[], dict[str, Any]] | None, bool, dict[str, Any]]] = {
    "bf16": (None, False, {}),
    "fp8-dynamic": (lambda: {"scheme": "FP8_DYNAMIC"}, False, {}),
    "fp8-static": (lambda: {"scheme": "FP8"}, True, {}),
    "fp8-block": (lambda: {"scheme": "FP8_BLOCK"}, False, {}),
    "fp8-weight-only": (lambda: {"config_groups": _fp8_weight_only()}, False, {}),
    "nvfp4": (lambda: {"scheme": "NVFP4"}, True, {}),
    "nvfp4a16": (lambda: {"scheme": "NVFP4A16"}, False, {}),
    "w4a16-g32": (lambda: {"config_groups": _preset("W4A16", 32)}, False, {}),
    "w4a16-asym-g32": (lambda: {"config_groups": _preset("W4A16_ASYM", 32)}, False, {}),
    "w8a16-g32": (lambda: {"config_groups": _preset("W8A16", 32)}, False, {}),
    "w8a8-int8": (lambda: {"scheme": "W8A8"}, False, {}),
    # head_dim 32: vLLM 0.28's CPU attention builds an FP8 KV cache only for head sizes divisible by 32
    "fp8-dynamic-kv-fp8-hd32": (lambda: {"scheme": "FP8_DYNAMIC", "kv_cache_scheme": dict(KV_FP8)}, True, {}),
    "mixed-vllm-named": (lambda: {"config_groups": _mixed(layer_range_regex(0, SPLIT - 1),
                                                          layer_range_regex(SPLIT, NUM_LAYERS - 1))}, True, {}),
    "mixed-hf-anchored": (lambda: {"config_groups": _mixed(hf_anchored(0, SPLIT - 1),
                                                           hf_anchored(SPLIT, NUM_LAYERS - 1))}, True, {}),
    "fp8-dynamic-sharded": (lambda: {"scheme": "FP8_DYNAMIC"}, False, {"max_shard_size": "200KB"}),
}


#: Outputs made from a variant of the tiny config: name suffix -> text_config changes.
VARIANTS = {"-hd32": {"head_dim": 32}}


def variant_of(name: str) -> str:
    return next((v for v in VARIANTS if name.endswith(v)), "")


def tiny_model(seed: int = 0, variant: str = "") -> Any:
    """A random-weight Qwen3_5ForConditionalGeneration from the frozen tiny config, in bfloat16."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    cfg = tiny_config(NUM_LAYERS, multimodal=True)
    cfg["text_config"].update(VARIANTS.get(variant, {}))
    cfg.pop("architectures", None)
    cfg.pop("model_type", None)
    torch.manual_seed(seed)
    config = Qwen3_5Config(**cfg)
    config.architectures = ["Qwen3_5ForConditionalGeneration"]
    return Qwen3_5ForConditionalGeneration(config).to(torch.bfloat16).eval()


def tokenizer(vocab: int) -> Any:
    """A word-level tokenizer over the tiny vocabulary: llm-compressor wants a processor beside a dataset."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t1")


def calibration(vocab: int, samples: int = 8, length: int = 32) -> Any:
    """Random token ids (the tool only needs activations to observe)."""
    from datasets import Dataset

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab - 16, (samples, length), generator=g).tolist()
    return Dataset.from_dict({"input_ids": ids, "attention_mask": [[1] * length for _ in ids]})


def save_base(path: Path, variant: str = "") -> Path:
    """The unquantized tiny model, saved as a model folder (llm-compressor starts from a folder)."""
    path = path.with_name(path.name + variant)
    if not (path / "config.json").exists():
        tiny_model(variant=variant).save_pretrained(path)
    return path


def produce(name: str, base: Path, out: Path) -> dict[str, Any]:
    """Quantize the tiny model in ``base`` with llm-compressor and save it compressed into ``out``."""
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from transformers import Qwen3_5ForConditionalGeneration

    kwargs, calibrate, save_extra = OUTPUTS[name]
    base = save_base(base, variant_of(name))
    if kwargs is None:
        shutil.copytree(base, out)
        return {"recipe": None, "calibrated": False}
    model = Qwen3_5ForConditionalGeneration.from_pretrained(base, dtype=torch.bfloat16)
    modifier = QuantizationModifier(targets="Linear", ignore=list(KEEP_BF16), **kwargs())
    args: dict[str, Any] = {"model": model, "recipe": modifier}
    if calibrate:
        vocab = model.config.text_config.vocab_size
        args.update(dataset=calibration(vocab), processor=tokenizer(vocab), num_calibration_samples=8,
                    max_seq_length=32)
    model = oneshot(**args)
    model.save_pretrained(out, save_compressed=True, **save_extra)
    return {"recipe": str(modifier), "calibrated": calibrate}


def main(argv: list[str]) -> int:
    import compressed_tensors
    import llmcompressor
    import transformers

    root = Path(argv[0])
    names = argv[1:] or list(OUTPUTS)
    root.mkdir(parents=True, exist_ok=True)
    base = root / ".base-model"
    for name in names:
        out = root / name
        shutil.rmtree(out, ignore_errors=True)
        info: dict[str, Any] = {"name": name, "llmcompressor": llmcompressor.__version__,
                                "compressed_tensors": compressed_tensors.__version__,
                                "transformers": transformers.__version__, "torch": torch.__version__}
        start = time.monotonic()
        try:
            info.update(produce(name, base, out))
            info["error"] = None
        except Exception as e:  # the tool's own failure on CPU: recorded, the output is absent
            shutil.rmtree(out, ignore_errors=True)
            info["error"] = f"{type(e).__name__}: {e}"
            info["traceback"] = traceback.format_exc()[-4000:]
        if info["error"] is None:  # our own assembly: a failure here fails the build (never cached half-made)
            add_release_parts(out, layout="layout-1")
        info["seconds"] = round(time.monotonic() - start, 1)
        (root / f"{name}.json").write_text(json.dumps(info, indent=2) + "\n")
        print(f"producer: {name}: {'failed: ' + info['error'] if info['error'] else 'ok'} ({info['seconds']} s)",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
