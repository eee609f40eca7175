"""The norm family's catalog entries (tests/op_catalog.py gathers them): rms_norm, fused_add_rms_norm,
layer_norm, norm_modulate and gated_add_norm_modulate with their out=, in-place, FP8 and backward
forms, and gated_add (x + gate * y, the elementwise kernel's gated form) with its backward. Rows
[B, S, H] of the row cases (op_catalog.ROW_SHAPES)."""

import torch

from op_catalog import EPS, rows


def entries():
    return {**_norm_entries(), **_gated_add_entries()}


def _norm_entries():
    def rms(weight: str, rounding: str):
        def build(m, case):
            (B, S, H), lay = rows(m, case)
            w = None if weight == "none" else m.param(H, torch.float32 if weight == "fp32" else None)
            return (m.tensor((B, S, H), lay), w, EPS, rounding), ()
        return build

    def rms_out(m, case):
        (B, S, H), lay = rows(m, case)
        w = m.param(H, torch.float32)
        out_dtype = torch.float32  # diffusers' rounding returns the weight's dtype
        return (m.nan((B, S, H), lay, out_dtype), m.tensor((B, S, H), lay), w, EPS, "diffusers"), (0,)

    def fused_add(m, case):
        (B, S, H), lay = rows(m, case)
        return (m.tensor((B, S, H), lay), m.tensor((B, S, H), lay), m.param(H), EPS, "hf"), ()

    def fused_add_fp32_weight(m, case):
        (B, S, H), lay = rows(m, case)
        return (m.tensor((B, S, H), lay), m.tensor((B, S, H), lay), m.param(H, torch.float32), EPS, "hf"), ()

    def fused_add_out(m, case):
        (B, S, H), lay = rows(m, case)
        return (m.nan((B, S, H), lay), m.nan((B, S, H), lay), m.tensor((B, S, H), lay), m.tensor((B, S, H), lay),
                m.param(H, torch.float32), EPS, "torch"), (0, 1)

    def fused_add_inplace(m, case):
        (B, S, H), lay = rows(m, case)
        return (m.tensor((B, S, H), lay), m.tensor((B, S, H), lay), m.param(H), EPS, "hf"), (0, 1)

    def layer(fp32: bool):
        def build(m, case):
            (B, S, H), lay = rows(m, case)
            pd = torch.float32 if fp32 else None
            return (m.tensor((B, S, H), lay), m.param(H, pd), m.param(H, pd), 1e-5), ()
        return build

    def layer_out(m, case):
        (B, S, H), lay = rows(m, case)
        return (m.nan((B, S, H), lay), m.tensor((B, S, H), lay), m.param(H), None, 1e-5), (0,)

    def mod_args(m, B, H):
        return m.tensor((B, 1, H), scale=0.5, offset=0.0), m.tensor((B, 1, H), scale=1.0, offset=0.0)

    def modulate(norm: str):
        def build(m, case):
            (B, S, H), lay = rows(m, case)
            x = m.tensor((B, S, H), lay)
            scale, shift = mod_args(m, B, H)
            w, b = (m.param(H), m.param(H)) if norm == "layer" else (None, None)
            return (x, scale, shift, w, b, EPS, norm), ()
        return build

    def modulate_out(m, case):
        (B, S, H), lay = rows(m, case)
        x = m.tensor((B, S, H), lay)
        scale, shift = mod_args(m, B, H)
        return (m.nan((B, S, H), lay), x, scale, shift, m.param(H), None, EPS, "rms"), (0,)

    def gated(norm: str, gate: bool):
        def build(m, case):
            (B, S, H), lay = rows(m, case)
            x, y = m.tensor((B, S, H), lay), m.tensor((B, S, H), lay)
            g = m.tensor((B, 1, H), scale=0.5) if gate else None
            scale, shift = mod_args(m, B, H)
            w, b = (m.param(H, torch.float32), m.param(H, torch.float32)) if norm == "layer" else (None, None)
            return (x, y, g, scale, shift, w, b, EPS, norm), ()
        return build

    def gated_out(m, case):
        (B, S, H), lay = rows(m, case)
        x, y = m.tensor((B, S, H), lay), m.tensor((B, S, H), lay)
        g = m.tensor((B, 1, H), scale=0.5)
        scale, shift = mod_args(m, B, H)
        return (m.nan((B, S, H), lay), m.nan((B, S, H), lay), x, y, g, scale, shift, None, None, EPS, "rms"), (0, 1)

    def grad_of(forward, like: int, saved, mask):
        """A backward op's call: grad_out in the layout of the forward's argument `like`, then
        saved(forward's arguments) (what its autograd passes on), then the output mask."""
        def build(m, case):
            args, _ = forward(m, case)
            x = args[like]
            lay = rows(m, case)[1]
            return (m.tensor(x.shape, lay, scale=1.0, offset=0.0), *saved(args), list(mask)), ()
        return build

    def fused_add_backward(grad_h: bool):
        def build(m, case):
            (B, S, H), lay = rows(m, case)
            h = m.tensor((B, S, H), lay)  # residual_out: the normalized sum
            g_h = m.tensor((B, S, H), lay, scale=1.0, offset=0.0) if grad_h else None
            return (m.tensor((B, S, H), lay, scale=1.0, offset=0.0), g_h, h, m.param(H), EPS, [True, True]), ()
        return build

    def gated_backward(norm: str, gate: bool):
        def build(m, case):
            (x, y, g, scale, shift, w, b, eps, n), _ = gated(norm, gate)(m, case)
            lay = rows(m, case)[1]
            grads = [m.tensor(x.shape, lay, scale=1.0, offset=0.0) for _ in range(2)]  # grad_out, grad_h
            h = x  # the saved sum h (any values: the backward reads h, not x)
            return (*grads, h, y, g, scale, shift, w, b, eps, n, [True] * 7), ()
        return build

    return {
        "rms_norm": ("rms_norm", rms("same", "hf")),
        "rms_norm[fp32_weight]": ("rms_norm", rms("fp32", "hf")),
        "rms_norm[torch,no_weight]": ("rms_norm", rms("none", "torch")),
        "rms_norm_out": ("rms_norm_out", rms_out),
        "fused_add_rms_norm": ("fused_add_rms_norm", fused_add),
        "fused_add_rms_norm[fp32_weight]": ("fused_add_rms_norm", fused_add_fp32_weight),
        "fused_add_rms_norm_out": ("fused_add_rms_norm_out", fused_add_out),
        "fused_add_rms_norm_": ("fused_add_rms_norm_", fused_add_inplace),
        "layer_norm": ("layer_norm", layer(False)),
        "layer_norm[fp32_params]": ("layer_norm", layer(True)),
        "layer_norm_out": ("layer_norm_out", layer_out),
        "norm_modulate": ("norm_modulate", modulate("rms")),
        "norm_modulate[layer]": ("norm_modulate", modulate("layer")),
        "norm_modulate_out": ("norm_modulate_out", modulate_out),
        "gated_add_norm_modulate": ("gated_add_norm_modulate", gated("rms", True)),
        "gated_add_norm_modulate[layer,no_gate]": ("gated_add_norm_modulate", gated("layer", False)),
        "gated_add_norm_modulate_out": ("gated_add_norm_modulate_out", gated_out),
        # the FP8 outputs (e4m3 codes and row scales of the same values)
        "rms_norm_fp8": ("rms_norm_fp8", rms("same", "hf")),
        "rms_norm_fp8[fp32_weight]": ("rms_norm_fp8", rms("fp32", "hf")),
        "fused_add_rms_norm_fp8": ("fused_add_rms_norm_fp8", fused_add),
        "layer_norm_fp8": ("layer_norm_fp8", layer(False)),
        "layer_norm_fp8[fp32_params]": ("layer_norm_fp8", layer(True)),
        "norm_modulate_fp8": ("norm_modulate_fp8", modulate("rms")),
        "norm_modulate_fp8[layer]": ("norm_modulate_fp8", modulate("layer")),
        "gated_add_norm_modulate_fp8": ("gated_add_norm_modulate_fp8", gated("rms", True)),
        "gated_add_norm_modulate_fp8[layer,no_gate]": ("gated_add_norm_modulate_fp8", gated("layer", False)),
        # backward: the outputs' gradients first (x's layout), then what the forward saved
        "rms_norm_backward": ("rms_norm_backward", grad_of(rms("same", "hf"), 0, lambda a: (a[0], a[1], EPS),
                                                           [True, True])),
        "rms_norm_backward[fp32_weight]": ("rms_norm_backward", grad_of(rms("fp32", "hf"), 0,
                                                                         lambda a: (a[0], a[1], EPS), [True, True])),
        "rms_norm_backward[no_weight,dx]": ("rms_norm_backward", grad_of(rms("none", "torch"), 0,
                                                                          lambda a: (a[0], None, EPS), [True, False])),
        "fused_add_rms_norm_backward": ("fused_add_rms_norm_backward", fused_add_backward(True)),
        "fused_add_rms_norm_backward[no_grad_residual]": ("fused_add_rms_norm_backward", fused_add_backward(False)),
        "layer_norm_backward": ("layer_norm_backward", grad_of(layer(False), 0, lambda a: a, [True, True, True])),
        "layer_norm_backward[fp32_params,dx]": ("layer_norm_backward", grad_of(layer(True), 0, lambda a: a,
                                                                                [True, False, False])),
        "norm_modulate_backward": ("norm_modulate_backward", grad_of(modulate("rms"), 0, lambda a: a, [True] * 5)),
        "norm_modulate_backward[layer]": ("norm_modulate_backward", grad_of(modulate("layer"), 0, lambda a: a,
                                                                            [True] * 5)),
        "gated_add_norm_modulate_backward": ("gated_add_norm_modulate_backward", gated_backward("rms", True)),
        "gated_add_norm_modulate_backward[layer,no_gate]": ("gated_add_norm_modulate_backward",
                                                            gated_backward("layer", False)),
    }


def _gated_add_entries():
    """gated_add, a member of the norm family: x + gate * y (the elementwise kernel's gated form) and
    its backward (the norm backward with no norm)."""
    def gated_add(out: bool):
        def build(m, case):
            (B, S, H), lay = rows(m, case)
            args = (m.tensor((B, S, H), lay), m.tensor((B, S, H), lay), m.tensor((B, 1, H), scale=0.5))
            return ((m.nan((B, S, H), lay), *args) if out else args), ((0,) if out else ())
        return build

    return {
        "gated_add": ("gated_add", gated_add(False)),
        "gated_add_out": ("gated_add_out", gated_add(True)),
        # backward: grad_out, y, gate and the mask (dy, dgate)
        "gated_add_backward": ("gated_add_backward", lambda m, case: (
            (m.tensor(rows(m, case)[0], rows(m, case)[1], scale=1.0, offset=0.0),
             *gated_add(False)(m, case)[0][1:], [True, True]), ())),
        "gated_add_backward[dgate]": ("gated_add_backward", lambda m, case: (
            (m.tensor(rows(m, case)[0], rows(m, case)[1], scale=1.0, offset=0.0),
             *gated_add(False)(m, case)[0][1:], [False, True]), ())),
    }
