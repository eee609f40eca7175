"""The group_norm family's catalog entries (tests/op_catalog.py gathers them): group_norm with and
without affine parameters, add_group_norm (the time embedding's add), their out= forms and their
backward. x [N, C, *spatial] channels-first or channels-last (GROUP_NORM_SHAPES)."""

import torch

from op_catalog import EPS, Maker

# case -> (x's shape, groups, layout): whole groups, split groups (chunk moments combined inline, or by
# the finalize kernel past 32 chunks), the element-by-element path (odd spatial, misaligned), and
# channels-last ([N, C, L] for "strided": the channel stride is 1, the tensor not contiguous).
GROUP_NORM_SHAPES = {
    "small": ((2, 16, 4, 4), 4, "channels_first"),
    "aligned": ((2, 64, 16, 16), 8, "channels_first"),
    "wide": ((1, 64, 64, 64), 4, "channels_first"),
    "odd": ((2, 6, 5, 7), 3, "channels_first"),
    "unaligned": ((2, 16, 8, 8), 4, "offset"),
    "strided": ((2, 40, 36), 8, "channels_last"),
    "split": ((1, 8, 256, 256), 1, "channels_first"),
    "split_vec": ((1, 64, 48, 48), 8, "channels_last"),
    "empty": ((0, 16, 4, 4), 4, "channels_first"),
    "empty_width": ((2, 16, 0, 4), 4, "channels_first"),
}
CASES = tuple(GROUP_NORM_SHAPES)


def _gn_place(m: Maker, values: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "channels_last":
        return m.place(values.movedim(1, -1).contiguous()).movedim(-1, 1)
    return m.place(values, "offset" if layout == "offset" else "contiguous")


def entries():
    def gn(affine: bool, add: bool, out: bool, activation: str):
        def build(m, case):
            shape, groups, layout = GROUP_NORM_SHAPES[case]
            c = shape[1]
            x = _gn_place(m, m.values(shape), layout)
            w, b = (m.param(c), m.tensor((c,), scale=0.5, offset=0.0)) if affine else (None, None)
            args = ((x, m.tensor((shape[0], c), scale=0.5)) if add else (x,)) + (groups, w, b, EPS, activation)
            if not out:
                return args, ()
            dst = _gn_place(m, torch.full(shape, float("nan")), layout)
            return (dst, *args), (0,)
        return build

    def backward(affine: bool, add: bool, activation: str):
        """group_norm_backward: grad_out in x's layout, then the forward's arguments, every gradient asked."""
        def build(m, case):
            shape, groups, layout = GROUP_NORM_SHAPES[case]
            c = shape[1]
            x = _gn_place(m, m.values(shape), layout)
            grad = _gn_place(m, m.values(shape, scale=1.0, offset=0.0), layout)
            w, b = (m.param(c), m.tensor((c,), scale=0.5, offset=0.0)) if affine else (None, None)
            bias_nc = m.tensor((1 if add == "shared" else shape[0], c), scale=0.5) if add else None
            return (grad, x, bias_nc, groups, w, b, EPS, activation, [True] * 4), ()
        return build

    return {
        "group_norm": ("group_norm", gn(True, False, False, "silu")),
        "group_norm[plain]": ("group_norm", gn(False, False, False, "none")),
        "group_norm_out": ("group_norm_out", gn(True, False, True, "none")),
        "add_group_norm": ("add_group_norm", gn(True, True, False, "silu")),
        "add_group_norm_out": ("add_group_norm_out", gn(False, True, True, "silu")),
        "group_norm_backward": ("group_norm_backward", backward(True, None, "silu")),
        "group_norm_backward[plain]": ("group_norm_backward", backward(False, None, "none")),
        "group_norm_backward[add]": ("group_norm_backward", backward(True, "per_sample", "silu")),
        "group_norm_backward[add_shared]": ("group_norm_backward", backward(False, "shared", "none")),
    }
