"""Fused linear cross-entropy: Python API, fake (meta) implementations and autograd.

``cross_entropy(hidden @ weight.T (+ bias), target)`` for a causal LM's last hidden states and its
``lm_head``, computed chunk by chunk over the tokens so that the ``[N, V]`` logits (8.4 GB in fp32
for 16 K tokens of a 128 K vocabulary) never exist. Per chunk (``csrc/loss/``): the logits GEMM
(cuBLAS, through torch), one kernel that computes each row's loss and overwrites the chunk's logits
with their gradient (softmax minus the smoothed one-hot, the soft-cap's chain rule, the reduction's
scale; fp32 math), then the GEMMs of the hidden's and the weight's gradients from it.

Chunks: about as many logits as the hidden has elements (``N / ceil(V / H)`` tokens rounded up to a
power of two, Liger-Kernel's rule), so the extra memory is about one more hidden state.

As Liger-Kernel does, the gradients are computed in the forward when they are needed (grad mode,
an input requiring grad; reductions "mean" and "sum") and the backward scales them by the incoming
gradient: one pass over the logits instead of two. With ``reduction="none"`` each row's gradient
depends on the incoming one, so the backward recomputes the logits chunk by chunk. The weight's
gradient is accumulated over the chunks in the weight's dtype (one rounding per chunk, as Liger),
which keeps the memory at one ``[V, H]`` gradient.
"""

from typing import Optional

import torch

from ._autograd import dispatch, register_backward
from ._fake import register_fake
from ._ops import ops

REDUCTIONS = ("mean", "sum", "none")


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                               bias: Optional[torch.Tensor] = None, ignore_index: int = -100,
                               reduction: str = "mean", label_smoothing: float = 0.0,
                               softcap: Optional[float] = None, *, chunk_rows: int = 0) -> torch.Tensor:
    """``F.cross_entropy(hidden @ weight.T + bias, target, ...)`` without the logits.

    Parameters
    ----------
    hidden : torch.Tensor
        ``[..., H]``: the last hidden states (any strides), CUDA float32/float16/bfloat16 (CPU tensors
        run a reference path of the same chunk loop).
    weight : torch.Tensor
        ``[V, H]``, hidden's dtype: ``lm_head.weight``.
    target : torch.Tensor
        ``hidden.shape[:-1]``, int64 class indices (already shifted for a causal LM).
    bias : torch.Tensor, optional
        ``[V]``, hidden's dtype.
    ignore_index : int
        Targets equal to it add nothing to the loss nor to the ``"mean"``'s count.
    reduction : str
        ``"mean"`` (over the targets not ignored; NaN when all are, as PyTorch), ``"sum"`` or ``"none"``.
    label_smoothing : float
        In ``[0, 1]``, as ``F.cross_entropy``'s.
    softcap : float, optional
        Gemma 2's final-logit soft-capping: the logits become ``softcap * tanh(logits / softcap)``.
    chunk_rows : int
        Tokens per chunk; 0 chooses them from the shapes (module docstring).

    Returns
    -------
    torch.Tensor
        float32 (float64 for float64 CPU inputs), as transformers' loss upcasts the logits: a scalar,
        or ``target``'s shape for ``"none"``. Differentiable with respect to hidden, weight and bias.

    Under ``torch.autocast`` the inputs are cast to the autocast dtype first (as ``F.linear`` would).
    """
    if reduction not in REDUCTIONS:
        raise ValueError(f"fused_linear_cross_entropy: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if hidden.dim() < 1 or tuple(target.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(f"fused_linear_cross_entropy: target must have hidden's shape without its last dimension "
                         f"{tuple(hidden.shape[:-1])}, got {tuple(target.shape)}")
    device_type = hidden.device.type
    if device_type in ("cuda", "cpu") and torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
    grad = torch.is_grad_enabled() and reduction != "none"
    compute_grads = [grad and hidden.requires_grad, grad and weight.requires_grad,
                     grad and bias is not None and bias.requires_grad]
    loss = dispatch(_fused_linear_cross_entropy, hidden.reshape(-1, hidden.shape[-1]), weight, target.reshape(-1),
                    bias, ignore_index, reduction, float(label_smoothing), None if softcap is None else float(softcap),
                    compute_grads, chunk_rows)[0]
    return loss.view(target.shape) if reduction == "none" else loss


_fused_linear_cross_entropy = ops.fused_linear_cross_entropy.default
_fused_linear_cross_entropy_backward = ops.fused_linear_cross_entropy_backward.default


# ---- fake (meta) implementations ----

def _loss_dtype(hidden: torch.Tensor) -> torch.dtype:
    return torch.float64 if hidden.dtype == torch.float64 else torch.float32


