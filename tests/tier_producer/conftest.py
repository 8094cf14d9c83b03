"""The producer tier: collected only in a real-vLLM env with the producer outputs built.

scripts/test-producer.sh builds the outputs (scripts/producer-outputs.sh) and runs these files in
the vLLM env of the version asked for; the main run never collects them.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

_spec = importlib.util.find_spec("vllm")
if _spec is None or _spec.origin is None or not os.environ.get("CLEF_PRODUCER_OUTPUTS"):
    collect_ignore_glob = ["test_*.py"]

for p in (Path(__file__).resolve().parents[2],):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
