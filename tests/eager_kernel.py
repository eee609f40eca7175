"""The kernel package's real Python code (torch-ext/transformer_kernels: the API, the Hub layers,
the fake impls) on the CPU, with each C++ op replaced by the eager code it reproduces.

``eager_kernel()`` defines every op of torch_binding.cpp (the same schemas, parsed from the file) in
a private torch.library namespace with CPU implementations made of the eager reference code
(reference/), and loads the package source against that namespace. Integration tests then inject
it into a model on the CPU in bf16: the layers' own logic (which rounding a host module gets, its
eps, its weight and bias) and every wrapper's argument handling run for real, and the result must
be the eager model's bit for bit (in fp32 the three RMSNorm roundings coincide; in bf16 they don't).
"""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F

from reference.activations import eager_act_and_mul, eager_act_mul, eager_activation, eager_gated_add
from reference.fp8 import quantize_fp8_rowwise
from reference.group_norm import eager_group_norm
from reference.norms import RMS_NORM_EAGER, diffusers_norm_modulate, ltx_gated_add_norm_modulate
from reference.rope import (
    diffusers_qk_norm_rope,
    hf_apply_rotary_pos_emb,
    hf_qk_norm_rope,
    ltx_tables_from_coords,
    rotate_half,
)

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "tk_eager_cpu"
PACKAGE = "tk_eager_cpu_package"


def schemas() -> dict[str, str]:
    """name -> schema of every ops.def in torch_binding.cpp (adjacent string literals joined)."""
    text = (ROOT / "torch-ext" / "torch_binding.cpp").read_text()
    found = {}
    for literals in re.findall(r'ops\.def\(((?:\s*"[^"]*")+)\s*\)', text):
        schema = "".join(re.findall(r'"([^"]*)"', literals))
        found[schema.split("(", 1)[0]] = schema
    return found


# ---- the eager semantics of each op (documented in the package's docstrings) ----

def _rope_rows(x, cos, sin, style, fp32_math):
    """x [B, S, H, d]; cos, sin [B or 1, S, R]: the first R channels rotated, the rest passed."""
    c, s = cos.unsqueeze(2), sin.unsqueeze(2)
    r = c.shape[-1]
    xr, xp = x[..., :r], x[..., r:]
    if style == "neox":
        rot = rotate_half(xr)
    else:
        a, b = xr.unflatten(-1, (-1, 2)).unbind(-1)
        rot = torch.stack([-b, a], dim=-1).flatten(-2)
    out = (xr.float() * c + rot.float() * s).to(x.dtype) if fp32_math else xr * c + rot * s
    return torch.cat((out, xp), dim=-1)


def _hf_layout(t, unsqueeze_dim):
    return t.transpose(1, 2) if unsqueeze_dim == 1 else t


def _cached(positions, query, key, head_size, cache, style):
    c, s = cache.index_select(0, positions).chunk(2, dim=-1)
    c, s = (torch.cat((t, t), -1) if style == "neox" else t.repeat_interleave(2, -1) for t in (c, s))
    fp32_math = cache.dtype == torch.float32 and query.dtype != torch.float32
    if not fp32_math:
        c, s = c.to(query.dtype), s.to(query.dtype)
    for x in (query, key):
        x4 = x.reshape(1, x.shape[0], -1, head_size) if x.shape[0] else x.reshape(1, 0, 1, head_size)
        x.copy_(_rope_rows(x4, c[None], s[None], style, fp32_math).reshape(x.shape))


def _tables(grid, freqs, width):
    return ltx_tables_from_coords(grid, freqs, width)


def _qk_norm(x, w, eps):  # torch.nn.RMSNorm, as diffusers' attention norms
    return F.rms_norm(x, (x.shape[-1],), w, eps)