def _check_reduction(op: str, reduction: str) -> None:
    torch._check(reduction in REDUCTIONS, lambda: f"{op}: reduction must be one of {REDUCTIONS}, got {reduction!r}")


def _grads_like(hidden, weight, bias, compute_grads):
    """The gradient outputs the C++ op returns: the asked ones, empty [0] tensors otherwise."""
    want_h, want_w, want_b = compute_grads
    return (hidden.new_empty(hidden.shape) if want_h else hidden.new_empty(0),
            weight.new_empty(weight.shape) if want_w else weight.new_empty(0),
            bias.new_empty(bias.shape) if want_b and bias is not None else hidden.new_empty(0))


@register_fake("fused_linear_cross_entropy")
def _(hidden, weight, target, bias, ignore_index, reduction, label_smoothing, softcap, compute_grads, chunk_rows):
    _check_reduction("fused_linear_cross_entropy", reduction)
    torch._check(reduction != "none" or not any(compute_grads),
                 lambda: "fused_linear_cross_entropy: reduction='none' computes its gradients in the backward")
    shape = (hidden.shape[0],) if reduction == "none" else ()
    return (hidden.new_empty(shape, dtype=_loss_dtype(hidden)), *_grads_like(hidden, weight, bias, compute_grads))


@register_fake("fused_linear_cross_entropy_backward")
def _(grad_loss, hidden, weight, target, bias, ignore_index, reduction, label_smoothing, softcap, compute_grads,
      chunk_rows):
    _check_reduction("fused_linear_cross_entropy_backward", reduction)
    return _grads_like(hidden, weight, bias, compute_grads)


# ---- autograd ----

def _setup_context(ctx, inputs, output):
    hidden, weight, target, bias, ignore_index, reduction, label_smoothing, softcap, compute_grads, chunk_rows = inputs
    _, grad_hidden, grad_weight, grad_bias = output
    ctx.mark_non_differentiable(grad_hidden, grad_weight, grad_bias)
    # The gradient outputs never receive a gradient: without this, autograd would hand the backward
    # zeros of their shapes (another [N, H] and [V, H] at the backward's peak) that it ignores.
    ctx.set_materialize_grads(False)
    needed = [hidden.requires_grad, weight.requires_grad, bias is not None and bias.requires_grad]
    ctx.precomputed = reduction != "none"
    ctx.args = (ignore_index, reduction, label_smoothing, softcap, chunk_rows)
    ctx.has_bias = bias is not None
    if ctx.precomputed:
        missing = [name for name, need, done in zip(("hidden", "weight", "bias"), needed, compute_grads)
                   if need and not done]
        if missing:
            raise RuntimeError(f"fused_linear_cross_entropy: {', '.join(missing)} requires grad but compute_grads "
                               f"{list(compute_grads)} did not ask for its gradient; call "
                               f"transformer_kernels.fused_linear_cross_entropy, which sets it")
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.used = False
    else:
        ctx.save_for_backward(hidden, weight, target, bias)


def _backward(ctx, grad_loss, _grad_hidden, _grad_weight, _grad_bias):
    needs = ctx.needs_input_grad
    if grad_loss is None:  # not materialized (set_materialize_grads(False)): nothing reached the loss
        return (None,) * 10
    if ctx.precomputed:
        # The gradients of loss = 1, computed in the forward: scaled by the incoming gradient, in
        # place on eager tensors (no second [V, H] buffer), out of place on traced ones
        # (torch.compile's functional tensors, fake tensors). Handed over detached (as Liger
        # does): a fresh tensor that nothing else references, which AccumulateGrad takes as the
        # leaf's .grad; the op's own output may still be referenced (its Python object), and a
        # gradient referenced elsewhere is copied there (one more [V, H] and [N, H]).
        if ctx.used:
            raise RuntimeError("fused_linear_cross_entropy: backward ran twice through the same call (retain_graph); "
                               "its gradients are computed in the forward and given out once")
        ctx.used = True
        grad_hidden, grad_weight, grad_bias = ((g.mul_(grad_loss) if type(g) is torch.Tensor else g * grad_loss).detach()
                                               for g in ctx.saved_tensors)
    else:
        hidden, weight, target, bias = ctx.saved_tensors
        ignore_index, reduction, label_smoothing, softcap, chunk_rows = ctx.args
        mask = [needs[0], needs[1], ctx.has_bias and needs[3]]
        grad_hidden, grad_weight, grad_bias = _fused_linear_cross_entropy_backward(
            grad_loss, hidden, weight, target, bias, ignore_index, reduction, label_smoothing, softcap, mask,
            chunk_rows)
    return (grad_hidden if needs[0] else None, grad_weight if needs[1] else None, None,
            grad_bias if ctx.has_bias and needs[3] else None, None, None, None, None, None, None)


register_backward("fused_linear_cross_entropy", _backward, _setup_context)
