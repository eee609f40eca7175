"""What initcheck makes of linear_gelu's fallback (at::linear, then our GELU from the GEMM's output into
the op's output): the catalog's linear_gelu[no_bias] strided case, step by step. Run under
`compute-sanitizer --tool initcheck` (scripts/sanitize.sh's probe step); each 'probe ...' line starts a
step, and tests/sanitize/summarize.py --probe counts the errors by kernel of each.

The 2026-12-02 run showed F.linear's output read by torch's copy kernel and our GELU on that copy both
clean, while our GELU inside linear_gelu read 1920 bytes initcheck took as unwritten. The steps below
tell apart: (a) the op's sequence replayed from Python (F.linear, then our GELU from its output into a
fresh output); (b) the op into an output written before (silences reads of the output buffer, not of
the GEMM's); (c) the op's output's address range, to compare with the addresses initcheck reports."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT), str(ROOT / "integration")]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import op_catalog as oc  # noqa: E402
from transformer_kernels_integrations.loading import load_kernel, use_local_build  # noqa: E402


def step(text: str) -> None:
    torch.cuda.synchronize()
    print(f"probe {text}", flush=True)


def span(t: torch.Tensor) -> str:
    start = t.data_ptr()
    return f"[{start:#x}, {start + t.untyped_storage().nbytes():#x})"


def main():
    use_local_build()
    tk = load_kernel()
    for dtype in (torch.float16, torch.bfloat16):
        x, w, _ = oc.build("linear_gelu[no_bias]", dtype, "strided", "cuda").args
        print(f"x {tuple(x.shape)} strides {x.stride()}, weight {tuple(w.shape)}", flush=True)
        step(f"{dtype}: F.linear, then torch's copy of its output")
        pre = F.linear(x, w)
        pre.clone()
        step(f"{dtype}: our gelu reading F.linear's output itself, into a fresh output (the op's sequence)")
        out = torch.empty_like(pre)
        tk.gelu(pre, approximate="tanh", out=out)
        step(f"{dtype}: our linear_gelu (the sanitizer run's case)")
        tk.linear_gelu(x, w)
        out = torch.zeros(*x.shape[:-1], w.shape[0], dtype=dtype, device="cuda")
        step(f"{dtype}: our linear_gelu into an output written before, out at {span(out)}")
        tk.linear_gelu(x, w, out=out)
        out = torch.empty(*x.shape[:-1], w.shape[0], dtype=dtype, device="cuda")
        step(f"{dtype}: our linear_gelu into a fresh output, out at {span(out)}")
        tk.linear_gelu(x, w, out=out)
        step(f"{dtype}: our linear_gelu on a contiguous copy of x")
        tk.linear_gelu(x.contiguous(), w)
    step("end")


if __name__ == "__main__":
    main()
