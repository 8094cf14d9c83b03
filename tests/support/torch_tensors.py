"""The torch tensor of a fixture ``Tensor`` (same bits), for tests that mutate files with safetensors.torch."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from clef_format.fixtures.tensors import Tensor


def as_torch(t: Tensor) -> Any:
    """The torch tensor of ``t`` (same bits): BF16 and FP8 E4M3 viewed through their integer carriers."""
    views = {"BF16": (np.int16, torch.bfloat16), "F8_E4M3": (np.uint8, torch.float8_e4m3fn)}
    if t.dtype in views:
        carrier, dtype = views[t.dtype]
        return torch.from_numpy(np.array(t.data, copy=True).view(carrier)).view(dtype)
    return torch.from_numpy(np.array(t.data, copy=True))
