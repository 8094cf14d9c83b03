#!/usr/bin/env bash
# Run the real-vLLM oracle tier (tests/tier_vllm) in the cached env from scripts/vllm-env.sh.
# The project is put on PYTHONPATH, not installed, so the cached env stays valid for any clone.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
env="$("$here/scripts/vllm-env.sh")"
cd "$here"
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" VLLM_TARGET_DEVICE=cpu
exec "$env/bin/python" -m pytest -p no:cacheprovider tests/tier_vllm "$@"
