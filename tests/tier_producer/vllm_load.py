"""The oracle of the producer tier: what vLLM itself does with one checkpoint, on the CPU.

vLLM's own model class is built on the CPU device (``initialize_model``), its own ``load_weights``
runs over every tensor of the backbone files, then its own ``process_weights_after_loading``.
Every log record of level WARNING or above from vLLM's loggers and every Python warning is
captured. Whether each parameter was written is judged by clef_format's ``WriteTracker`` (each
parameter filled with a sentinel before loading; vLLM's own KV-cache scale defaults exempt).

The only things replaced are those with no CPU implementation in the CUDA wheel (``cpu_kernels``):
a scheme's GEMM kernel where vLLM finds none for this CPU (vLLM's own NVFP4 emulation kernel for
NVFP4), the static FP8 quantization op (plain torch, same values) and the conv1d weight pre-pack
(hidden: vLLM's own fallback). docs/VLLM.md lists them. Nothing of clef_format's rules is used.
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

from clef_format.vllm import WriteTracker
from clef_format.vllm_rules import matching as R
from tests.tier_vllm import hooks_support as hs
from tests.tier_vllm import oracle

VERSION = oracle.VERSION
UNQUANTIZED = "unquantized"
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")


@dataclass
class Outcome:
    """What vLLM did with a checkpoint. ``stage``: where it raised (config, build, load, process) or None."""

    stage: str | None = None
    error: str | None = None
    loaded: int = 0  # tensors vLLM's load_weights consumed
    unwritten: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    layers: dict[str, Any] = field(default_factory=dict)  # the per-layer view in the tool's terms
    stand_ins: dict[str, int] = field(default_factory=dict)  # kernel chooser -> layers given a stand-in

    @property
    def ok(self) -> bool:
        return self.stage is None and not self.unwritten and not self.warnings

    def summary(self) -> str:
        if self.stage is not None:
            return f"{self.stage} error: {self.error}"
        parts = []
        if self.unwritten:
            parts.append(f"{len(self.unwritten)} parameter(s) not written, e.g. {next(iter(self.unwritten.items()))}")
        parts += [f"warning: {w}" for w in self.warnings]
        return "; ".join(parts) or "loaded cleanly"


@contextlib.contextmanager
def captured() -> Iterator[list[str]]:
    """Every vLLM log record >= WARNING and every Python warning raised inside, as text.

    Records are taken in ``Logger.handle`` itself: vLLM (re)configures its loggers with ``dictConfig``
    while an engine config is made, which drops any handler added beforehand."""
    with contextlib.suppress(Exception):  # vLLM's warning_once remembers messages per process
        from vllm import logger as vlog

        for fn in vars(vlog).values():
            if hasattr(fn, "cache_clear"):
                fn.cache_clear()
    records: list[str] = []
    original = logging.Logger.handle

    def handle(self: logging.Logger, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING and record.name.split(".")[0] == "vllm":
            records.append(f"{record.name}: {record.getMessage()}")
        original(self, record)

    out: list[str] = []
    logging.Logger.handle = handle  # type: ignore[method-assign]
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield out
    finally:
        logging.Logger.handle = original  # type: ignore[method-assign]
    out.extend(records)
    out.extend(f"{w.category.__name__}: {w.message}" for w in caught)


def _label(module: torch.nn.Module) -> str | None:
    """The scheme vLLM built for a linear layer, in the tool's terms (None: not a quantizable layer)."""
    method = getattr(module, "quant_method", None)
    if method is None:
        return None
    name = type(method).__name__
    if name == "UnquantizedLinearMethod" or name == "UnquantizedEmbeddingMethod":
        return UNQUANTIZED
    scheme = getattr(module, "scheme", None)
    if scheme is None:
        return f"?{name}"
    cls = type(scheme).__name__
    if getattr(scheme, "use_a16", False) or cls == "CompressedTensorsW4A16Fp4":
        return R.NVFP4_W4A16
    return R.VLLM_SCHEME_CLASSES.get(cls, cls)


