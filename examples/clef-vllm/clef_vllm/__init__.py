"""clef-vllm: an example vLLM serving plugin for split Clef checkpoints, built on clef-format's hooks.

vLLM finds it through the ``vllm.general_plugins`` entry point and calls ``register()`` once in
every process it starts (the front end, the engine core, each worker). ``register`` only tells
vLLM's model registry to build Qwen3.5 through this plugin's checked classes (``clef_vllm.model``);
nothing of vLLM or torch is imported here, so the front end stays light.

The plugin version is this package's installed version: it is what the start-up gate checks
against the checkpoint's ``requires_clef_vllm`` marker.
"""

from __future__ import annotations

from importlib.metadata import version

PLUGIN_VERSION = version("clef-vllm")

#: vLLM architecture name -> the plugin's class ("module:Class" keeps vLLM's import lazy)
ARCHITECTURES = {
    "Qwen3_5ForConditionalGeneration": "clef_vllm.model:ClefQwen3_5ForConditionalGeneration",
    "Qwen3_5ForCausalLM": "clef_vllm.model:ClefQwen3_5ForCausalLM",
}


def register() -> None:
    """Runs once in every vLLM process: replace vLLM's Qwen3.5 classes by the checked ones."""
    from vllm import ModelRegistry

    for arch, target in ARCHITECTURES.items():
        ModelRegistry.register_model(arch, target)
