#!/usr/bin/env bash
# Build (or reuse) the producer-tier environment (llm-compressor on a CPU torch) and print its
# path on stdout.
#
# Like scripts/vllm-env.sh: the env lives OUTSIDE the repo, keyed by a hash of the requirements
# file and this script, so every clone shares it and a change to either builds a fresh one; it is
# built in a temporary directory and renamed into place only when complete.
#
# Like scripts/engine-env.sh, pip runs with the machine's default pip config, which finds the CPU
# build of torch==2.13.0 (a local wheel folder here). torch is installed on its own first, so the
# llm-compressor install that follows keeps it instead of pulling a CUDA build from PyPI.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
req="$here/requirements/producer.txt"
[ -f "$req" ] || { echo "producer-env: no requirements file $req" >&2; exit 2; }
root="${CLEF_PRODUCER_ENV_ROOT:-$HOME/.cache/clef-format}"
hash=$(cat "$req" "$here/scripts/producer-env.sh" | sha256sum | cut -c1-16)
env="$root/producer-$hash"
if [ -x "$env/bin/python" ] && [ -f "$env/.complete" ]; then
  echo "$env"
  exit 0
fi
mkdir -p "$root"
py="${PYTHON:-python3}"
tmp="$(mktemp -d "$root/.build-producer-$hash.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "producer-env: building $env (about 2 GB, a few minutes)" >&2
"$py" -m venv "$tmp"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# pip's output to stderr, less one warning per package about index folders this machine lacks
pip_() { "$tmp/bin/python" -m pip "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2; }
pip_ install -q --upgrade pip
pip_ install -q "$(grep -E '^torch==' "$req")"
pip_ install -q -r "$req"
"$tmp/bin/python" -c "import llmcompressor, torch, transformers, compressed_tensors; print('llmcompressor', llmcompressor.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__, 'compressed-tensors', compressed_tensors.__version__)" >&2
echo "producer-env: built in $(( $(date +%s) - start )) s" >&2
touch "$tmp/.complete"
# A venv hard-codes its own path in bin/ scripts; we only ever run "$env/bin/python -m ...",
# whose symlinked interpreter does not care where the directory lives, so a rename is safe.
if ! mv -T "$tmp" "$env" 2>/dev/null; then
  [ -f "$env/.complete" ] || { echo "producer-env: could not move $tmp to $env" >&2; exit 1; }
fi
trap - EXIT
echo "$env"
