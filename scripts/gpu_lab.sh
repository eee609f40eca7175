#!/usr/bin/env bash
# Kernel lab on the GPU machine: builds benchmarks/lab/kernel_lab.cu once per variant (in
# parallel, sm of the GPU present), runs each in turn and prints one table per variant.
#   scripts/gpu_lab.sh OUT_FILE "name=FLAGS" ["name=FLAGS" ...] [-- case-substring ...]
#   e.g. scripts/gpu_lab.sh $OUT/lab.txt "default=" "fused2=-DTK_FUSED_CACHED_VECS=2" -- norm_modulate
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_FILE="$1"; shift
VARIANTS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do VARIANTS+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
NVCC="${NVCC:-nvcc}"
ARCH="sm_$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)"
BIN="$(mktemp -d)"
for v in "${VARIANTS[@]}"; do
  name="${v%%=*}"; flags="${v#*=}"
  "$NVCC" -std=c++17 -O3 --expt-relaxed-constexpr -arch="$ARCH" -Icsrc $flags -Xptxas -v \
    benchmarks/lab/kernel_lab.cu -o "$BIN/$name" > "$BIN/$name.ptxas" 2>&1 &
done
wait
{
  for v in "${VARIANTS[@]}"; do
    name="${v%%=*}"; flags="${v#*=}"
    echo "## $name ($flags)"
    if [ -x "$BIN/$name" ]; then "$BIN/$name" "$@"; else grep -m5 error "$BIN/$name.ptxas"; fi
  done
} | tee "$OUT_FILE"
rm -rf "$BIN"
