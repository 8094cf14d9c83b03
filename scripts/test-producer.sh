#!/usr/bin/env bash
# Run the producer tier (tests/tier_producer): real llm-compressor outputs (scripts/producer-outputs.sh,
# built once per env) against vLLM itself, in the cached real-vLLM env of the version asked for.
#   scripts/test-producer.sh [--vllm 0.28|0.33] [pytest args...]
# Each run writes its table rows to build/producer-<version>.json (docs/VLLM.md is made from them
# by scripts/producer_table.py).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
if [ "${1:-}" = "--vllm" ]; then
  [ $# -ge 2 ] || { echo "test-producer: --vllm needs a version (0.28, 0.33)" >&2; exit 2; }
  export CLEF_VLLM_VERSION="$2"
  shift 2
fi
export CLEF_VLLM_VERSION="${CLEF_VLLM_VERSION:-0.28}"
outputs="$("$here/scripts/producer-outputs.sh")"
env="$("$here/scripts/vllm-env.sh")"
cd "$here"
echo "test-producer: vLLM $CLEF_VLLM_VERSION on the outputs in $outputs" >&2
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" VLLM_TARGET_DEVICE=cpu CLEF_PRODUCER_OUTPUTS="$outputs" HF_HUB_OFFLINE=1
start=$(date +%s)
rc=0
"$env/bin/python" -m pytest -p no:cacheprovider tests/tier_producer "$@" || rc=$?
echo "test-producer: tests/tier_producer took $(( $(date +%s) - start )) s" >&2
exit $rc
