#!/usr/bin/env bash
# Creates .venv (Python >= 3.11: tools/build_kernel.py reads build.toml with tomllib) with the
# pinned requirements, once; reinstalls when requirements.txt changes. Source it: it activates the
# environment in the calling shell.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required (tomllib)"'
  "$PYTHON" -m venv "$VENV"
fi
STAMP="$VENV/.requirements.sha256"
WANT="$(sha256sum "$ROOT/requirements.txt" | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -r "$ROOT/requirements.txt"
  echo "$WANT" > "$STAMP"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
