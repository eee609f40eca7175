#!/usr/bin/env bash
# Kernel lab on the GPU machine: builds workshop/lab/kernel_lab.cu once (sm of the GPU present) and
# runs it: every case with the release's tuning policy and its family's alternative policies, side
# by side (kernel_lab --list names them).
#   workshop/gpu_lab.sh OUT_FILE [--variants a,b] [case-substring ...]
#   e.g. workshop/gpu_lab.sh $OUT/lab.txt --variants norm_fused_vecs_2 norm_modulate
# LAB_READ_FLUSH=1 runs it a second time with L2 flushed by reading (LAB_FLUSH=read).
# LAB_NCU_CASES="case;..." (';'-separated) profiles one timed launch of the release variant of each of
# those cases with Nsight Compute (speed of light, occupancy, stall reasons, pipes, memory) into
# OUT_FILE.ncu.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_FILE="$1"; shift
NVCC="${NVCC:-nvcc}"
ARCH="sm_$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)"
BIN="$(mktemp -d)"
if ! "$NVCC" -std=c++17 -O3 --expt-relaxed-constexpr -arch="$ARCH" -Icsrc -Xptxas -v \
    workshop/lab/kernel_lab.cu -o "$BIN/kernel_lab" > "$BIN/ptxas.txt" 2>&1; then
  grep -m10 error "$BIN/ptxas.txt" | tee "$OUT_FILE"
  exit 1
fi
{
  "$BIN/kernel_lab" --list
  "$BIN/kernel_lab" "$@"
  if [ -n "${LAB_READ_FLUSH:-}" ]; then
    echo "## L2 flushed by reading"
    LAB_FLUSH=read "$BIN/kernel_lab" "$@"
  fi
} | tee "$OUT_FILE"
if [ -n "${LAB_NCU_CASES:-}" ]; then
  NCU="$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)"
  # Each run times a warm-up and 25 launches: profile the first timed one.
  IFS=';' read -ra ncu_cases <<< "$LAB_NCU_CASES"
  for c in "${ncu_cases[@]}"; do
    echo "## ncu: $c"
    "$NCU" --clock-control none --kernel-name-base mangled --kernel-name regex:"_body" --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats \
      "$BIN/kernel_lab" --variants release "$c" 2>&1 | grep -v "^==PROF==" | tail -150
  done > "$OUT_FILE.ncu.txt"
fi
rm -rf "$BIN"
