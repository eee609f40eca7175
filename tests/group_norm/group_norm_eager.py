"""The group_norm family's eager CPU stand-ins (tests/eager_kernel.py gathers them): diffusers'
GroupNorm (+ the time embedding's add, + the activation), reference/group_norm.py."""

from reference.group_norm import eager_group_norm

IMPLS = {
    "group_norm": lambda x, g, w, b, eps, act: eager_group_norm(x, g, w, b, eps, None if act == "none" else act),
    "add_group_norm": lambda x, bnc, g, w, b, eps, act: eager_group_norm(x, g, w, b, eps,
                                                                      None if act == "none" else act, bias_nc=bnc),
}
