"""Cross-entropy references: float64 math and the eager code of a causal LM's loss."""

from typing import Optional

import torch
import torch.nn.functional as F


def softcapped(logits: torch.Tensor, softcap: Optional[float]) -> torch.Tensor:
    """Gemma 2's final-logit soft-capping, as transformers writes it: divide, tanh, multiply."""
    if softcap is None:
        return logits
    return torch.tanh(logits / softcap) * softcap


def linear_cross_entropy_float64(hidden, weight, target, bias=None, ignore_index=-100, reduction="mean",
                                 label_smoothing=0.0, softcap=None):
    """``F.cross_entropy(hidden @ weight.T + bias, ...)`` in float64 (differentiable: the reference
    gradients are torch's autograd of this)."""
    logits = hidden.double() @ weight.double().T
    if bias is not None:
        logits = logits + bias.double()
    return F.cross_entropy(softcapped(logits, softcap), target, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)


def eager_causal_lm_loss(hidden, weight, target, bias=None, ignore_index=-100, reduction="mean",
                         label_smoothing=0.0, softcap=None):
    """What transformers computes: ``lm_head`` in the model dtype, the soft-cap in the model dtype
    (Gemma 2), then ``ForCausalLMLoss``'s upcast to float32 and ``F.cross_entropy``."""
    logits = softcapped(F.linear(hidden, weight, bias), softcap)
    return F.cross_entropy(logits.float(), target, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)
