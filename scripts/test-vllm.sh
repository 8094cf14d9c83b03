#!/usr/bin/env bash
# Run the real-vLLM oracle tier (tests/tier_vllm) in the cached env from scripts/vllm-env.sh.
#   scripts/test-vllm.sh [--vllm 0.28|0.33] [pytest args...]
# The version is --vllm, else $CLEF_VLLM_VERSION, else 0.28 (the version the serving plugin pins);
# each version has its own requirements/vllm-<version>.txt and its own cached env.
# The project is put on PYTHONPATH, not installed, so the cached env stays valid for any clone.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
if [ "${1:-}" = "--vllm" ]; then
  [ $# -ge 2 ] || { echo "test-vllm: --vllm needs a version (0.28, 0.33)" >&2; exit 2; }
  export CLEF_VLLM_VERSION="$2"
  shift 2
fi
export CLEF_VLLM_VERSION="${CLEF_VLLM_VERSION:-0.28}"
env="$("$here/scripts/vllm-env.sh")"
cd "$here"
echo "test-vllm: vLLM $CLEF_VLLM_VERSION tier in $env" >&2
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" VLLM_TARGET_DEVICE=cpu
exec "$env/bin/python" -m pytest -p no:cacheprovider tests/tier_vllm "$@"
