"""What initcheck makes of the output of the GEMM that linear_gelu's fallback runs (at::linear):
the catalog's linear_gelu[no_bias] strided case, F.linear of it, then torch's own copy kernel
reading that output, then our GELU reading the copy (written by torch's copy kernel). Run under
`compute-sanitizer --tool initcheck` (scripts/sanitize.sh's probe step): if torch's copy kernel is
reported reading F.linear's output and our GELU is not reported reading the copy, the reports in
our GELU in the sanitizer run are initcheck not seeing the GEMM's stores, not a read of memory
nothing wrote."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT), str(ROOT / "integration")]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import op_catalog as oc  # noqa: E402
from transformer_kernels_integrations.loading import load_kernel, use_local_build  # noqa: E402


def main():
    use_local_build()
    tk = load_kernel()
    for dtype in (torch.float16, torch.bfloat16):
        x, w, _ = oc.build("linear_gelu[no_bias]", dtype, "strided", "cuda").args
        pre = F.linear(x, w)
        torch.cuda.synchronize()
        print(f"probe {dtype}: torch's copy of F.linear's output", flush=True)
        copy = pre.clone()
        torch.cuda.synchronize()
        print(f"probe {dtype}: our gelu on that copy", flush=True)
        tk.gelu(copy, approximate="tanh")
        torch.cuda.synchronize()
        print(f"probe {dtype}: our linear_gelu (the sanitizer run's case)", flush=True)
        tk.linear_gelu(x, w)
        torch.cuda.synchronize()
        # If the GELU read its output buffer rather than the GEMM's, an output written before (zeros)
        # silences it here; if it reads the GEMM's output, the reports stay.
        out = torch.zeros(*x.shape[:-1], w.shape[0], dtype=dtype, device="cuda")
        torch.cuda.synchronize()
        print(f"probe {dtype}: our linear_gelu into an output written before", flush=True)
        tk.linear_gelu(x, w, out=out)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