IMPLS = {
    "rms_norm": lambda x, w, eps, r: RMS_NORM_EAGER[r](x, w, eps),
    "layer_norm": lambda x, w, b, eps: F.layer_norm(x, (x.shape[-1],), w, b, eps),
    "fused_add_rms_norm": lambda x, res, w, eps, r: (RMS_NORM_EAGER[r](x + res, w, eps), x + res),
    "norm_modulate": lambda x, sc, sh, w, b, eps, n: diffusers_norm_modulate(x, sc, sh, n, w, b, eps),
    "gated_add_norm_modulate": lambda x, y, g, sc, sh, w, b, eps, n: ltx_gated_add_norm_modulate(x, y, g, sc, sh, n, w,
                                                                                                 b, eps),
    "activation": lambda x, act: eager_activation(x, act),
    "act_and_mul": lambda x, act, first: eager_act_and_mul(x, act, first),
    "act_mul": lambda g, u, act: eager_act_mul(g, u, act),
    "gated_add": lambda x, y, g: eager_gated_add(x, y, g),
    "rope": lambda q, k, c, s, style, f: (_rope_rows(q, c, s, style, f), _rope_rows(k, c, s, style, f)),
    "hf_rope": lambda q, k, c, s, dim: hf_apply_rotary_pos_emb(q, k, c, s, dim),
    "qk_norm_rope": lambda q, k, qw, kw, eps, c, s: (_rope_rows(_qk_norm(q, qw, eps), c, s, "interleaved", True),
                                                    _rope_rows(_qk_norm(k, kw, eps), c, s, "interleaved", True)),
    "hf_qk_norm_rope": lambda q, k, qw, kw, eps, c, s: hf_qk_norm_rope(q, k, qw, kw, eps, c, s),
    "ltx_rope_from_coords": lambda q, k, grid, freqs: tuple(t.squeeze(2) for t in IMPLS["rope"](
        q.unsqueeze(2), k.unsqueeze(2), *_tables(grid, freqs, q.shape[-1]), "interleaved", True)),
    "linear_gelu": lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"),
    "linear_gelu_fused": lambda x, w, b: False,  # (a host query: the eager pair is never fused)
    "group_norm": lambda x, g, w, b, eps, act: eager_group_norm(x, g, w, b, eps, None if act == "none" else act),
    "add_group_norm": lambda x, bnc, g, w, b, eps, act: eager_group_norm(x, g, w, b, eps, None if act == "none" else act,
                                                                      bias_nc=bnc),
    "ltx_qk_norm_rope_from_coords": lambda q, k, qw, kw, eps, grid, freqs: diffusers_qk_norm_rope(
        q, k, qw, kw, eps, *_tables(grid, freqs, q.shape[-1])),
    "quantize_fp8": lambda x: _fp8(x),
    "act_mul_fp8": lambda g, u, act: _fp8(eager_act_mul(g, u, act)),
    "linear_fp8": lambda x, xs, w, ws, b, dtype, act: _linear_fp8(x, xs, w, ws, b, dtype, act),
    "decode_linear": lambda x, w, ws, b: _decode_linear(x, w, ws, b),
    # the norms' FP8 outputs: the op's output in x's dtype, then quantize_fp8
    "rms_norm_fp8": lambda x, w, eps, r: _fp8(RMS_NORM_EAGER[r](x, w, eps).to(x.dtype)),
    "fused_add_rms_norm_fp8": lambda x, res, w, eps, r: (*_fp8(RMS_NORM_EAGER[r](x + res, w, eps).to(x.dtype)),
                                                         x + res),
    "layer_norm_fp8": lambda x, w, b, eps: _fp8(F.layer_norm(x, (x.shape[-1],), w, b, eps)),
    "norm_modulate_fp8": lambda x, sc, sh, w, b, eps, n: _fp8(diffusers_norm_modulate(x, sc, sh, n, w, b, eps)),
    "gated_add_norm_modulate_fp8": lambda x, y, g, sc, sh, w, b, eps, n: _gated_fp8(
        *ltx_gated_add_norm_modulate(x, y, g, sc, sh, n, w, b, eps)),
}


def _decode_linear(x, weight, weight_scale, bias):
    """The decode linear layer in fp32 (its accumulator) on the dequantized weight, rounded once."""
    w = weight.float() if weight_scale is None else weight.float() * weight_scale.reshape(-1, 1)
    return F.linear(x.float(), w, None if bias is None else bias.float()).to(x.dtype)


def _fp8(values):
    """quantize_fp8's (codes, scale) of values, contiguous as the op returns them."""
    return tuple(t.contiguous() for t in quantize_fp8_rowwise(values))


def _gated_fp8(out, h):
    return (*_fp8(out), h)


def _linear_fp8(x, x_scale, weight, weight_scale, bias, out_dtype, activation):
    """The FP8 linear on the dequantized operands in fp32 (the GEMM's accumulator), rounded once."""
    out = F.linear(x.float() * x_scale, weight.float() * weight_scale.reshape(-1, 1),
                   None if bias is None else bias.float())
    return (F.gelu(out, approximate="tanh") if activation == "gelu_tanh" else out).to(out_dtype)


# ---- backward ops, in closed form (the impls run below the Autograd key: no autograd in here) ----

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


