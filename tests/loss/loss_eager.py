"""The loss family's eager CPU stand-ins (tests/eager_kernel.py gathers them): the fused linear
cross-entropy as F.linear, the softcap and F.cross_entropy, and its gradients in closed form (softmax
minus the smoothed one-hot, through the softcap's tanh), fp32 math."""

import torch
import torch.nn.functional as F


def _flce_grads(hidden, weight, target, bias, ignore_index, smoothing, softcap, scale):
    """dloss/dhidden, dloss/dweight of each row's loss times scale [N] (fp32 math)."""
    logits = F.linear(hidden, weight, bias).float()
    t = torch.tanh(logits / softcap) if softcap is not None else None
    z = t * softcap if softcap is not None else logits
    valid = target != ignore_index
    g = torch.softmax(z, -1) - smoothing / z.shape[-1]
    g.scatter_add_(1, target.clamp(min=0)[:, None], torch.full_like(g[:, :1], smoothing - 1))
    if softcap is not None:
        g = g * (1 - t * t)
    g = (g * (scale * valid)[:, None]).to(hidden.dtype)
    return g @ weight, g.T @ hidden


def _flce_loss(hidden, weight, target, bias, ignore_index, reduction, smoothing, softcap):
    logits = F.linear(hidden, weight, bias).float()
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return F.cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction, label_smoothing=smoothing)


def _row_scale(target, ignore_index, reduction, grad):
    n = target.shape[0]
    scale = grad.float().reshape(-1).expand(n) if grad is not None else torch.ones(n)
    return scale / (target != ignore_index).sum() if reduction == "mean" else scale


def _flce(hidden, weight, target, bias, ignore_index, reduction, smoothing, softcap, want, chunk_rows):
    loss = _flce_loss(hidden, weight, target, bias, ignore_index, reduction, smoothing, softcap)
    none = hidden.new_empty((0,))
    if not any(want):
        return loss, none, none, none
    dh, dw = _flce_grads(hidden, weight, target, bias, ignore_index, smoothing, softcap,
                         _row_scale(target, ignore_index, reduction, None))
    return loss, dh if want[0] else none, dw if want[1] else none, none


def _flce_backward(grad, hidden, weight, target, bias, ignore_index, reduction, smoothing, softcap, want, chunk_rows):
    dh, dw = _flce_grads(hidden, weight, target, bias, ignore_index, smoothing, softcap,
                         _row_scale(target, ignore_index, reduction, grad))
    none = hidden.new_empty((0,))
    return dh if want[0] else none, dw if want[1] else none, none


IMPLS = {"fused_linear_cross_entropy": _flce}
BACKWARD = {"fused_linear_cross_entropy_backward": _flce_backward}
