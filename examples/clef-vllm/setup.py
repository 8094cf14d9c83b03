"""The version is a build-time setting, so the same source can be installed as 0.1.x or 0.2.x."""

import os
import re

from setuptools import setup

version = os.environ.get("CLEF_VLLM_PLUGIN_VERSION", "0.2.0")
if not re.fullmatch(r"\d+\.\d+\.\d+", version):
    raise SystemExit(f"CLEF_VLLM_PLUGIN_VERSION must look like 0.2.1, got {version!r}")
setup(version=version)
