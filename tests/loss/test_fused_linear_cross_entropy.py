"""Fused linear cross-entropy on the GPU: loss and gradients against F.cross_entropy(hidden @ W.T, ...)
in float64 with every option (ignore_index, reductions, label smoothing, soft-capping, bias), chunk
boundaries and vocabularies the vector path does not divide, all-ignored batches, transformers'
eager loss, peak memory, opcheck and torch.compile. (The chunk loop alone: tests/training/test_training_cpu.py.)"""

import math

import pytest
import torch

from helpers import DTYPES, SUBNORMAL_ROUNDOFF, UNIT_ROUNDOFF
from reference.loss import eager_causal_lm_loss, linear_cross_entropy_float64, softcapped

pytestmark = pytest.mark.gpu


def inputs(N, H, V, dtype, ignore_share=0.2, bias=False, seed=0, scale=1.0, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    hidden = (torch.randn(N, H, device=device, generator=g) * scale + 0.1).to(dtype).requires_grad_()
    weight = (torch.randn(V, H, device=device, generator=g) / math.sqrt(H)).to(dtype).requires_grad_()
    target = torch.randint(0, V, (N,), device=device, generator=g)
    target[torch.rand(N, device=device, generator=g) < ignore_share] = -100
    b = (torch.randn(V, device=device, generator=g) * 0.3).to(dtype).requires_grad_() if bias else None
    return hidden, weight, target, b


def reference(hidden, weight, target, b, grad_out, **options):
    """float64 loss and torch's autograd gradients of it, at our inputs' (rounded) values; and the
    float64 logits' gradient (what the kernel writes), for the bounds."""
    leaves = [t.detach().double().requires_grad_() for t in (hidden, weight) + ((b,) if b is not None else ())]
    loss = linear_cross_entropy_float64(leaves[0], leaves[1], target, leaves[2] if b is not None else None, **options)
    grads = torch.autograd.grad(loss, leaves, grad_out.double())
    return loss.detach(), grads


def chunks_of(N, H, V, chunk_rows):
    if chunk_rows:
        return math.ceil(N / chunk_rows)
    rows = 1 << max(0, math.ceil(math.log2(max(1, math.ceil(N / math.ceil(V / H))))))
    return math.ceil(N / min(rows, N))


def check(ours_loss, ours_grads, ref_loss, ref_grads, hidden, weight, target, b, options, chunks, grad_out=None):
    """Bounds from the roundings: the logits are rounded to the input dtype (u |l|) before fp32 math,
    the logits' gradient is rounded to it (u |dl|), each GEMM rounds its fp32 sum once, and the
    weight's gradient once more per chunk (accumulated in the weight's dtype)."""
    u = UNIT_ROUNDOFF[hidden.dtype]
    logits = hidden.detach().double() @ weight.detach().double().T
    if b is not None:
        logits = logits + b.detach().double()
    lmax = softcapped(logits, options.get("softcap")).abs().amax(-1)
    # loss: each row's logits off by u |l| at most move its loss by 2 u max|l|
    valid = target != options.get("ignore_index", -100)
    row_bound = 4 * u * (lmax + 1) + 1e-5
    if options.get("reduction", "mean") == "none":
        assert ((ours_loss.double() - ref_loss).abs() <= row_bound).all(), "per-row loss"
    else:
        total = row_bound[valid].sum() / (valid.sum() if options.get("reduction", "mean") == "mean" else 1)
        assert (ours_loss.double() - ref_loss).abs() <= total + 1e-6, f"loss {ours_loss.item()} vs {ref_loss.item()}"
    # gradients: relative to what their GEMMs sum (|dl| |W|, |dl|^T |h|, sum |dl|)
    p = torch.softmax(softcapped(logits, options.get("softcap")), -1)
    onehot = (torch.arange(p.shape[1], device=p.device) == target.clamp(min=0)[:, None]).double()
    dl_mag = p + onehot + options.get("label_smoothing", 0.0) / p.shape[1]
    dl_mag = dl_mag * valid[:, None]
    scale = 1 / max(1, valid.sum().item()) if options.get("reduction", "mean") == "mean" else 1.0
    if grad_out is not None:  # the incoming gradient: per row ("none") or one
        dl_mag = dl_mag * (grad_out.double().abs()[:, None] if grad_out.dim() else grad_out.double().abs())
    c = 4 + (lmax.max().item() + 1) * 2  # the logits' rounding, through softmax, and the dl and GEMM roundings
    mags = [dl_mag @ weight.detach().double().abs() * scale, dl_mag.T @ hidden.detach().double().abs() * scale]
    ulps = [c, c + chunks]
    if b is not None:
        mags.append(dl_mag.sum(0) * scale)
        ulps.append(c + 1)
    sums = [weight.shape[0], hidden.shape[0], hidden.shape[0]]  # terms each GEMM (or the bias' sum) adds
    for name, ours, ref, mag, k, terms in zip(("hidden", "weight", "bias"), ours_grads, ref_grads, mags, ulps, sums):
        assert ours.dtype == hidden.dtype and ours.shape == ref.shape, name
        assert not ours.isnan().any(), f"grad {name}: NaN"
        err = (ours.double() - ref).abs()
        # the fp32 accumulation of `terms` products: about sqrt(terms) fp32 roundings
        # (and each of the k roundings errs by up to SUBNORMAL_ROUNDOFF where the value is subnormal:
        # fp16 weight gradients of small logits' gradients)
        bound = ((k * u + 2 * math.sqrt(terms) * UNIT_ROUNDOFF[torch.float32]) * mag + 1e-7 * mag.max()
                 + k * SUBNORMAL_ROUNDOFF[hidden.dtype])
        worst = (err - bound).max().item()
        assert worst <= 0, f"grad {name}: max error {err.max().item():.3g} exceeds the bound by {worst:.3g}"


OPTIONS = [
    dict(),
    dict(reduction="sum"),
    dict(reduction="none"),
    dict(label_smoothing=0.1),
    dict(softcap=30.0),
    dict(softcap=5.0, label_smoothing=0.2, reduction="sum"),
    dict(ignore_index=3, label_smoothing=0.05, reduction="none"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
def test_flce_vs_float64(tk, dtype, options, bias):
    N, H, V = 301, 128, 3001  # V odd: the kernel's scalar tail; N: partial last chunk
    hidden, weight, target, b = inputs(N, H, V, dtype, bias=bias)
    if "ignore_index" in options:
        target[target == -100] = options["ignore_index"]
    loss = tk.fused_linear_cross_entropy(hidden, weight, target, b, chunk_rows=64, **options)
    grad_out = torch.rand_like(loss) + 0.5
    grads = torch.autograd.grad(loss, [t for t in (hidden, weight, b) if t is not None], grad_out)
    ref_loss, ref_grads = reference(hidden, weight, target, b, grad_out, **options)
    check(loss, grads, ref_loss, ref_grads, hidden, weight, target, b, options, chunks_of(N, H, V, 64), grad_out)


@pytest.mark.parametrize("N, H, V, chunk_rows", [
    (1, 64, 7, 0),          # one token, a vocabulary smaller than a vector
    (37, 64, 32001, 0),     # Llama-2's vocabulary (not a multiple of 8): one-token chunks by the rule
    (1000, 256, 50257, 0),  # GPT-2's: the rule picks 8-token chunks (125)
    (513, 64, 4096, 512),   # a last chunk of one token
    (64, 2048, 128256, 0),  # Llama-3's vocabulary: 2-token chunks (32)
])
def test_flce_shapes_and_chunks(tk, N, H, V, chunk_rows):
    dtype = torch.bfloat16
    hidden, weight, target, _ = inputs(N, H, V, dtype, seed=N)
    loss = tk.fused_linear_cross_entropy(hidden, weight, target, chunk_rows=chunk_rows)
    grads = torch.autograd.grad(loss, (hidden, weight))
    ref_loss, ref_grads = reference(hidden, weight, target, None, torch.ones((), device="cuda"))
    check(loss, grads, ref_loss, ref_grads, hidden, weight, target, None, {}, chunks_of(N, H, V, chunk_rows))


def test_flce_all_ignored_and_empty(tk):
    hidden, weight, target, _ = inputs(40, 64, 500, torch.bfloat16, ignore_share=1.0)
    loss = tk.fused_linear_cross_entropy(hidden, weight, target)
    assert loss.isnan()  # 0 / 0, as F.cross_entropy
    dh, dw = torch.autograd.grad(loss, (hidden, weight))
    assert torch.equal(dh, torch.zeros_like(dh)) and torch.equal(dw, torch.zeros_like(dw))
    for reduction in ("sum", "none"):
        out = tk.fused_linear_cross_entropy(hidden, weight, target, reduction=reduction)
        assert torch.equal(out, torch.zeros_like(out))
    empty_h, empty_t = hidden[:0].detach().requires_grad_(), target[:0]
    loss = tk.fused_linear_cross_entropy(empty_h, weight, empty_t, reduction="sum")
    dh, dw = torch.autograd.grad(loss, (empty_h, weight))
    assert loss.item() == 0 and dh.shape == (0, 64) and torch.equal(dw, torch.zeros_like(dw))


def test_flce_matches_transformers_eager_loss(tk):
    """transformers' path (bf16 lm_head, fp32 cross-entropy, Gemma 2's soft-cap in bf16): close to
    ours (the soft-cap's bf16 roundings are eager's own error)."""
    hidden, weight, target, _ = inputs(512, 256, 8000, torch.bfloat16)
    for options in (dict(), dict(softcap=30.0), dict(label_smoothing=0.1)):
        ours = tk.fused_linear_cross_entropy(hidden, weight, target, **options)
        eager = eager_causal_lm_loss(hidden, weight, target, **options)
        torch.testing.assert_close(ours, eager, rtol=5e-3, atol=5e-3)
        g_ours = torch.autograd.grad(ours, (hidden, weight))
        g_eager = torch.autograd.grad(eager, (hidden, weight))
        for a, e in zip(g_ours, g_eager):
            rel = (a.double() - e.double()).norm() / e.double().norm()
            assert rel < 2e-2, f"{options}: relative gradient difference {rel:.3g}"


def test_flce_peak_memory_far_below_the_logits(tk):
    """16 K tokens of a 128 K vocabulary: the fp32 logits alone would be 8.4 GB; ours needs about
    one extra hidden state of logits per chunk and the [V, H] gradient."""
    N, H, V = 16384, 2048, 128256
    hidden, weight, target, _ = inputs(N, H, V, torch.bfloat16, ignore_share=0.0)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    loss = tk.fused_linear_cross_entropy(hidden, weight, target)
    torch.cuda.synchronize()
    forward = torch.cuda.max_memory_allocated() - base
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    torch.cuda.synchronize()
    backward = torch.cuda.max_memory_allocated() - base
    extra = max(forward, backward)
    grads = (N * H + V * H) * 2
    chunk = chunks_of(N, H, V, 0)
    chunk_logits = math.ceil(N / chunk) * V * 2
    where = (f"forward {forward / 1e9:.3f} GB, backward {backward / 1e9:.3f} GB; the gradients {grads / 1e9:.3f} GB, "
             f"a chunk's logits {chunk_logits / 1e9:.3f} GB")
    assert extra <= grads + chunk_logits + (64 << 20), f"peak extra {extra / 1e9:.2f} GB ({where})"
    # the backward hands the forward's gradients to the leaves (no copy of them: AccumulateGrad steals)
    assert backward <= grads + (64 << 20), f"the backward copied the gradients ({where})"
    assert extra < N * V * 4 / 4


def test_flce_gradients_reach_the_leaves_without_a_copy(tk):
    """The leaves' .grad are the op's own gradient buffers, computed in the forward: no [V, H] copy
    (even where the op's outputs are still referenced, as this dispatch mode keeps them)."""
    from grad_helpers import KeepFlceGradients

    hidden, weight, target, _ = inputs(300, 64, 5000, torch.bfloat16)
    with KeepFlceGradients() as kept:
        loss = tk.fused_linear_cross_entropy(hidden, weight, target)
    loss.backward()
    assert [g.data_ptr() for g in kept.grads] == [hidden.grad.data_ptr(), weight.grad.data_ptr()]


def test_flce_opcheck_and_compile(tk):
    hidden, weight, target, b = inputs(70, 64, 300, torch.bfloat16, bias=True)
    args = (hidden, weight, target, b, -100, "mean", 0.1, 20.0, [True, True, True], 16)
    torch.library.opcheck(tk.ops.fused_linear_cross_entropy.default, args)
    torch.library.opcheck(tk.ops.fused_linear_cross_entropy.default,
                          (hidden, weight, target, b, -100, "none", 0.0, None, [False, False, False], 0))
    torch.library.opcheck(tk.ops.fused_linear_cross_entropy_backward.default,
                          (torch.rand(70, device="cuda"), hidden.detach(), weight.detach(), target, b.detach(), -100,
                           "none", 0.1, None, [True, True, True], 16))
    torch._dynamo.reset()

    def step(h, w, t):
        return tk.fused_linear_cross_entropy(h, w, t, label_smoothing=0.1)

    loss = torch.compile(step, fullgraph=True)(hidden, weight, target)
    ref = step(hidden, weight, target)
    torch.testing.assert_close(loss, ref)
    for a, e in zip(torch.autograd.grad(loss, (hidden, weight)), torch.autograd.grad(ref, (hidden, weight))):
        assert torch.equal(a, e)
