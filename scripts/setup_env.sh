#!/usr/bin/env bash
# Creates .venv (Python >= 3.11: tools/build_kernel.py reads build.toml with tomllib) with the
# pinned requirements, once; reinstalls when requirements.txt changes. Source it: it activates the
# environment in the calling shell. Says what it is doing, and while pip works (the torch and CUDA
# wheels are some GB) a line every 20 s: never silent for long.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"

# "$@" with a line on stderr every TK_HEARTBEAT_S (20) seconds while it runs (`what` names it).
with_heartbeat() {
  local what="$1" start=$SECONDS rc=0 beat
  shift
  ( while sleep "${TK_HEARTBEAT_S:-20}"; do echo "setup_env: still $what ($((SECONDS - start)) s)" >&2; done ) &
  beat=$!
  if "$@"; then rc=0; else rc=$?; fi
  kill "$beat" 2>/dev/null || true
  wait "$beat" 2>/dev/null || true
  return "$rc"
}

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required (tomllib)"'
  echo "setup_env: creating $VENV with $("$PYTHON" --version)" >&2
  "$PYTHON" -m venv "$VENV"
fi
STAMP="$VENV/.requirements.sha256"
WANT="$(sha256sum "$ROOT/requirements.txt" | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  echo "setup_env: installing requirements.txt into $VENV ($(grep -m1 '^torch==' "$ROOT/requirements.txt") with its CUDA" \
       "wheels, some GB: a few minutes on a first run)" >&2
  with_heartbeat "upgrading pip" "$VENV/bin/python" -m pip install --quiet --upgrade pip
  with_heartbeat "installing requirements.txt" "$VENV/bin/python" -m pip install --quiet -r "$ROOT/requirements.txt"
  echo "$WANT" > "$STAMP"
  echo "setup_env: $VENV ready" >&2
else
  echo "setup_env: $VENV is up to date with requirements.txt" >&2
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
