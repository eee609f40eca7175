"""The tests kernel-builder's Nix runner runs (``nix run .#ci-test`` = ``pytest tests -m kernels_ci``).

Its source set holds only ``tests/**/*.py``, ``torch-ext`` and the kernel sources, so this module
imports nothing but torch, pytest and kernels (no ``reference/``, no integration package): each op
family once against a float64 or eager formula written here, at a size with a ragged tail, in
bf16 and fp32; outputs are checked everywhere. Well under a minute on one GPU. The full suite
(``scripts/test.sh``) runs them too, next to the thorough per-op tests.
"""

import pytest
import torch
import torch.nn.functional as F

from conftest import load_kernel

pytestmark = pytest.mark.kernels_ci

DTYPES = [torch.bfloat16, torch.float32]
TOL = {torch.bfloat16: 2e-2, torch.float32: 1e-5}  # relative, against float64


@pytest.fixture(scope="module")
def tk():
    return load_kernel()


def rand(*shape, dtype, scale=1.0, offset=0.0, device="cuda"):
    return (torch.randn(*shape, device=device, dtype=torch.float32) * scale + offset).to(dtype)


def norm_input(dtype, device="cuda", rows=67, hidden=4099):
    """x for the norms: rows of mean square ~4, and a third of rows of ~4e-4 where eps = 1e-5 and
    a wrong eps (1e-1, say) give different outputs (on the first rows they would not)."""
    x = torch.randn(rows, hidden, device=device, dtype=torch.float32) * 2 + 0.5
    x[rows * 2 // 3:] *= 1e-2
    return x.to(dtype)


def rms64(h, eps=1e-5):
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


def assert_close64(out, ref64, dtype):
    assert out.dtype == dtype and out.isfinite().all()
    err = (out.double() - ref64).abs().max().item()
    assert err <= TOL[dtype] * ref64.abs().max().item() + 1e-6, f"max error {err}"


def test_loads_through_kernels_with_its_layers(tk):
    """Runs without a GPU too: the module, its ops and layers load through kernels."""
    assert {"rms_norm", "fused_add_rms_norm", "layer_norm", "act_mul", "gelu", "apply_rotary_pos_emb",
            "norm_modulate", "gated_add", "layers"} <= set(tk.__all__)
    from kernels.layer.layer import _validate_layer

    class HostRMSNorm(torch.nn.Module):
        def forward(self, hidden_states):
            return hidden_states

    _validate_layer(check_cls=HostRMSNorm, cls=tk.layers.RMSNorm, repo="transformer-kernels")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_norms(tk, dtype):
    x, w, b = norm_input(dtype), rand(4099, dtype=dtype, offset=1), rand(4099, dtype=dtype)
    residual = rand(67, 4099, dtype=dtype) * x.abs().amax(-1, keepdim=True)  # small where x is small
    x64, w64, b64 = x.double(), w.double(), b.double()
    assert_close64(tk.rms_norm(x, w, 1e-5), rms64(x64) * w64, dtype)
    out, new_residual = tk.fused_add_rms_norm(x, residual, w, 1e-5)
    h = (x + residual).double()
    assert_close64(new_residual, h, dtype)
    assert_close64(out, rms64(h) * w64, dtype)
    mean = x64.mean(-1, keepdim=True)
    ln = (x64 - mean) * torch.rsqrt((x64 - mean).pow(2).mean(-1, keepdim=True) + 1e-5) * w64 + b64
    assert_close64(tk.layer_norm(x, w, b, 1e-5), ln, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_check_tells_a_wrong_eps(dtype):
    """The check above fails for a kernel that used eps 1e-1 for 1e-5 (emulated in float64 and
    rounded to the dtype, on the CPU): the low-variance rows tell them apart."""
    x64 = norm_input(dtype, "cpu").double()
    assert_close64(rms64(x64).to(dtype), rms64(x64), dtype)  # the right eps passes
    with pytest.raises(AssertionError, match="max error"):
        assert_close64(rms64(x64, eps=1e-1).to(dtype), rms64(x64), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_activations(tk, dtype):
    gate, up = rand(33, 1029, dtype=dtype), rand(33, 1029, dtype=dtype)
    assert_close64(tk.act_mul(gate, up, "silu"), F.silu(gate.double()) * up.double(), dtype)
    assert_close64(tk.gelu(gate, approximate="tanh"), F.gelu(gate.double(), approximate="tanh"), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope(tk, dtype):
    q, k = rand(2, 8, 37, 128, dtype=dtype), rand(2, 2, 37, 128, dtype=dtype)
    angles = torch.arange(37, device="cuda", dtype=torch.float32)[:, None] * torch.rand(64, device="cuda")
    angles = torch.cat((angles, angles), -1)[None].expand(2, -1, -1)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)

    def rotate(x):
        x = x.double()
        x1, x2 = x.chunk(2, -1)
        return x * cos.double()[:, None] + torch.cat((-x2, x1), -1) * sin.double()[:, None]

    q_out, k_out = tk.apply_rotary_pos_emb(q, k, cos, sin)
    assert_close64(q_out, rotate(q), dtype)
    assert_close64(k_out, rotate(k), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_modulation(tk, dtype):
    x, y = rand(2, 93, 2051, dtype=dtype, scale=2, offset=0.5), rand(2, 93, 2051, dtype=dtype)
    scale, shift, gate = (rand(2, 1, 2051, dtype=dtype, scale=0.2) for _ in range(3))
    x64 = x.double()
    norm = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert_close64(tk.norm_modulate(x, scale, shift, norm="rms", eps=1e-6),
                   norm * (1 + scale.double()) + shift.double(), dtype)
    assert_close64(tk.gated_add(x, y, gate), x64 + y.double() * gate.double(), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_fp8(tk, dtype):
    """Each row within half an e4m3 spacing of x once dequantized (scale = amax / 448; the spacing
    is 2^(e - 3) of the quotient, bounded by 448 / 16 = 28 at the top), its largest value on ±448."""
    x = rand(67, 4099, dtype=dtype, scale=3.0)
    codes, scale = tk.quantize_fp8(x)
    assert codes.dtype == torch.float8_e4m3fn and scale.shape == (67, 1)
    quotient = x.double() / scale.double()
    spacing = torch.exp2(torch.floor(torch.log2(quotient.abs().clamp(min=2.0**-6))) - 3)
    # the kernel's quotient is rounded to fp32 (2^-24 relative) before e4m3: a 1e-5 slack covers it
    assert ((codes.double() - quotient).abs() <= spacing / 2 * (1 + 1e-5)).all()
    assert (codes.float().abs().amax(-1) == 448).all()
    assert torch.allclose(scale.double().squeeze(-1), x.double().abs().amax(-1) / 448, rtol=1e-6, atol=0)


@pytest.mark.gpu
def test_attention_8bit(tk):
    """8-bit attention (bf16 in and out; compute capability 8.9+) on diffusers' [B, S, H, D] layout
    transposed, 77 tokens (a partial block of 64 keys), against float64: within the FP8 recipe's
    error (its emulation gives cosine 0.999, relative L2 4 % on such inputs)."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("attention_8bit needs compute capability 8.9 or later")
    q, k, v = (rand(2, 77, 3, 64, dtype=torch.bfloat16).transpose(1, 2) for _ in range(3))
    out = tk.attention_8bit(q, k, v)
    ref = torch.softmax(q.double() @ k.double().transpose(-1, -2) / 8, dim=-1) @ v.double()
    assert out.shape == q.shape and out.dtype == torch.bfloat16 and out.isfinite().all()
    cos = F.cosine_similarity(out.double().flatten(), ref.flatten(), dim=0).item()
    rel = ((out.double() - ref).norm() / ref.norm()).item()
    assert cos >= 0.998 and rel <= 0.06, (cos, rel)
