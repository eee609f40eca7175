#!/usr/bin/env bash
# compute-sanitizer over a reduced suite (tests/sanitize/driver.py): every op x dtype x access path
# of tests/op_catalog.py (small, aligned, wide, odd, unaligned, strided, split rows, empty) under
# memcheck, racecheck, initcheck and synccheck. Writes each tool's log and OUT_DIR/summary.md +
# summary.json with the error count per tool (compute-sanitizer's "ERROR SUMMARY: N errors").
#
#   scripts/sanitize.sh [OUT_DIR] [TOOL ...]      (default: sanitize-results, all four tools)
#   e.g. scripts/sanitize.sh sanitize-results memcheck racecheck     one device command a few tools
#
# Environment: SANITIZE_TIMEOUT (seconds a tool, default 540), SANITIZE_DTYPES / SANITIZE_CASES
# (comma lists passed to the driver), SANITIZE_ENTRIES (a regex on catalog entries), PYTHON.
# Needs a GPU on which compute-sanitizer runs (Firecracker machines; gVisor refuses it), and
#  - the kernel built (tools/build_kernel.py --archs native is run when build/ has none);
#  - `kernels` importable: .whl/ from scripts/fetch_gpu_wheels.sh is installed as gpu_check.sh does;
#  - compute-sanitizer: $COMPUTE_SANITIZER, on PATH, in $CUDA_HOME/bin or /usr/local/cuda*/bin, in the
#    pip wheel nvidia-cuda-sanitizer-api 13.0 (nvidia/cu13/bin/compute-sanitizer) if installed, or
#    that wheel carried in .whl/: on a machine with PyPI,
#      python3 -m pip download --no-deps 'nvidia-cuda-sanitizer-api>=13.0,<13.1' -d .whl
# PyTorch's caching allocator is off (PYTORCH_NO_CUDA_MEMORY_CACHING=1): every tensor is its own
# allocation, so an access past one is outside any allocation (memcheck also pads each by 512 bytes).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-sanitize-results}"
shift || true
TOOLS=("$@")
[ ${#TOOLS[@]} -eq 0 ] && TOOLS=(memcheck racecheck initcheck synccheck)
PYTHON="${PYTHON:-python3}"
TIMEOUT="${SANITIZE_TIMEOUT:-540}"
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1

if [ ! -d /tmp/tk-site ] && compgen -G ".whl/*.whl" > /dev/null; then
  wheels=$(ls .whl/*.whl | grep -v nvidia_cuda_sanitizer_api || true)
  [ -n "$wheels" ] && "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/tk-site $wheels
fi
[ -d /tmp/tk-site ] && export PYTHONPATH="/tmp/tk-site${PYTHONPATH:+:$PYTHONPATH}"

find_sanitizer() {
  local c
  for c in "${COMPUTE_SANITIZER:-}" "$(command -v compute-sanitizer 2>/dev/null)" \
           "${CUDA_HOME:-/nonexistent}/bin/compute-sanitizer" /usr/local/cuda/bin/compute-sanitizer \
           /usr/local/cuda/compute-sanitizer/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return; }
  done
  c=$("$PYTHON" - <<'EOF' 2>/dev/null
import pathlib
try:
    import nvidia
    for base in nvidia.__path__:
        for p in pathlib.Path(base).glob("cu*/bin/compute-sanitizer"):
            print(p)
            break
except ImportError:
    pass
EOF
)
  [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return; }
  local wheel
  wheel=$(ls .whl/nvidia_cuda_sanitizer_api-*.whl 2>/dev/null | head -1)
  if [ -n "$wheel" ]; then
    "$PYTHON" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall('/tmp/tk-sanitizer')" "$wheel"
    c=$(ls /tmp/tk-sanitizer/nvidia/cu*/bin/compute-sanitizer 2>/dev/null | head -1)
    [ -n "$c" ] && chmod +x "$c" && { echo "$c"; return; }
  fi
}
SANITIZER=$(find_sanitizer)
if [ -z "$SANITIZER" ]; then
  echo "compute-sanitizer not found (see the header of $0 for where it is looked for)" | tee "$OUT_DIR/summary.md"
  exit 2
fi
"$SANITIZER" --version | tee "$OUT_DIR/sanitizer-version.txt"

if ! compgen -G "build/torch*/metadata.json" > /dev/null; then
  "$PYTHON" tools/build_kernel.py --archs native || exit 3
fi

driver=("$PYTHON" tests/sanitize/driver.py)
[ -n "${SANITIZE_DTYPES:-}" ] && driver+=(--dtypes "$SANITIZE_DTYPES")
[ -n "${SANITIZE_CASES:-}" ] && driver+=(--cases "$SANITIZE_CASES")
[ -n "${SANITIZE_ENTRIES:-}" ] && driver+=(--entries "$SANITIZE_ENTRIES")

# Only our kernels are checked (their mangled names hold the namespace) and cuBLAS(Lt)'s GEMMs (the
# linear_gelu epilogue and its fallback), except by initcheck, which must see torch's copy and fill
# kernels write the inputs to know them initialized.
OURS=(--kernel-name kns=transformer_kernels --kernel-name kns=gemm --kernel-name kns=cutlass)
declare -A OPTIONS=(
  [memcheck]="--padding 512"
  [racecheck]="--racecheck-report all"
  [initcheck]=""
  [synccheck]=""
)

for tool in "${TOOLS[@]}"; do
  log="$OUT_DIR/$tool.log"
  filter=("${OURS[@]}")
  [ "$tool" = initcheck ] && filter=()
  start=$(date +%s)
  # shellcheck disable=SC2086
  timeout "$TIMEOUT" "$SANITIZER" --tool "$tool" ${OPTIONS[$tool]} "${filter[@]}" --print-limit 200 \
    --error-exitcode 99 "${driver[@]}" > "$log" 2>&1
  echo "$? $(( $(date +%s) - start ))" > "$OUT_DIR/$tool.rc"
  echo "$tool: $(grep -Eo '(ERROR|RACECHECK) SUMMARY: .*' "$log" | tail -2 | tr '\n' ' ')(rc $(cut -d' ' -f1 "$OUT_DIR/$tool.rc"))"
done

"$PYTHON" - "$OUT_DIR" "${TOOLS[@]}" <<'EOF'
import json, re, subprocess, sys
from pathlib import Path

out, tools = Path(sys.argv[1]), sys.argv[2:]
git = lambda *a: subprocess.run(["git", *a], capture_output=True, text=True).stdout.strip()
rows, record = [], {"tree": git("rev-parse", "HEAD^{tree}")[:7], "commit": git("rev-parse", "--short", "HEAD"),
                    "dirty": bool(git("status", "--porcelain", "--untracked-files=no")), "tools": {}}
for tool in tools:
    log = (out / f"{tool}.log").read_text(errors="replace") if (out / f"{tool}.log").exists() else ""
    rc, secs = ((out / f"{tool}.rc").read_text().split() + ["?", "?"])[:2] if (out / f"{tool}.rc").exists() else ("?", "?")
    summary = re.findall(r"ERROR SUMMARY: (\d+) errors?", log)
    races = re.findall(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", log)
    if races and not summary:  # racecheck's own line: hazards displayed (errors, warnings)
        summary = [races[-1][1]]
    calls = re.findall(r"driver: (\d+) calls in", log)
    failures = re.findall(r"driver: \d+ calls in \d+ s, (\d+) failures", log)
    ns = re.findall(r"op namespace (\S+)", log)
    entry = {"errors": int(summary[-1]) if summary else None, "rc": rc, "seconds": secs,
             "calls": int(calls[-1]) if calls else None, "driver_failures": int(failures[-1]) if failures else None,
             "op_namespace": ns[-1] if ns else None,
             "racecheck_hazards": dict(zip(("displayed", "errors", "warnings"), map(int, races[-1]))) if races else None,
             "finished": bool(calls) and rc not in ("124", "137")}
    record["tools"][tool] = entry
    errors = "no summary" if entry["errors"] is None else str(entry["errors"])
    if races:
        errors += f" ({races[-1][2]} race warnings)"
    rows.append(f"| {tool} | {errors} | "
                f"{entry['calls']} | {entry['driver_failures']} | {rc} | {secs} |")
ns = next((t["op_namespace"] for t in record["tools"].values() if t["op_namespace"]), None)
record["op_namespace"] = ns
md = [f"# compute-sanitizer: every op x dtype x access path (tests/sanitize/driver.py)", "",
      f"Op namespace {ns} (git tree {record['tree']}{', dirty' if record['dirty'] else ''}; commit "
      f"{record['commit']}). rc 124: the tool ran past SANITIZE_TIMEOUT; 99: it found errors.", "",
      "| tool | errors | calls | driver failures | rc | seconds |", "|---|---|---|---|---|---|", *rows, ""]
(out / "summary.md").write_text("\n".join(md))
(out / "summary.json").write_text(json.dumps(record, indent=1) + "\n")
print("\n".join(md))
clean = all(t["errors"] == 0 and t["driver_failures"] == 0 and t["finished"] for t in record["tools"].values())
sys.exit(0 if clean else 1)
EOF
