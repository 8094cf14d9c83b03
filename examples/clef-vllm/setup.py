"""Build-time settings, so the same source can be installed as 0.1.x or 0.2.x, or as the ungated build.

``CLEF_VLLM_PLUGIN_VERSION``: the plugin version (0.2.0 by default).

``CLEF_VLLM_UNGATED``: the engine tier's differential build, never for serving. Only the exact value
``serve-what-the-gate-refuses`` is accepted (any other value stops the build): the version gets
the local label ``+ungated`` (``pip list`` shows ``clef-vllm 0.2.1+ungated``, and no index ever
offers it), and the installed plugin then logs each refusal of the gate as a warning and serves
anyway, so that the engine, not the gate, shows what the checkpoint does.
"""

import os
import re

from setuptools import setup

UNGATED = "serve-what-the-gate-refuses"

version = os.environ.get("CLEF_VLLM_PLUGIN_VERSION", "0.2.0")
if not re.fullmatch(r"\d+\.\d+\.\d+", version):
    raise SystemExit(f"CLEF_VLLM_PLUGIN_VERSION must look like 0.2.1, got {version!r}")
ungated = os.environ.get("CLEF_VLLM_UNGATED")
if ungated is not None:
    if ungated != UNGATED:
        raise SystemExit(f"CLEF_VLLM_UNGATED must be unset or exactly {UNGATED!r}, got {ungated!r}")
    version += "+ungated"
setup(version=version)