def _transposed_sines(sin, style):
    """The backward rotation's sines (s1, s2) -> (-s2, -s1): rope.cuh's transpose_sines."""
    if style == "neox":
        s1, s2 = sin.chunk(2, dim=-1)
        return torch.cat((-s2, -s1), dim=-1)
    pairs = sin.unflatten(-1, (-1, 2))
    return torch.stack((-pairs[..., 1], -pairs[..., 0]), dim=-1).flatten(-2)


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


# The norm family's and the fused q/k norm + RoPE ops' backward: autograd of the forward's eager
# code in float32 (each gradient cast to its input's dtype), what the kernels compute up to rounding.

def _with_autograd(fn):
    """fn() with autograd on: the impls run below the Autograd key, which this lifts again."""
    keys = torch._C.DispatchKeySet
    autograd = (keys(torch._C.DispatchKey.AutogradFunctionality) | keys(torch._C.DispatchKey.AutogradOther)
                | keys(torch._C.DispatchKey.AutogradNestedTensor))
    exclude = torch._C._dispatch_tls_local_exclude_set() - autograd
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude), torch.enable_grad():
        return fn()


def _vjp(forward, inputs, grads, mask, like):
    """The gradients of sum(out_i * grads_i) over forward(*inputs)'s outputs for the inputs `mask`
    asks for (None grads: outputs not used); the empty placeholder (like the kernels' `like`-dtype
    [0] tensor) where an input is not asked for or is None."""
    def run():
        leaves = [None if t is None else t.detach().float().requires_grad_(bool(asked))
                  for t, asked in zip(inputs, mask)]
        outs = forward(*leaves)
        outs = outs if isinstance(outs, tuple) else (outs,)
        used = [(o, g.float()) for o, g in zip(outs, grads) if g is not None]
        wanted = [leaf for leaf in leaves if leaf is not None and leaf.requires_grad]
        got = iter(torch.autograd.grad([o for o, _ in used], wanted, [g for _, g in used], allow_unused=True)
                   if wanted else ())
        result = []
        for t, leaf in zip(inputs, leaves):
            if leaf is None or not leaf.requires_grad:
                result.append(like.new_empty((0,)))
                continue
            g = next(got)
            result.append((torch.zeros_like(leaf) if g is None else g).to(t.dtype))
        return tuple(result)

    return _with_autograd(run)


def _norm_modulate_eager(norm, eps):
    return lambda x, sc, sh, w, b: diffusers_norm_modulate(x, sc, sh, norm, w, b, eps)


def _gated_add_norm_modulate_backward(grad_out, grad_h, h, y, gate, scale, shift, w, b, eps, norm, mask):
    # h = x + gate * y (x + y without a gate): x from h, so that the same code differentiates
    x = h.float() - (y.float() if gate is None else gate.float() * y.float())
    forward = (lambda x_, y_, g_, sc, sh, w_, b_:
               ltx_gated_add_norm_modulate(x_, y_, g_, sc, sh, norm, w_, b_, eps))
    want_dx = mask[0] or (mask[1] and gate is None)
    wanted = [want_dx, mask[1] and gate is not None, *mask[2:]]
    dx, dy, *rest = _vjp(forward, (x, y, gate, scale, shift, w, b), (grad_out, grad_h), wanted, h)
    return (dx.to(h.dtype) if want_dx else dx, dy, *rest)


def _qk_backward(forward):
    def impl(grad_q, grad_k, q, k, qw, kw, eps, a, b, mask):
        return _vjp(lambda q_, k_, qw_, kw_: forward(q_, k_, qw_, kw_, eps, a.float(), b.float()), (q, k, qw, kw),
                    (grad_q, grad_k), mask, q)

    return impl


