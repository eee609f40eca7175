"""The activation family's eager CPU stand-ins (tests/eager_kernel.py gathers them): the eager code
of reference/activations.py, and the backward ops in closed form (ATen's derivative formulas)."""

import torch

from reference.activations import eager_act_and_mul, eager_act_mul, eager_activation

IMPLS = {
    "activation": lambda x, act: eager_activation(x, act),
    "act_and_mul": lambda x, act, first: eager_act_and_mul(x, act, first),
    "act_mul": lambda g, u, act: eager_act_mul(g, u, act),
}


def _act_grad(x, act):
    """act'(x) in fp32 (ATen's formulas)."""
    x = x.float()
    if act == "silu":
        sig = torch.sigmoid(x)
        return sig * (1 + x * (1 - sig))
    if act == "gelu":
        return 0.5 * (1 + torch.erf(x * 0.7071067811865476)) + x * torch.exp(-0.5 * x * x) * 0.3989422804014327
    beta, kappa = 0.7978845608028654, 0.044715
    t = torch.tanh(beta * (x + kappa * x ** 3))
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * beta * (1 + 3 * kappa * x * x)


def _act_mul_grads(g, a, b, act):
    return (_act_grad(a, act) * (g * b).float()).to(a.dtype), g * eager_activation(a, act)


def _act_and_mul_grad(g, x, act, first):
    lo, hi = x.chunk(2, dim=-1)
    a, b = (lo, hi) if first else (hi, lo)
    da, db = _act_mul_grads(g, a, b, act)
    return torch.cat((da, db) if first else (db, da), dim=-1)


BACKWARD = {
    "activation_backward": lambda g, x, act: (_act_grad(x, act) * g.float()).to(x.dtype),
    "act_and_mul_backward": _act_and_mul_grad,
    "act_mul_backward": lambda g, gate, up, act: _act_mul_grads(g, gate, up, act),
}
