"""Workshop: a first GPU look at attention_8bit (correctness against float64 and the emulation, then
speed against torch's SDPA backends), before the family's tests and micro-benchmark exist.

    python workshop/attention_gpu_check.py --out DIR [--bench]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "integration"))

from reference.attention import attention_8bit_emulation, attention_reference  # noqa: E402
from transformer_kernels_integrations.loading import load_kernel  # noqa: E402

tk = load_kernel(ROOT)
op = tk.attention_8bit


def errors(out: torch.Tensor, ref: torch.Tensor) -> dict:
    o, r = out.double().flatten(), ref.double().flatten()
    return {"cos": float(F.cosine_similarity(o, r, dim=0)), "rel_l2": float((o - r).norm() / r.norm()),
            "max_abs": float((o - r).abs().max()), "ref_max": float(r.abs().max())}


def make(B, H, Sq, Sk, D, dtype, layout, structured=False, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    def t(S):
        if layout == "bshd":
            return torch.randn(B, S, H, D, device="cuda", dtype=torch.float32, generator=g).transpose(1, 2)
        return torch.randn(B, H, S, D, device="cuda", dtype=torch.float32, generator=g)
    q, k, v = t(Sq), t(Sk), t(Sk)
    if structured:
        k = k + 20 * (torch.arange(D, device="cuda") % 13 == 0)          # a large per-channel mean
        k[..., 5] *= 10                                                    # an outlier channel
        q[..., 7] *= 8
    return [x.to(dtype) for x in (q, k, v)]


def correctness(results: list) -> bool:
    ok = True
    cases = [
        (1, 2, 64, 64, 64, torch.bfloat16, "bhsd", False),
        (1, 2, 77, 130, 64, torch.bfloat16, "bshd", False),
        (2, 3, 200, 333, 128, torch.float16, "bshd", False),
        (1, 2, 1, 1, 128, torch.bfloat16, "bhsd", False),
        (1, 4, 512, 512, 64, torch.bfloat16, "bshd", True),
        (1, 4, 512, 512, 128, torch.bfloat16, "bshd", True),
        (1, 2, 1024, 128, 64, torch.bfloat16, "bshd", False),   # cross-attention to text
        (1, 2, 2688, 2688, 64, torch.bfloat16, "bshd", False),
        (1, 2, 4608, 4608, 128, torch.bfloat16, "bshd", False),
    ]
    for B, H, Sq, Sk, D, dtype, layout, structured in cases:
        q, k, v = make(B, H, Sq, Sk, D, dtype, layout, structured)
        out = op(q, k, v)
        torch.cuda.synchronize()
        ref = attention_reference(q, k, v)
        emu = attention_8bit_emulation(q.float(), k.float(), v.float()).to(dtype) if Sq * Sk <= 600_000 else None
        sdpa = F.scaled_dot_product_attention(q, k, v)
        try:
            from sageattention import sageattn
            sage = sageattn(q.contiguous(), k.contiguous(), v.contiguous(), tensor_layout="HND", is_causal=False)
        except Exception:
            sage = None
        row = {"case": [B, H, Sq, Sk, D, str(dtype), layout, structured], "finite": bool(out.isfinite().all()),
               "strides": list(out.stride()), "ours_vs_f64": errors(out, ref), "sdpa_vs_f64": errors(sdpa, ref)}
        if sage is not None:
            row["sage_vs_f64"] = errors(sage, ref)
        if emu is not None:
            row["ours_vs_emulation"] = errors(out, emu)
            row["emulation_vs_f64"] = errors(emu, ref)
        good = row["finite"] and row["ours_vs_f64"]["cos"] >= 0.9995
        ok &= good
        row["pass"] = good
        results.append(row)
        print(json.dumps(row), flush=True)
    # edges: NaN propagation masks against SDPA's math, Sk = 0, empty batch
    q, k, v = make(1, 2, 100, 90, 64, torch.bfloat16, "bshd")
    for name, idx in (("q", (0, 1, 5, 3)), ("k", (0, 0, 7, 2)), ("v", (0, 1, 9, 4))):
        qq, kk, vv = q.clone(), k.clone(), v.clone()
        dict(q=qq, k=kk, v=vv)[name][idx] = float("nan")
        out = op(qq, kk, vv)
        ref = attention_reference(qq, kk, vv)
        same = bool((out.isnan() == ref.isnan()).all())
        ok &= same
        results.append({"nan_in": name, "mask_equal": same, "ours_nan": int(out.isnan().sum()), "ref_nan": int(ref.isnan().sum())})
        print(results[-1], flush=True)
    z = op(q, k[:, :, :0], v[:, :, :0])
    e = op(q[:0], k[:0], v[:0])
    results.append({"sk0_zeros": bool((z == 0).all()), "empty_shape": list(e.shape)})
    ok &= bool((z == 0).all())
    print(results[-1], flush=True)
    return ok


def bench(results: list) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench
    shapes = [("LTX 2688", 2, 32, 2688, 64), ("LTX 8064", 2, 32, 8064, 64), ("Flux 4608", 1, 24, 4608, 128),
              ("SDXL 4096", 2, 10, 4096, 64), ("SDXL 1024", 2, 20, 1024, 64)]
    try:
        from sageattention import sageattn
    except Exception:
        sageattn = None
    for name, B, H, S, D in shapes:
        q, k, v = make(B, H, S, S, D, torch.bfloat16, "bshd")
        flops = 4 * B * H * S * S * D
        row = {"shape": name, "B": B, "H": H, "S": S, "D": D}
        impls = {"ours": lambda: op(q, k, v)}
        for bname, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION)):
            def f(be=be):
                with sdpa_kernel(be):
                    return F.scaled_dot_product_attention(q, k, v)
            impls[bname] = f
        if sageattn is not None:
            impls["sageattention"] = lambda: sageattn(q, k, v, tensor_layout="HND", is_causal=False)
        ref = attention_reference(q[:, :2], k[:, :2], v[:, :2])
        for iname, f in impls.items():
            try:
                out = f()
                ms = do_bench(f, warmup=25, rep=100)
                row[iname] = {"ms": ms, "tflops": flops / ms / 1e9, "err": errors(out[:, :2], ref)}
            except Exception as e:  # a backend that refuses the shape
                row[iname] = {"error": str(e).splitlines()[0][:200]}
        results.append(row)
        print(json.dumps(row), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--bench", action="store_true")
    a = ap.parse_args()
    results = []
    ok = correctness(results)
    if a.bench:
        bench(results)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "ops": tk.add_op_namespace_prefix("x").split("::")[0]}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "attention_check.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print("ALL OK" if ok else "FAILURES", flush=True)


if __name__ == "__main__":
    main()
