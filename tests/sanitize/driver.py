"""The reduced suite compute-sanitizer runs (scripts/sanitize.sh): every op of tests/op_catalog.py,
every dtype, every access path it has (small, aligned, wide, odd, unaligned, strided, split rows,
empty), one call each, synchronized after each call so that an error is reported next to the call
that made it (each call is announced on stdout first).

    python tests/sanitize/driver.py [--dtypes float32,float16,bfloat16] [--cases small,odd,...]
                                    [--entries REGEX]

Exits 1 if a call raised or left an out= element unwritten (NaN), and stops at a call after which
the CUDA context is unusable (naming it); the sanitizer's own findings are in its report (ERROR
SUMMARY)."""

import argparse
import re
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT), str(ROOT / "integration")]

import torch  # noqa: E402

import op_catalog as oc  # noqa: E402
from process_guard import cuda_context_error  # noqa: E402
from transformer_kernels_integrations.loading import load_kernel, use_local_build  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--cases", default=",".join(oc.CASES))
    parser.add_argument("--entries", default=".", help="regex on the catalog entry names")
    parser.add_argument("--skip-entries", default=None, help="regex on the catalog entry names to leave out")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    dtypes = [DTYPES[d] for d in args.dtypes.split(",") if d]
    cases = tuple(c for c in args.cases.split(",") if c)
    names = [n for n in oc.ENTRIES if re.search(args.entries, n)
             and not (args.skip_entries and re.search(args.skip_entries, n))]

    use_local_build()
    tk = load_kernel()
    plan = [(n, c, d) for d in dtypes for n in names for c in oc.cases_of(n) if c in cases]
    print(f"driver: {len(plan)} calls ({len(names)} entries, {len(dtypes)} dtypes, cases {','.join(cases)}); "
          f"op namespace {tk.add_op_namespace_prefix('x').split('::')[0]}", flush=True)
    failures = []
    start = time.time()
    for i, (name, case, dtype) in enumerate(plan, 1):
        print(f"[{i}/{len(plan)}] {name} {case} {str(dtype).removeprefix('torch.')}", flush=True)
        try:
            call = oc.build(name, dtype, case, "cuda", args.seed)
            outs = call(tk)
            torch.cuda.synchronize()
            if call.writes and not call.op.endswith("_"):  # out= buffers start as NaN
                if any(o.isnan().any().item() for o in outs):
                    failures.append(f"{name} {case} {dtype}: an out= element was not written (NaN left)")
                    print(f"  UNWRITTEN: {failures[-1]}", flush=True)
        except Exception as e:  # reported and counted; the run goes on
            failures.append(f"{name} {case} {dtype}: {type(e).__name__}: {e}"[:400])
            print(f"  EXCEPTION: {failures[-1]}", flush=True)
            traceback.print_exc(limit=3)
            poisoned = cuda_context_error()
            if poisoned:  # every later call would fail for it: stop, naming the call
                failures.append(f"the CUDA context is unusable after {name} {case} {dtype} ({poisoned}); "
                                f"{len(plan) - i} calls not made")
                print(f"driver: {failures[-1]}", flush=True)
                break
    print(f"driver: {len(plan)} calls in {time.time() - start:.0f} s, {len(failures)} failures", flush=True)
    for f in failures:
        print(f"driver failure: {f}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