def layer_view(model: torch.nn.Module) -> dict[str, Any]:
    """``{"rows": {index: {group: label}}, "vision": label(s), "lm_head": label}`` as vLLM built them."""
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    rows: dict[int, dict[str, str]] = {}
    vision: set[str] = set()
    lm_head = None
    for name, module in model.named_modules():
        if isinstance(module, ParallelLMHead):
            lm_head = _label(module) or UNQUANTIZED
            continue
        if not isinstance(module, LinearBase):
            continue
        label = _label(module) or UNQUANTIZED
        if "visual" in name.split("."):
            vision.add(label)
            continue
        m = _LAYER.search(name)
        if m and not name.endswith("conv1d"):  # built without the quantization config: never offered
            rows.setdefault(int(m.group(1)), {})[m.group(2)] = label
    return {"rows": rows, "vision": sorted(vision), "lm_head": lm_head}


def _tensors(root: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for path in sorted(root.glob("*.safetensors")):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def load(root: Path) -> Outcome:
    """Build, load and post-process ``root`` with vLLM on the CPU; never raises for vLLM's own errors."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    out = Outcome()
    before = dict(STUBBED)
    with captured() as messages:
        stage = "config"
        try:
            cfg = hs.engine_config(root)
            hs.ensure_distributed(cfg)
            stage = "build"
            with cpu_kernels():
                model = hs.build_model(cfg)
                out.layers = layer_view(model)
                tracker = WriteTracker(model).arm()
                stage = "load"
                with set_current_vllm_config(cfg):
                    loaded = model.load_weights(_tensors(root))
                out.loaded = len(loaded or ())
                out.unwritten = tracker.unwritten()
                stage = "process"
                with set_current_vllm_config(cfg):
                    process_weights_after_loading(model, cfg.model_config, torch.device("cpu"))
            stage = None
        except Exception as e:  # vLLM's refusal, in whatever form it takes: the oracle's verdict
            out.stage, out.error = stage, f"{type(e).__name__}: {str(e)[:300]}"
    out.warnings = [m for m in messages if not _environment_noise(m)]
    out.stand_ins = {k: n - before.get(k, 0) for k, n in STUBBED.items() if n != before.get(k, 0)}
    return out


#: Messages about this machine, not about the checkpoint (set by ``calibrate_noise`` from a BF16 load).
NOISE: set[str] = set()


def _environment_noise(message: str) -> bool:
    return message in NOISE


def calibrate_noise(root: Path) -> Outcome:
    """Load the unquantized output: whatever vLLM says about it is about the machine; remember it."""
    NOISE.clear()
    result = load(root)
    NOISE.update(result.warnings)
    result.warnings = []
    return result


class NoCpuKernel:
    """Stands in for a GEMM kernel that has no implementation in the CUDA wheel on this CPU: the layer's
    weights stay as vLLM loaded and post-processed them; running it (never done here) raises."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.config = args[0] if args else kwargs.get("c") or kwargs.get("config")

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        return None

    def apply_weights(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("no CPU implementation of this GEMM kernel")

    apply = apply_weights


#: vLLM's functions that pick a GEMM kernel for a scheme (0.28 and 0.33 names); each is wrapped where a
#: scheme module imported it: when vLLM finds no kernel for this CPU, NoCpuKernel stands in.
KERNEL_CHOOSERS = ("init_fp8_linear_kernel", "init_nvfp4_linear_kernel", "init_int8_linear_kernel",
                   "init_wfp8_a16_linear_kernel", "choose_mp_linear_kernel", "choose_scaled_mm_linear_kernel",
                   "init_mxfp4_linear_kernel", "init_mxfp8_linear_kernel")
#: What vLLM raises when no kernel fits the platform (and only that is replaced).
NO_KERNEL = re.compile(r"Failed to find a kernel|kernel .*not supported|not supported on|requires CUDA|No module named|_C", re.I)
STUBBED: dict[str, int] = {}


def _vllm_nvfp4_emulation() -> Any:
    """vLLM's own pure-torch NVFP4 kernel (its real weight processing), where this vLLM has one."""
    try:
        from vllm.model_executor.kernels.linear import NvFp4LinearLayerConfig
        from vllm.model_executor.kernels.linear.nvfp4.emulation import EmulationNvFp4LinearKernel
    except ImportError:
        return None
    return EmulationNvFp4LinearKernel(NvFp4LinearLayerConfig())


def _has_vllm_c() -> bool:
    import importlib.util

    try:
        import vllm._C  # noqa: F401
    except ImportError:
        return False
    return importlib.util.find_spec("vllm._C") is not None


def _needs_missing_ops(kernel: Any) -> bool:
    """vLLM's CPU kernels call ``torch.ops._C`` ops, which the CUDA wheel does not have on a CPU."""
    cls = kernel if isinstance(kernel, type) else type(kernel)
    return cls.__name__.startswith("CPU") and not _has_vllm_c()


_FP8_QUANT: list[Any] = []


def _static_fp8_quant_stand_in() -> None:
    """``_C::static_scaled_fp8_quant`` (per-tensor static FP8 quantization, which vLLM runs in
    ``process_weights_after_loading`` to requantize fused shards to one scale) in plain torch, defined
    only where the wheel has no such op: the same values, so vLLM's own weight processing runs."""
    if _FP8_QUANT or hasattr(torch.ops._C, "static_scaled_fp8_quant"):
        return
    lib = torch.library.Library("_C", "FRAGMENT")
    lib.define("static_scaled_fp8_quant(Tensor(a!) result, Tensor input, Tensor scale, SymInt[]? group_shape=None) -> ()")

    def impl(result: torch.Tensor, input: torch.Tensor, scale: torch.Tensor, group_shape: Any = None) -> None:
        info = torch.finfo(result.dtype)
        result.copy_((input.float() / scale.float()).clamp(info.min, info.max).to(result.dtype))

    lib.impl("static_scaled_fp8_quant", impl, "CPU")
    _FP8_QUANT.append(lib)  # keep the library (and the op) alive


def _wrap(fn: Any) -> Any:
    returns_class = fn.__name__.startswith("choose_")

    def stand_in(*args: Any, **kwargs: Any) -> Any:
        STUBBED[fn.__name__] = STUBBED.get(fn.__name__, 0) + 1
        if fn.__name__ == "init_nvfp4_linear_kernel":
            emulation = _vllm_nvfp4_emulation()
            if emulation is not None:
                return emulation
        return NoCpuKernel if returns_class else NoCpuKernel(*args, **kwargs)

    def chooser(*args: Any, **kwargs: Any) -> Any:
        try:
            kernel = fn(*args, **kwargs)
        except (ValueError, RuntimeError, AttributeError, NotImplementedError, AssertionError) as e:
            if not NO_KERNEL.search(str(e)):
                raise
            return stand_in(*args, **kwargs)
        return stand_in(*args, **kwargs) if _needs_missing_ops(kernel) else kernel

    chooser.__wrapped__ = fn  # type: ignore[attr-defined]
    return chooser


@contextlib.contextmanager
def cpu_kernels() -> Iterator[None]:
    """Stand-ins for what the CUDA wheel has no CPU implementation of, and nothing else:
    the GEMM kernel choosers above (only when vLLM finds no kernel), and the CPU platform's
    conv1d weight pre-pack, whose Python wrapper exists while ``torch.ops._C`` lacks the op
    (without the wrapper vLLM keeps the weight unpacked, its own fallback)."""
    import importlib
    import pkgutil

    from vllm import _custom_ops as ops
    from vllm.model_executor.layers.quantization.compressed_tensors import schemes

    patched: list[tuple[Any, str, Any]] = []
    for info in pkgutil.iter_modules(schemes.__path__):
        mod = importlib.import_module(f"{schemes.__name__}.{info.name}")
        for name in KERNEL_CHOOSERS:
            fn = getattr(mod, name, None)
            if fn is not None and not hasattr(fn, "__wrapped__"):
                patched.append((mod, name, fn))
                setattr(mod, name, _wrap(fn))
    _static_fp8_quant_stand_in()
    pack = getattr(ops, "causal_conv1d_weight_pack", None)
    has_op = hasattr(torch.ops._C, "causal_conv1d_weight_pack") if hasattr(torch.ops, "_C") else False
    if pack is not None and not has_op:
        delattr(ops, "causal_conv1d_weight_pack")
    try:
        yield
    finally:
        for mod, name, fn in patched:
            setattr(mod, name, fn)
        if pack is not None and not has_op:
            ops.causal_conv1d_weight_pack = pack
