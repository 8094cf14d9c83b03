"""Import path kept for serving plugins: the int8 gather kernel lives in ``clef_format.vllm.int8_gather``."""

from clef_format.vllm.int8_gather import (
                                          Backend,
                                          KernelConfig,
                                          default_config,
                                          gather_rows,
                                          gather_rows_shard,
                                          resolve_backend,
                                          triton_available,
)

__all__ = ["Backend", "KernelConfig", "default_config", "gather_rows", "gather_rows_shard", "resolve_backend",
           "triton_available"]
