"""`kernels benchmark` workloads: each op family against the eager PyTorch code it replaces.

    kernels benchmark transformer-kernels/transformer-kernels@v1   # the Hub's build
    kernels benchmark ./                                            # this checkout's build/ (after a build)

The runner (kernels >= 0.17, ``pip install 'kernels[benchmark]'``) loads the kernel, calls
``setup_<workload>``, times ``benchmark_<workload>`` and, once, ``verify_<workload>``: the eager code
(transformers' or diffusers' own formula), whose output must match ``self.out`` within
``torch.allclose(atol=1e-2)``; its time is the table's ``Ref(ms)`` and the speedup is against it.
The runner's timer is host wall time around a synchronize and the reference runs once, so the
table is a quick comparison; the numbers of record come from ``bench_micro.py`` (CUDA events,
L2 flushed, a same-size copy as the floor).

Shapes: ``llama`` is a Llama-3.1-8B prefill of 4096 tokens (hidden 4096, 32 q / 8 kv heads of 128,
MLP 14336); ``ltx`` is an LTX-Video-2B step of 2 x 5376 tokens (hidden 2048). fp16: in bf16 a
correct one-ulp difference at magnitudes above ~1.3 already exceeds the runner's atol=1e-2.

Self-contained on purpose: the Hub runs this file alone from ``benchmarks/``, with only torch,
kernels and the kernel loaded (``self.kernel``).
"""

import torch
import torch.nn.functional as F

from kernels.benchmark import Benchmark

DTYPE = torch.float16
LLAMA = dict(tokens=4096, hidden=4096, intermediate=14336, q_heads=32, kv_heads=8, head_dim=128, eps=1e-5)
LTX = dict(batch=2, tokens=5376, hidden=2048, eps=1e-6)


def _randn(*shape, scale=1.0, offset=0.0, device="cuda"):
    return (torch.randn(*shape, device=device, dtype=torch.float32) * scale + offset).to(DTYPE)


# ---- eager references: the code each op replaces ----


def _hf_rms_norm(x, weight, eps):
    """transformers' LlamaRMSNorm."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _diffusers_rms_norm(x, eps):
    """diffusers' RMSNorm without weight (LTX-Video's block norms)."""
    h = x.float()
    return (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _hf_rope(x, cos, sin):
    """transformers' apply_rotary_pos_emb for one of q, k (cos/sin unsqueezed at the head dim)."""
    return x * cos[:, None] + _rotate_half(x) * sin[:, None]


class NormBenchmark(Benchmark):
    """RMSNorm (transformers' rounding), the residual add fused with RMSNorm, LayerNorm."""

    seed = 0

    def setup(self):
        self.x = _randn(LLAMA["tokens"], LLAMA["hidden"], scale=2.0, offset=0.5, device=self.device)
        self.residual = _randn(LLAMA["tokens"], LLAMA["hidden"], device=self.device)
        self.w = _randn(LLAMA["hidden"], scale=0.2, offset=1.0, device=self.device)
        self.b = _randn(LLAMA["hidden"], scale=0.1, device=self.device)

    def benchmark_rms_norm_llama(self):
        self.out = self.kernel.rms_norm(self.x, self.w, LLAMA["eps"])

    def verify_rms_norm_llama(self):
        return _hf_rms_norm(self.x, self.w, LLAMA["eps"])

    def benchmark_fused_add_rms_norm_llama(self):
        self.out, _ = self.kernel.fused_add_rms_norm(self.x, self.residual, self.w, LLAMA["eps"])

    def verify_fused_add_rms_norm_llama(self):
        return _hf_rms_norm(self.x + self.residual, self.w, LLAMA["eps"])

    def benchmark_layer_norm_llama(self):
        self.out = self.kernel.layer_norm(self.x, self.w, self.b, LLAMA["eps"])

    def verify_layer_norm_llama(self):
        return F.layer_norm(self.x, (LLAMA["hidden"],), self.w, self.b, LLAMA["eps"])


