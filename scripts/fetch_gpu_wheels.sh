#!/usr/bin/env bash
# Downloads into .whl/ the wheels the GPU machine lacks (it has no network); pass `.whl` in the
# device call's carry list and scripts/gpu_check.sh installs them. Run on a machine with PyPI.
# transformers 5.24 (and the hub, tokenizers and tomlkit it and kernels 0.18 need) comes along: the
# GPU machine's transformers 5.17 accepts no kernels release from 0.17 on, so without it the Hub
# mapping's GPU test would skip. huggingface_hub 1.x: 2.x needs httpx2, which that machine lacks.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl kernels==0.18.3 kernel-abi-check==0.14.1 psutil==7.2.2 tokenizers==0.23.3 safetensors==0.8.0 regex==2026.12.2
python3 -m pip download --quiet --no-deps -d .whl liger-kernel==0.8.5 diffusers==0.42.1 importlib_metadata==10.2.0 \
  accelerate==1.15.0 transformers==5.24.0 huggingface_hub==1.33.0 tomlkit==0.15.3 typer==0.29.2
ls .whl
