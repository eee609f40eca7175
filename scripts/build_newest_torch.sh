#!/usr/bin/env bash
# Compiles one arch (sm_90) against the newest torch on PyPI whose CUDA is nvcc's, in its own
# environment (.venv-torch-newest), so that the Hub variants for current torch are known to build
# (kernel-builder's Nix build targets newer torch than the one requirements.txt pins and tests).
# The newest torch on PyPI, 2.15.0, carries CUDA 13.2 and nvcc is 13.0, which tools/build_kernel.py
# refuses (the variant would be named for one CUDA and compiled with another); 2.14.1 is the
# newest with CUDA 13.0. Override with TK_NEWEST_TORCH=2.x.y.
#   scripts/build_newest_torch.sh        -> build/torch214-cxx11-cu130-x86_64-linux
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_VERSION="${TK_NEWEST_TORCH:-2.14.1}"
VENV=.venv-torch-newest
PYTHON="${PYTHON:-python3}"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
# the build needs torch, CMake, ninja and (for build.toml's parser) kernels, pinned as in requirements.txt
pins=$(grep -E '^(cmake|ninja|kernels)==' requirements.txt | tr '\n' ' ')
"$VENV/bin/python" -m pip install --quiet "torch==$TORCH_VERSION" $pins
"$VENV/bin/python" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"
"$VENV/bin/python" tools/build_kernel.py --archs "${TK_CUDA_ARCHS:-9.0}"