IMPLS.update({
    "rms_norm_backward": lambda g, x, w, eps, mask: _vjp(lambda x_, w_: F.rms_norm(x_, (x_.shape[-1],), w_, eps),
                                                         (x, w), (g,), mask, x),
    "fused_add_rms_norm_backward": lambda g, g_h, h, w, eps, mask: (lambda dh, dw: (
        dh if not mask[0] or g_h is None else (dh.float() + g_h.float()).to(h.dtype), dw))(
        *_vjp(lambda h_, w_: F.rms_norm(h_, (h_.shape[-1],), w_, eps), (h, w), (g,), mask, h)),
    "layer_norm_backward": lambda g, x, w, b, eps, mask: _vjp(
        lambda x_, w_, b_: F.layer_norm(x_, (x_.shape[-1],), w_, b_, eps), (x, w, b), (g,), mask, x),
    "norm_modulate_backward": lambda g, x, sc, sh, w, b, eps, norm, mask: _vjp(
        _norm_modulate_eager(norm, eps), (x, sc, sh, w, b), (g,), mask, x),
    "gated_add_norm_modulate_backward": _gated_add_norm_modulate_backward,
    "gated_add_backward": lambda g, y, gate, mask: _vjp(lambda y_, g_: g_ * y_, (y, gate), (g,), mask, g),
    "qk_norm_rope_backward": _qk_backward(IMPLS["qk_norm_rope"]),
    "hf_qk_norm_rope_backward": _qk_backward(IMPLS["hf_qk_norm_rope"]),
    "ltx_qk_norm_rope_from_coords_backward": _qk_backward(
        lambda q, k, qw, kw, eps, grid, freqs: IMPLS["ltx_qk_norm_rope_from_coords"](q, k, qw, kw, eps, grid, freqs)),
})


IMPLS.update({
    "activation_backward": lambda g, x, act: (_act_grad(x, act) * g.float()).to(x.dtype),
    "act_and_mul_backward": _act_and_mul_grad,
    "act_mul_backward": lambda g, gate, up, act: _act_mul_grads(g, gate, up, act),
    "rope_backward": lambda gq, gk, c, s, style, f: IMPLS["rope"](gq, gk, c, _transposed_sines(s, style), style, f),
    "ltx_rope_from_coords_backward": lambda gq, gk, grid, freqs: tuple(t.squeeze(2) for t in IMPLS["rope"](
        gq.unsqueeze(2), gk.unsqueeze(2), *(lambda c, s: (c, _transposed_sines(s, "interleaved")))(
            *_tables(grid, freqs, gq.shape[-1])), "interleaved", True)),
    "fused_linear_cross_entropy": _flce,
    "fused_linear_cross_entropy_backward": _flce_backward,
})


def _out_form(name):
    """name_out(outs..., inputs...) writes the functional form's results into its outs."""
    outs = schemas()[f"{name}_out"].split("(", 1)[1].count("Tensor!")

    def impl(*args):
        results = IMPLS[name](*args[outs:])
        for o, r in zip(args[:outs], results if isinstance(results, tuple) else (results,)):
            o.copy_(r)

    return impl


def _fused_add_inplace(x, res, w, eps, r):
    out, h = IMPLS["fused_add_rms_norm"](x, res, w, eps, r)
    res.copy_(h)
    x.copy_(out)


def _rope_inplace(q, k, c, s, style, f):
    q_out, k_out = IMPLS["rope"](q, k, c, s, style, f)
    q.copy_(q_out)
    k.copy_(k_out)


def _hf_rope_inplace(q, k, c, s, dim):
    q_out, k_out = IMPLS["hf_rope"](q, k, c, s, dim)
    q.copy_(q_out)
    k.copy_(k_out)


MUTATING = {"fused_add_rms_norm_": _fused_add_inplace, "rope_": _rope_inplace, "hf_rope_": _hf_rope_inplace,
            "rope_cached_": _cached}

_LIB = None
_MODULE = None


def _define_ops():
    global _LIB
    if _LIB is not None:
        return
    lib = torch.library.Library(NAMESPACE, "DEF")
    for name, schema in schemas().items():
        lib.define(schema)
        if name in MUTATING:
            fn = MUTATING[name]
        elif name.endswith("_out") and name[:-4] in IMPLS:
            fn = _out_form(name[:-4])
        elif name in IMPLS:
            fn = IMPLS[name]
        else:
            continue  # an op with no eager twin here: calling it raises NotImplementedError
        lib.impl(name, fn, "CPU")
    _LIB = lib


def eager_kernel() -> types.ModuleType:
    """The package (API, layers, fake impls) over the eager CPU ops; loaded once per process."""
    global _MODULE
    if _MODULE is not None:
        return _MODULE
    _define_ops()
    ops_module = types.ModuleType(f"{PACKAGE}._ops")
    ops_module.ops = getattr(torch.ops, NAMESPACE)
    ops_module.add_op_namespace_prefix = lambda op: f"{NAMESPACE}::{op}"
    sys.modules[ops_module.__name__] = ops_module
    source = ROOT / "torch-ext" / "transformer_kernels"
    spec = importlib.util.spec_from_file_location(PACKAGE, source / "__init__.py",
                                                  submodule_search_locations=[str(source)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    spec.loader.exec_module(module)
    _MODULE = module
    return module
