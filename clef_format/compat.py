"""Import path kept for serving plugins: the rules live in ``clef_format.spec.compat``, the serving
gate in ``clef_format.vllm.gate`` and the exception in ``clef_format.errors``."""

from clef_format.errors import IncompatibleError
from clef_format.spec.compat import PLUGIN, SERVED_BY, check_pair, expects_int8_tables
from clef_format.vllm.gate import CheckpointSource, check_checkpoint

__all__ = ["PLUGIN", "SERVED_BY", "CheckpointSource", "IncompatibleError", "check_checkpoint", "check_pair",
           "expects_int8_tables"]
