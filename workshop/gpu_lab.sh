#!/usr/bin/env bash
# Kernel lab on the GPU machine: builds workshop/lab/kernel_lab.cu once per variant (in
# parallel, sm of the GPU present), runs each in turn and prints one table per variant.
#   workshop/gpu_lab.sh OUT_FILE "name=FLAGS" ["name=FLAGS" ...] [-- case-substring ...]
#   e.g. workshop/gpu_lab.sh $OUT/lab.txt "default=" "fused2=-DTK_FUSED_CACHED_VECS=2" -- norm_modulate
# LAB_READ_FLUSH="name ..." runs those variants a second time with L2 flushed by reading (LAB_FLUSH=read).
# LAB_NCU_CASES="case;..." (';'-separated) profiles one timed launch of each of those cases of the first
# variant with Nsight Compute (speed of light, occupancy, stall reasons, pipes, memory) into OUT_FILE.ncu.txt.
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
    workshop/lab/kernel_lab.cu -o "$BIN/$name" > "$BIN/$name.ptxas" 2>&1 &
done
wait
first="${VARIANTS[0]%%=*}"
{
  for v in "${VARIANTS[@]}"; do
    name="${v%%=*}"; flags="${v#*=}"
    echo "## $name ($flags)"
    if [ -x "$BIN/$name" ]; then "$BIN/$name" "$@"; else grep -m5 error "$BIN/$name.ptxas"; fi
  done
  for name in ${LAB_READ_FLUSH:-}; do
    [ -x "$BIN/$name" ] || continue
    echo "## $name, L2 flushed by reading"
    LAB_FLUSH=read "$BIN/$name" "$@"
  done
} | tee "$OUT_FILE"
if [ -n "${LAB_NCU_CASES:-}" ] && [ -x "$BIN/$first" ]; then
  NCU="$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
  # Each case runs a warm-up and 25 timed launches: profile the first timed one.
  IFS=';' read -ra ncu_cases <<< "$LAB_NCU_CASES"
  for c in "${ncu_cases[@]}"; do
    echo "## ncu: $c"
    "$NCU" --clock-control none --kernel-name-base mangled --kernel-name regex:"_body" --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats \
      "$BIN/$first" "$c" 2>&1 | grep -v "^==PROF==" | tail -150
  done > "$OUT_FILE.ncu.txt"
fi
rm -rf "$BIN"
