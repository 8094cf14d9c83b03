"""Build vLLM 0.28's real Qwen3.5 text model on CPU and load it through vLLM's own loader.

Everything here is the real vLLM: ``EngineArgs`` -> ``VllmConfig``, ``initialize_model``,
``get_model_loader(load_config).load_weights``. Two things are set up because this is a CPU-only
machine with the CUDA wheel (../shared/reference/vllm-integration.md, "Running vLLM on a machine
without a GPU"): ``VLLM_TARGET_DEVICE=cpu`` and a ``SiluAndMul`` constructor that tolerates the
missing ``torch.ops._C.silu_and_mul`` (only its construction looks the op up; nothing here runs
the forward pass of the MLP).
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch  # noqa: E402


def tolerate_missing_silu_op() -> None:
    """Let ``SiluAndMul()`` be built when vllm._C is absent (the CPU-only machine)."""
    from vllm.model_executor.layers import activation

    cls = activation.SiluAndMul
    if getattr(cls, "_clef_tolerant", False):
        return
    original = cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            original(self, *args, **kwargs)
        except AttributeError:  # torch.ops._C.silu_and_mul: looked up after CustomOp.__init__ ran
            self.op = None

    cls.__init__ = __init__  # type: ignore[method-assign]
    cls._clef_tolerant = True  # type: ignore[attr-defined]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def engine_config(model_dir: str | Path, tp: int = 1, **extra: Any) -> Any:
    """The ``VllmConfig`` vLLM makes for this checkpoint: safetensors, bf16, eager, no tokenizer
    (``extra``: more EngineArgs, e.g. ``model_loader_extra_config``)."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=str(model_dir), load_format="safetensors", dtype="bfloat16", enforce_eager=True,
                      skip_tokenizer_init=True, tensor_parallel_size=tp, max_model_len=256, **extra)
    return args.create_engine_config()


def ensure_distributed(vllm_config: Any, world_size: int = 1, rank: int = 0, init_method: str | None = None) -> None:
    """A gloo process group and vLLM's model-parallel groups (once per process)."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    if ps.model_parallel_is_initialized():
        return
    method = init_method or f"tcp://127.0.0.1:{free_port()}"
    with set_current_vllm_config(vllm_config):
        ps.init_distributed_environment(world_size=world_size, rank=rank, local_rank=rank,
                                        distributed_init_method=method, backend="gloo")
        ps.initialize_model_parallel(world_size, 1)


def build_model(vllm_config: Any) -> torch.nn.Module:
    """vLLM's model class for the checkpoint, built on the CPU in bfloat16 (weights unset)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    tolerate_missing_silu_op()
    with set_current_vllm_config(vllm_config), set_default_torch_dtype(torch.bfloat16), torch.device("cpu"):
        return initialize_model(vllm_config=vllm_config, model_config=vllm_config.model_config)


def vllm_load(vllm_config: Any, model: torch.nn.Module) -> None:
    """vLLM's own loader, unchanged: what a server without the hooks does."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model_loader

    with set_current_vllm_config(vllm_config):
        get_model_loader(vllm_config.load_config).load_weights(model, vllm_config.model_config)


@contextlib.contextmanager
def load_weights_replaced(model: torch.nn.Module, hook: Callable[[Callable[[Iterable[Any]], Any]], Any]) -> Iterator[None]:
    """Route vLLM's ``model.load_weights`` through ``hook``, as a plugin's model subclass does.

    ``hook(original_load_weights)`` returns what ``load_weights`` returns; vLLM's own iterator
    (passed by its loader) is dropped in favour of the hooks' checked one.
    """
    original = model.load_weights

    def load_weights(weights: Iterable[Any]) -> Any:
        return hook(original)

    model.load_weights = load_weights  # type: ignore[method-assign]
    try:
        yield
    finally:
        del model.load_weights
