#!/usr/bin/env bash
# Build (or reuse) the producer tier's checkpoints and print their folder on stdout.
#
# tests/tier_producer/generate.py runs in the producer env (scripts/producer-env.sh): real
# llm-compressor outputs of tiny random-weight Qwen3.5 models, each dressed as a layout-1 Clef
# checkpoint. The folder lives OUTSIDE the repo, keyed by the env and by every file the outputs
# depend on, built in a temporary folder and renamed into place when complete: built once per env.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
env="$("$here/scripts/producer-env.sh")"
root="${CLEF_PRODUCER_ENV_ROOT:-$HOME/.cache/clef-format}"
hash=$( { echo "$env"; cat "$here/scripts/producer-outputs.sh" "$here/tests/tier_producer/generate.py" \
  "$here"/fixtures/*.py "$here"/fixtures/templates/*.json; } | sha256sum | cut -c1-16)
out="$root/producer-outputs-$hash"
if [ -f "$out/.complete" ]; then
  echo "$out"
  exit 0
fi
tmp="$(mktemp -d "$root/.build-producer-outputs-$hash.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "producer-outputs: quantizing with llm-compressor into $out" >&2
# offline: the models are made here, nothing is downloaded
HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$here" "$env/bin/python" \
  "$here/tests/tier_producer/generate.py" "$tmp" >"$tmp/.log" 2>&1 || { cat "$tmp/.log" >&2; exit 1; }
grep "^producer:" "$tmp/.log" >&2 || true
rm -rf "$tmp"/.base-model*
echo "producer-outputs: built in $(( $(date +%s) - start )) s" >&2
touch "$tmp/.complete"
if ! mv -T "$tmp" "$out" 2>/dev/null; then
  [ -f "$out/.complete" ] || { echo "producer-outputs: could not move $tmp to $out" >&2; exit 1; }
fi
trap - EXIT
echo "$out"
