"""The group_norm family's eager CPU stand-ins (tests/eager_kernel.py gathers them): diffusers'
GroupNorm (+ the time embedding's add, + the activation), reference/group_norm.py; the backward is
autograd of that code in float32 (each gradient cast to its input's dtype)."""

from eager_kernel import vjp
from reference.group_norm import eager_group_norm

IMPLS = {
    "group_norm": lambda x, g, w, b, eps, act: eager_group_norm(x, g, w, b, eps, None if act == "none" else act),
    "add_group_norm": lambda x, bnc, g, w, b, eps, act: eager_group_norm(x, g, w, b, eps,
                                                                      None if act == "none" else act, bias_nc=bnc),
}


def _group_norm_backward(grad, x, bias_nc, groups, w, b, eps, act, mask):
    activation = None if act == "none" else act
    if x.numel() == 0:  # eager's statistics of no element are NaN; a gradient summed over nothing is 0
        asked = [t is not None and m for t, m in zip((x, bias_nc, w, b), mask)]
        return tuple(t.new_zeros(t.shape) if a else x.new_empty((0,)) for t, a in zip((x, bias_nc, w, b), asked))
    if bias_nc is None:
        dx, dw, db = vjp(lambda x_, w_, b_: eager_group_norm(x_, groups, w_, b_, eps, activation), (x, w, b), (grad,),
                         [mask[0], mask[2], mask[3]], x)
        return dx, x.new_empty((0,)), dw, db
    return vjp(lambda x_, bnc, w_, b_: eager_group_norm(x_, groups, w_, b_, eps, activation, bias_nc=bnc),
               (x, bias_nc, w, b), (grad,), mask, x)


BACKWARD = {"group_norm_backward": _group_norm_backward}
