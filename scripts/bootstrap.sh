#!/usr/bin/env bash
# Create .venv with clef-format (editable), everything the main test tier needs, and the linters.
# Idempotent: re-running installs only when pyproject.toml or this script changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.clef-installed
want=$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip >&2
  # torch 2.13.0 first: machines of this kind hold its CPU build on disk; elsewhere pip fetches it.
  .venv/bin/python -m pip install -q "torch==2.13.0" >&2
  # compat mode: a plain path entry, so `clef-format` starts without an import hook.
  .venv/bin/python -m pip install -q -e ".[test,lint]" --config-settings editable_mode=compat >&2
  echo "$want" > "$stamp"
fi
# Byte-compile the sources (PYTHONDONTWRITEBYTECODE may be set): start-up time is measured.
.venv/bin/python -m compileall -q clef_format migrations fixtures >/dev/null
