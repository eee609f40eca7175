#!/usr/bin/env bash
# The test command: set up .venv, build the kernel for every target arch, run the whole suite.
# GPU tests skip, with the reason, on a machine without an NVIDIA GPU.
#   scripts/test.sh [pytest args]        e.g. scripts/test.sh -k rms_norm
#   TK_CUDA_ARCHS=9.0 scripts/test.sh    build one arch only (faster)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup_env.sh
python tools/build_kernel.py --archs "${TK_CUDA_ARCHS:-all}"
python -m pytest "$@"
