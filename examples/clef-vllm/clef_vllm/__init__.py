"""clef-vllm: an example vLLM serving plugin for split Clef checkpoints, built on clef-format's hooks.

vLLM finds it through the ``vllm.general_plugins`` entry point and calls ``register()`` once in
every process it starts (the front end, the engine core, each worker). ``register`` only tells
vLLM's model registry to build Qwen3.5 through this plugin's checked classes (``clef_vllm.model``);
nothing of vLLM or torch is imported here, so the front end stays light.

The plugin version is this package's installed version: it is what the start-up gate checks
against the checkpoint's ``requires_clef_vllm`` marker. A build made with
``CLEF_VLLM_UNGATED=serve-what-the-gate-refuses`` (setup.py) is installed as ``X.Y.Z+ungated``:
that build logs the gate's refusals and serves anyway (``GATED`` is False), for the engine tier's
differential only; every process it runs in says so in its log.
"""

from __future__ import annotations

from importlib.metadata import version

_INSTALLED = version("clef-vllm")
#: the version the gate checks the marker against (the public part: ``0.2.1`` of ``0.2.1+ungated``)
PLUGIN_VERSION, _, _LOCAL = _INSTALLED.partition("+")
#: False only for the ungated build (setup.py): refusals are logged and the checkpoint is served
GATED = _LOCAL != "ungated"

#: vLLM architecture name -> the plugin's class ("module:Class" keeps vLLM's import lazy)
ARCHITECTURES = {
    "Qwen3_5ForConditionalGeneration": "clef_vllm.model:ClefQwen3_5ForConditionalGeneration",
    "Qwen3_5ForCausalLM": "clef_vllm.model:ClefQwen3_5ForCausalLM",
}


def register() -> None:
    """Runs once in every vLLM process: replace vLLM's Qwen3.5 classes by the checked ones."""
    from vllm import ModelRegistry

    if not GATED:
        from vllm.logger import init_logger

        init_logger(__name__).warning(
            "clef-vllm %s is the UNGATED build: it logs the start-up gate's refusals and serves the checkpoint "
            "anyway. It exists to test what the engine does with a refused checkpoint; never serve with it.",
            _INSTALLED)
    for arch, target in ARCHITECTURES.items():
        ModelRegistry.register_model(arch, target)
