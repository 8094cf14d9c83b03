"""Ask the real vLLM what it builds for every layer, two ways.

``direct``: vLLM's own ``CompressedTensorsConfig.from_config`` + ``configure_quant_config`` (the
function vLLM's ``initialize_model`` calls: it maps targets with ``get_unstacked_mapper()`` in 0.28 and
``get_rename_mapper()`` from 0.29, and sets ``packed_modules_mapping``) + ``get_scheme_dict`` /
``_get_scheme_from_parts`` per layer name. ``construct``: vLLM builds the whole tiny model on the meta device while
``get_scheme_dict`` is wrapped to record every layer it is asked about; the recorded scheme dicts
are then turned into scheme classes by the same vLLM code. Nothing of clef_format is used here.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import tempfile
from dataclasses import dataclass
from typing import Any

import torch

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import vllm  # noqa: E402
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (  # noqa: E402
    CompressedTensorsConfig,
)
from vllm.model_executor.model_loader.utils import configure_quant_config  # noqa: E402
from vllm.model_executor.models.interfaces import SupportsQuant  # noqa: E402
from vllm.model_executor.models.qwen3_5 import (  # noqa: E402
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
)

CLASSES = {"Qwen3_5ForConditionalGeneration": Qwen3_5ForConditionalGeneration, "Qwen3_5ForCausalLM": Qwen3_5ForCausalLM}
#: "0.28", "0.33": the version of the vLLM this env runs.
VERSION = ".".join(vllm.__version__.split(".")[:2])
# configure_quant_config maps the config only for classes without SupportsQuant (SupportsQuant
# classes do it in __new__); both Qwen3.5 classes are such classes in 0.28 and 0.33.
assert not any(issubclass(c, SupportsQuant) for c in CLASSES.values()), "Qwen3.5 became SupportsQuant: update direct()"

#: What vLLM (and compressed-tensors' validation inside it) raises when it refuses a quantization
#: config as a whole: pydantic's ValidationError and vLLM's own ValueError (e.g. 0.30+ actorder),
#: ``assert`` (float weights without input activations), DeprecationWarning (sparsity with targets),
#: NotImplementedError (QuantizationArgs infers no zp dtype for a float type outside 4/8 bits).
#: Anything else (AttributeError, TypeError, KeyError ...) is a broken oracle or a vLLM change:
#: it propagates and fails the test.
REFUSALS: tuple[type[BaseException], ...] = (ValueError, AssertionError, DeprecationWarning, NotImplementedError)


@dataclass(frozen=True)
class VllmDecision:
    scheme_class: str | None  # e.g. CompressedTensorsW8A8Fp8; None = unquantized
    target: str | None  # the target_scheme_map key that decided it
    error_kind: str | None  # exception class name vLLM raised
    module_class: str | None = None  # recorded in construct mode


def mapped_config(config: dict[str, Any]) -> tuple[CompressedTensorsConfig, type]:
    """The quantization config as the model sees it: ``from_config`` then vLLM's ``configure_quant_config``."""
    cls = CLASSES[config["architectures"][0]]
    qc = CompressedTensorsConfig.from_config(copy.deepcopy(config["quantization_config"]))
    configure_quant_config(qc, cls)
    return qc, cls


def refusal(config: dict[str, Any]) -> str | None:
    """The exception class with which vLLM refuses the config as a whole, or None when it accepts it.

    Only ``from_config`` may refuse; an exception outside REFUSALS, or one raised by the mapping step,
    propagates."""
    try:
        CompressedTensorsConfig.from_config(copy.deepcopy(config["quantization_config"]))
    except REFUSALS as e:
        return type(e).__name__
    return None


def _target_of(qc: CompressedTensorsConfig, scheme_dict: Any) -> str | None:
    return next((k for k, v in qc.target_scheme_map.items() if v is scheme_dict), None)


def _record_kwargs(self: Any, *args: Any, **kwargs: Any) -> None:
    self.kwargs = kwargs


_STUBS: dict[str, tuple[type, type]] = {}  # scheme class name -> (vLLM's class, its stub)
_MODULE_CLASSES: dict[str, type] = {}


@contextlib.contextmanager
def _stub_scheme_constructors():
    """Replace only the *constructors* of vLLM's scheme classes (they pick GPU kernels) with stubs of
    the same name, so ``_get_scheme_from_parts``' real decision logic runs on a CPU-only machine."""
    from vllm.model_executor.layers.quantization.compressed_tensors import compressed_tensors as ct
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes import CompressedTensorsScheme

    if not _STUBS:
        for n, v in vars(ct).items():
            if isinstance(v, type) and issubclass(v, CompressedTensorsScheme) and v is not CompressedTensorsScheme:
                _STUBS[n] = (v, type(n, (v,), {"__init__": _record_kwargs}))
    for n, (_, stub) in _STUBS.items():
        setattr(ct, n, stub)
    try:
        yield
    finally:
        for n, (real, _) in _STUBS.items():
            setattr(ct, n, real)


