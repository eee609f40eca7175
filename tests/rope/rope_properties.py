"""The rotary embeddings' shared pieces of the property tests (tests/rope/test_properties_rope.py and
tests/qk_norm_rope/test_properties_qk_norm_rope.py; see tests/properties.py): the eager code each
public function replaces (EagerRope, the fused q/k norm forms included), and the strategies of q/k
layouts and cos/sin tables."""

import torch
from hypothesis import strategies as st

import properties as P
from reference.rope import (
    diffusers_interleaved_rotary,
    hf_apply_rotary_pos_emb,
    hf_qk_norm_rope,
    ltx_tables_from_coords,
    rotary_float64,
    vllm_rotary_embedding_native,
)


def rms64_then(x, w, eps):
    return torch.nn.functional.rms_norm(x.double(), (x.shape[-1],), w.double(), eps)


def torch_rms(x, w, eps):
    """torch.nn.RMSNorm (diffusers' norm_q / norm_k): fp32 math, the weight in fp32, one rounding."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


class EagerRope(P.Impl):
    """The eager code each op replaces."""

    def apply_rotary_pos_emb(self, q, k, cos, sin, unsqueeze_dim=1):
        return hf_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)

    def apply_rotary_pos_emb_(self, q, k, cos, sin, unsqueeze_dim=1):
        q_out, k_out = hf_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
        q.copy_(q_out)
        k.copy_(k_out)
        return q, k

    def rotary_embedding(self, positions, query, key, head_size, cache, is_neox=True):
        if query.shape[0] == 0:  # no tokens (vLLM's code cannot view them)
            return query, key
        if cache.dtype == query.dtype:  # vLLM's own per-op rounding
            q_out, k_out = vllm_rotary_embedding_native(positions, query, key, head_size, cache, is_neox)
        else:  # an fp32 cache: fp32 math, one rounding
            c, s = cache.index_select(0, positions).chunk(2, dim=-1)
            c, s = (torch.cat((t, t), -1) if is_neox else t.repeat_interleave(2, -1) for t in (c, s))

            def apply(x):
                x3 = x.reshape(x.shape[0], x[0].numel() // head_size, head_size)
                r = c.shape[-1]
                rot = rotary_float64(x3[..., :r].float(), c[:, None], s[:, None], "neox" if is_neox else "interleaved")
                return torch.cat((rot.to(x.dtype), x3[..., r:]), -1).reshape(x.shape)

            q_out, k_out = apply(query), apply(key)
        query.copy_(q_out.reshape(query.shape))
        key.copy_(k_out.reshape(key.shape))
        return query, key

    def ltx_rope(self, q, k, cos, sin):
        return diffusers_interleaved_rotary(q, cos, sin), diffusers_interleaved_rotary(k, cos, sin)

    def flux_rope(self, q, k, cos, sin):
        c, s = cos[None, :, None], sin[None, :, None]
        return diffusers_interleaved_rotary(q, c, s), diffusers_interleaved_rotary(k, c, s)

    def ltx_qk_norm_rope(self, q, k, qw, kw, eps, cos, sin):
        return (diffusers_interleaved_rotary(torch_rms(q, qw, eps), cos, sin),
                diffusers_interleaved_rotary(torch_rms(k, kw, eps), cos, sin))

    def qk_norm_rope(self, q, k, qw, kw, eps, cos, sin):
        return self.ltx_qk_norm_rope(q, k, qw, kw, eps, cos[None, :, None], sin[None, :, None])

    def hf_qk_norm_rope(self, q, k, qw, kw, eps, cos, sin, out=None):
        q_out, k_out = hf_qk_norm_rope(q, k, qw, kw, eps, cos, sin)
        if out is None:
            return q_out, k_out
        out[0].copy_(q_out)
        out[1].copy_(k_out)
        return out

    def ltx_rope_from_coords(self, q, k, grid, freqs):
        return self.ltx_rope(q, k, *ltx_tables_from_coords(grid, freqs, q.shape[-1]))

    def ltx_qk_norm_rope_from_coords(self, q, k, qw, kw, eps, grid, freqs):
        return self.ltx_qk_norm_rope(q, k, qw, kw, eps, *ltx_tables_from_coords(grid, freqs, q.shape[-1]))


EAGER = EagerRope()


def cpu_impl(name):
    return EAGER if name == "eager" else P.PackageOnCpu()


# ---- strategies ----

head_widths = st.one_of(st.sampled_from([2, 8, 18, 32, 40, 64, 72, 96, 128, 256]),
                        st.integers(1, 256).map(lambda n: 2 * n))
QK_LAYOUTS = ("fused", "separate", "offset")


@st.composite
def qk_case(draw, max_heads=8, pair_offsets=False, widths=head_widths):
    """B, S, Hq, Hk, d and how q and k are laid out: views of one fused projection (optionally offset),
    or separate tensors (optionally offset)."""
    return dict(B=draw(st.integers(1, 3)), S=draw(st.integers(0, 24)), Hq=draw(st.integers(1, max_heads)),
                Hk=draw(st.integers(0, 4)), d=draw(widths), dtype=draw(P.dtypes), seed=draw(P.seeds),
                layout=draw(st.sampled_from(QK_LAYOUTS)),
                offset=draw(st.sampled_from([2, 4, 6]) if pair_offsets else st.integers(1, 7)))


def make_qk(v, c, dtype=None):
    """q [B, S, Hq, d], k [B, S, Hk, d]."""
    B, S, Hq, Hk, d, dt = c["B"], c["S"], c["Hq"], c["Hk"], c["d"], dtype or c["dtype"]
    if c["layout"] == "separate":
        return v.normal((B, S, Hq, d), dt), v.normal((B, S, Hk, d), dt)
    off = c["offset"] if c["layout"] == "offset" else 0
    qkv = v.normal((B, S, off + (Hq + 2 * Hk) * d), dt)[..., off:]
    return qkv[..., : Hq * d].unflatten(-1, (Hq, d)), qkv[..., Hq * d: (Hq + Hk) * d].unflatten(-1, (Hk, d))


def neox_tables(v, B, S, R, dtype, pad):
    """cos/sin [B, S, R] as transformers builds them (NeoX halves repeat), rows padded by `pad`."""
    a = v.uniform((B, S, R // 2), torch.float32, -200.0, 200.0)
    a = torch.cat((a, a), -1)
    return P.place(a.cos().to(dtype), ("padded", pad) if pad else ("contiguous", 0)), \
        P.place(a.sin().to(dtype), ("padded", pad) if pad else ("contiguous", 0))


def interleaved_tables(v, B, S, width, pad):
    a = v.uniform((B, S, width // 2), torch.float32, -200.0, 200.0).repeat_interleave(2, -1)
    lay = ("padded", pad) if pad else ("contiguous", 0)
    return P.place(a.cos(), lay), P.place(a.sin(), lay)