class ActivationBenchmark(Benchmark):
    """SwiGLU between the MLP projections (Llama), the FFN's tanh-GELU (LTX-Video), alone and in the
    epilogue of the FFN's input GEMM (``linear_gelu``)."""

    seed = 0

    def setup(self):
        self.gate = _randn(LLAMA["tokens"], LLAMA["intermediate"], device=self.device)
        self.up = _randn(LLAMA["tokens"], LLAMA["intermediate"], device=self.device)
        self.ffn = _randn(LTX["batch"] * LTX["tokens"], 4 * LTX["hidden"], device=self.device)
        self.tokens = _randn(LTX["batch"] * LTX["tokens"], LTX["hidden"], device=self.device)
        self.ffn_weight = _randn(4 * LTX["hidden"], LTX["hidden"], scale=LTX["hidden"] ** -0.5, device=self.device)
        self.ffn_bias = _randn(4 * LTX["hidden"], scale=0.1, device=self.device)

    def benchmark_act_mul_silu_llama(self):
        self.out = self.kernel.act_mul(self.gate, self.up, "silu")

    def verify_act_mul_silu_llama(self):
        return F.silu(self.gate) * self.up

    def benchmark_gelu_tanh_ltx(self):
        self.out = self.kernel.gelu(self.ffn, approximate="tanh")

    def verify_gelu_tanh_ltx(self):
        return F.gelu(self.ffn, approximate="tanh")

    def benchmark_linear_gelu_ltx(self):
        self.out = self.kernel.linear_gelu(self.tokens, self.ffn_weight, self.ffn_bias)

    def verify_linear_gelu_ltx(self):
        # eager rounds the GEMM's output, then the GELU's; the epilogue rounds once (within atol)
        return F.gelu(F.linear(self.tokens, self.ffn_weight, self.ffn_bias), approximate="tanh")


class RopeBenchmark(Benchmark):
    """transformers' rotary embedding of q and k in one launch (Llama prefill)."""

    seed = 0

    def setup(self):
        b, s, d = 1, LLAMA["tokens"], LLAMA["head_dim"]
        self.q = _randn(b, LLAMA["q_heads"], s, d, device=self.device)
        self.k = _randn(b, LLAMA["kv_heads"], s, d, device=self.device)
        angles = torch.arange(s, device=self.device, dtype=torch.float32)[:, None] * torch.rand(
            d // 2, device=self.device)
        angles = torch.cat((angles, angles), dim=-1)[None]
        self.cos, self.sin = angles.cos().to(DTYPE), angles.sin().to(DTYPE)

    def benchmark_apply_rotary_pos_emb_llama(self):
        self.out, _ = self.kernel.apply_rotary_pos_emb(self.q, self.k, self.cos, self.sin)

    def verify_apply_rotary_pos_emb_llama(self):
        return _hf_rope(self.q, self.cos, self.sin)


class ModulationBenchmark(Benchmark):
    """LTX-Video's AdaLN (weightless RMSNorm, then scale and shift) and its gated residual."""

    seed = 0

    def setup(self):
        b, s, c = LTX["batch"], LTX["tokens"], LTX["hidden"]
        self.x = _randn(b, s, c, scale=2.0, offset=0.5, device=self.device)
        self.y = _randn(b, s, c, device=self.device)
        self.scale = _randn(b, 1, c, scale=0.1, device=self.device)
        self.shift = _randn(b, 1, c, scale=0.1, device=self.device)
        self.gate = _randn(b, 1, c, scale=0.5, device=self.device)

    def benchmark_norm_modulate_ltx(self):
        self.out = self.kernel.norm_modulate(self.x, self.scale, self.shift, norm="rms", eps=LTX["eps"])

    def verify_norm_modulate_ltx(self):
        return _diffusers_rms_norm(self.x, LTX["eps"]) * (1 + self.scale) + self.shift

    def benchmark_gated_add_ltx(self):
        self.out = self.kernel.gated_add(self.x, self.y, self.gate)

    def verify_gated_add_ltx(self):
        return self.x + self.y * self.gate
