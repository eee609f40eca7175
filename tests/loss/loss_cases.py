"""The loss family's catalog entries (tests/op_catalog.py gathers them): the fused linear
cross-entropy and its backward. hidden [B*S, H] in the row case's layout, a vocabulary of 37; its
hidden is 2-D: no "strided" case, whose check wants a 3-D view (the GEMMs take any strides)."""

import torch

from op_catalog import CASES as ROW_CASES
from op_catalog import rows

LOSS_VOCAB = 37
CASES = tuple(c for c in ROW_CASES if c != "strided")


def entries():
    def inputs(m, case):
        (B, S, H), lay = rows(m, case)
        hidden = m.tensor((B * S, H), lay, scale=1.0, offset=0.0)
        weight = m.tensor((LOSS_VOCAB, H), scale=0.2, offset=0.0)
        target = torch.randint(0, LOSS_VOCAB, (B * S,), generator=m.gen)
        target[::3] = -100
        return hidden, weight, target.to(m.device)

    def flce(reduction: str, grads: bool):
        def build(m, case):
            hidden, weight, target = inputs(m, case)
            return (hidden, weight, target, None, -100, reduction, 0.1, 20.0, [grads, grads, False], 0), ()
        return build

    def flce_backward(m, case):
        hidden, weight, target = inputs(m, case)
        grad = m.place(m.uniform((hidden.shape[0],), 0.5, 1.5), rows(m, case)[1], dtype=torch.float32)
        return (grad, hidden, weight, target, None, -100, "none", 0.0, None, [True, True, False], 0), ()

    return {
        "fused_linear_cross_entropy[sum,grads]": ("fused_linear_cross_entropy", flce("sum", True)),
        "fused_linear_cross_entropy[none]": ("fused_linear_cross_entropy", flce("none", False)),
        "fused_linear_cross_entropy_backward[none]": ("fused_linear_cross_entropy_backward", flce_backward),
    }
