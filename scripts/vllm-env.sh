#!/usr/bin/env bash
# Build (or reuse) the real-vLLM test environment and print its path on stdout.
#
# The env lives OUTSIDE the repo, keyed by a hash of the requirements file and this script,
# so every clone shares it and a change to either builds a fresh one. It is built in a
# temporary directory and renamed into place only when complete: a half-built env is never
# reused. pip is run with PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= so that torch==2.13.0
# resolves to the CUDA build on PyPI (the machine-local CPU-only file does not work with
# PyPI's torchvision, which vLLM's model module imports).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
req="$here/requirements/vllm-${CLEF_VLLM_VERSION:-0.28}.txt"
[ -f "$req" ] || { echo "vllm-env: no requirements file $req" >&2; exit 2; }
root="${CLEF_VLLM_ENV_ROOT:-$HOME/.cache/clef-format}"
hash=$(cat "$req" "$here/scripts/vllm-env.sh" | sha256sum | cut -c1-16)
env="$root/vllm-$hash"
if [ -x "$env/bin/python" ] && [ -f "$env/.complete" ]; then
  echo "$env"
  exit 0
fi
mkdir -p "$root"
py="${PYTHON:-python3}"
tmp="$(mktemp -d "$root/.build-vllm-$hash.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "vllm-env: building $env (about 8 GB, several minutes)" >&2
"$py" -m venv "$tmp"
export PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_DISABLE_PIP_VERSION_CHECK=1
"$tmp/bin/python" -m pip install -q --upgrade pip >&2
"$tmp/bin/python" -m pip install -q -r "$req" >&2
"$tmp/bin/python" -c "import vllm, torch, compressed_tensors; print('vllm', vllm.__version__, 'torch', torch.__version__, 'compressed-tensors', compressed_tensors.__version__)" >&2
touch "$tmp/.complete"
# A venv hard-codes its own path in bin/ scripts; we only ever run "$env/bin/python -m ...",
# whose symlinked interpreter does not care where the directory lives, so a rename is safe.
if ! mv -T "$tmp" "$env" 2>/dev/null; then
  # Another build won the race: use theirs if complete.
  [ -f "$env/.complete" ] || { echo "vllm-env: could not move $tmp to $env" >&2; exit 1; }
fi
trap - EXIT
echo "$env"