def scheme_from_dict(qc: CompressedTensorsConfig, scheme_dict: Any, name: str, is_lm_head: bool) -> VllmDecision:
    """``get_scheme`` after ``get_scheme_dict``, as ``get_quant_method`` does (lm_head: ValueError -> None)."""
    target = _target_of(qc, scheme_dict) if scheme_dict else None
    if not scheme_dict or scheme_dict.get("weights") is None:
        return VllmDecision(None, target, None)
    try:
        with _stub_scheme_constructors():  # re-entrant: direct() already holds it
            scheme = qc._get_scheme_from_parts(
                weight_quant=scheme_dict.get("weights"), input_quant=scheme_dict.get("input_activations"),
                output_quant=scheme_dict.get("output_activations"), format=scheme_dict.get("format"), layer_name=name)
    except ValueError as e:
        if is_lm_head:
            return VllmDecision(None, target, None)
        return VllmDecision(None, target, type(e).__name__)
    except NotImplementedError as e:
        return VllmDecision(None, target, type(e).__name__)
    except AttributeError as e:
        # vLLM's own crash, not the oracle's: a predicate of _get_scheme_from_parts reads
        # input_quant.num_bits of weight-only float weights it did not claim (both versions).
        if not _raised_in_scheme_predicate(e):
            raise
        return VllmDecision(None, target, type(e).__name__)
    a16 = "+a16" if getattr(scheme, "kwargs", {}).get("use_a16") else ""  # NVFP4 weights, BF16 activations
    return VllmDecision(type(scheme).__name__ + a16, target, None)


def _raised_in_scheme_predicate(e: BaseException) -> bool:
    """Whether ``e`` was raised in a ``CompressedTensorsConfig._is_*`` predicate on a None argument."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    code = tb.tb_frame.f_code
    return (code.co_filename.endswith("compressed_tensors/compressed_tensors.py") and code.co_name.startswith("_is_")
            and "'NoneType' object has no attribute" in str(e))


def direct(config: dict[str, Any], layers: list[tuple[str, str]]) -> dict[str, VllmDecision]:
    """vLLM's decision per (layer name, layer class name) from its matching functions alone."""
    qc, _ = mapped_config(config)
    out: dict[str, VllmDecision] = {}
    for name, cls_name in layers:
        if cls_name not in _MODULE_CLASSES:  # a module whose class has vLLM's class name
            _MODULE_CLASSES[cls_name] = type(cls_name, (torch.nn.Module,), {})
        module = _MODULE_CLASSES[cls_name]()
        try:
            sd = qc.get_scheme_dict(module, name)
        except ValueError as e:  # vLLM's refusal of a partly ignored fused layer
            out[name] = VllmDecision(None, None, type(e).__name__)
            continue
        out[name] = scheme_from_dict(qc, sd, name, cls_name == "ParallelLMHead")
    return out


@contextlib.contextmanager
def _tolerate_missing_c_ops():
    """vLLM 0.28 on CPU: SiluAndMul looks up torch.ops._C.silu_and_mul at construction (test-only patch)."""
    from vllm.model_executor.layers import activation

    original = activation.SiluAndMul.__init__

    def init(self, *args, **kwargs):
        try:
            original(self, *args, **kwargs)
        except AttributeError as e:  # only the missing CUDA op; anything else is vLLM's own failure
            if "silu_and_mul" not in str(e) and "_C" not in str(e):
                raise
            self.op = None

    activation.SiluAndMul.__init__ = init
    try:
        yield
    finally:
        activation.SiluAndMul.__init__ = original


def construct(config: dict[str, Any]) -> dict[str, VllmDecision]:
    """Let vLLM build the model on the meta device and record what each layer resolves to."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed.parallel_state import model_parallel_is_initialized
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import initialize_model

    recorded: list[tuple[str, str, Any, str | None]] = []
    original = CompressedTensorsConfig.get_scheme_dict

    def spy(self, layer, layer_name=None):
        try:
            sd = original(self, layer, layer_name)
            recorded.append((layer_name, type(layer).__name__, sd, None, self))
        except ValueError as e:
            recorded.append((layer_name, type(layer).__name__, None, type(e).__name__, self))
        return None

    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(config, f)
        vllm_config = EngineArgs(model=d, load_format="dummy", enforce_eager=True, skip_tokenizer_init=True,
                                 dtype="bfloat16", max_model_len=256).create_engine_config()
        CompressedTensorsConfig.get_scheme_dict = spy
        try:
            with set_current_vllm_config(vllm_config), _tolerate_missing_c_ops():
                if not torch.distributed.is_initialized():
                    init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                                 distributed_init_method=f"file://{d}/dist", backend="gloo")
                if not model_parallel_is_initialized():
                    initialize_model_parallel(1, 1)
                with torch.device("meta"):
                    initialize_model(vllm_config=vllm_config)
        finally:
            CompressedTensorsConfig.get_scheme_dict = original
    out: dict[str, VllmDecision] = {}
    for name, cls_name, sd, err, qc in recorded:
        if err is not None:
            out[name] = VllmDecision(None, None, err, cls_name)
        else:
            dec = scheme_from_dict(qc, sd, name, cls_name == "ParallelLMHead")
            out[name] = VllmDecision(dec.scheme_class, dec.target, dec.error_kind, cls_name)
    return out
