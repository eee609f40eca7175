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
}


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
