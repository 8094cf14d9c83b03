"""The real-vLLM tier: collected only where vLLM imports (scripts/test-vllm.sh builds that env).

The main test run never collects these files (``collect_ignore_glob`` below), so a missing vLLM
is visible as "not collected" rather than as a wall of skips; run them with scripts/test-vllm.sh.
"""

from __future__ import annotations

import importlib.util
import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

_spec = importlib.util.find_spec("vllm")
# A namespace package (origin None) is this very directory seen from tests/, not vLLM.
if _spec is None or _spec.origin is None:
    collect_ignore_glob = ["test_*.py"]

import sys
from pathlib import Path

# tests/support/pattern_cases.py and the project itself (scripts/test-vllm.sh also sets PYTHONPATH).
for p in (Path(__file__).resolve().parents[2],):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
