"""The rope family's cases of the reliability tests (tests/reliability/): CUDA-graph captures, bad
inputs the fakes refuse like the kernels and the binding's limits (head and row counts past 32 bits,
float64, overlapping operands, vLLM's rotary_embedding's checks). The qk_norm_rope family's cases take
its inputs and messages. Each dict is gathered, with the other families' dicts of its name, by the test
that checks it (tests/families.py)."""

import torch

from reliability_inputs import (
    BF16,
    BIG,
    INT_MAX,
    bf,
    expanded,
    f32,
    neox_table,
    positions,
    rand,
    t,
    table,
)


# ---- CUDA graphs (test_cuda_graphs.py) ----


# transformers' decode step (Llama-3-8B heads, q/k views of one fused projection) and prefill
def hf_inputs(b, s, hq=32, hk=8, d=128):
    def make():
        qkv = rand(b, s, (hq + 2 * hk) * d)
        q = qkv[..., : hq * d].view(b, s, hq, d).transpose(1, 2)
        k = qkv[..., hq * d: (hq + hk) * d].view(b, s, hk, d).transpose(1, 2)
        return {"qkv": qkv, "q": q, "k": k, "cos": neox_table(b, s, d, BF16), "sin": neox_table(b, s, d, BF16),
                "qw": rand(d, scale=0.2), "kw": rand(d, scale=0.2)}
    return make


def rope_inputs(b, s, h, d):
    return lambda: {"q": rand(b, s, h, d), "k": rand(b, s, h, d), "cos": table(1, s, d), "sin": table(1, s, d)}


# LTX-Video self-attention: q/k [B, S, C] with the norm across all heads
def ltx_inputs(b, s, ch):
    def make():
        grid = torch.rand(1, s, 3, device="cuda")
        return {"q": rand(b, s, ch), "k": rand(b, s, ch), "qw": rand(ch, scale=0.2), "kw": rand(ch, scale=0.2),
                "cos": table(1, s, ch), "sin": table(1, s, ch), "grid_1": grid, "grid": grid.expand(b, s, 3),
                "freqs": torch.rand(ch // 6, device="cuda") * 3}
    return make


flux = rope_inputs(1, 1024, 24, 128)
ltx_qk = ltx_inputs(2, 1536, 2048)


def _cuda_graph_cases():
    c = {}
    for label, (b, s) in [("decode", (4, 1)), ("prefill", (1, 512))]:
        c[f"hf_rope/{label}"] = (hf_inputs(b, s),
                                 lambda tk, t: tk.ops.hf_rope.default(t["q"], t["k"], t["cos"], t["sin"], 1))

    def hf_rope_inplace(tk, t):
        q, k = t["q"].clone(), t["k"].clone()
        tk.ops.hf_rope_.default(q, k, t["cos"], t["sin"], 1)
        return q, k

    c["hf_rope_"] = (hf_inputs(4, 1), hf_rope_inplace)
    c["rope/interleaved_fp32"] = (flux, lambda tk, t: tk.ops.rope.default(t["q"], t["k"], t["cos"], t["sin"],
                                                                          "interleaved", True))

    def rope_inplace(tk, t):
        q, k = t["q"].clone(), t["k"].clone()
        tk.ops.rope_.default(q, k, t["cos"], t["sin"], "neox", True)
        return q, k

    c["rope_"] = (flux, rope_inplace)

    def cached_inputs():
        qkv = rand(64, (32 + 2 * 8) * 128)
        return {"qkv": qkv, "pos": positions(64, 4096), "cache": table(4096, 128)}

    def rope_cached(tk, t):
        q, k = t["qkv"][:, : 32 * 128].clone(), t["qkv"][:, 32 * 128: 40 * 128].clone()
        tk.ops.rope_cached_.default(t["pos"], q, k, 128, t["cache"], "neox")
        return q, k

    c["rope_cached_"] = (cached_inputs, rope_cached)
    c["ltx_rope_from_coords"] = (ltx_qk, lambda tk, t: tk.ops.ltx_rope_from_coords.default(
        t["q"], t["k"], t["grid"], t["freqs"]))
    # training: the backward ops
    c["rope_backward/interleaved_fp32"] = (flux, lambda tk, t: tk.ops.rope_backward.default(
        t["q"], t["k"], t["cos"], t["sin"], "interleaved", True))
    c["rope_backward/hf"] = (hf_inputs(1, 512), lambda tk, t: tk.ops.rope_backward.default(
        t["q"].transpose(1, 2), t["k"].transpose(1, 2), t["cos"], t["sin"], "neox", False))
    c["ltx_rope_from_coords_backward"] = (ltx_qk, lambda tk, t: tk.ops.ltx_rope_from_coords_backward.default(
        t["q"], t["k"], t["grid"], t["freqs"]))
    return c


# name (op/label) -> (inputs(): the tensors a replay reads, call(tk, inputs) -> outputs): at a main shape of
# the models the op serves and at one of each other launch path (tests/reliability/test_cuda_graphs.py)
CUDA_GRAPH_CASES = _cuda_graph_cases()


# ---- bad inputs (test_fakes_check_like_kernels.py) ----

# name -> (call(tk, device), exception type, message regex): the fakes on meta raise what the kernel raises
# (tests/reliability/test_fakes_check_like_kernels.py)
BAD_INPUTS = {
    "rope_head_dim_mismatch": (lambda tk, d: tk.apply_rotary_pos_emb(t(d, 1, 4, 2, 64), t(d, 1, 4, 2, 32),
                                                                     t(d, 1, 2, 64), t(d, 1, 2, 64)),
                               ValueError, "apply_rotary_pos_emb|rope"),
    "rope_odd_table_width": (lambda tk, d: tk.apply_rotary_pos_emb(t(d, 1, 4, 2, 64), t(d, 1, 4, 2, 64),
                                                                   t(d, 1, 2, 63), t(d, 1, 2, 63)),
                             ValueError, "apply_rotary_pos_emb|rope"),
    "rotary_embedding_head_size_0": (lambda tk, d: tk.rotary_embedding(torch.zeros(4, dtype=torch.long, device=d),
                                                                       t(d, 4, 64), t(d, 4, 64), 0, t(d, 8, 64)),
                                     ValueError, "head_size must be positive, got 0"),
}


# ---- the binding's limits (test_reliability_validation.py) ----

def rope_tables(S, R=2, dtype=torch.bfloat16):
    return torch.randn(1, S, R, device="cuda", dtype=dtype), torch.randn(1, S, R, device="cuda", dtype=dtype)


HEADS_MSG = "q and k have .* heads; at most 2147483647 in all are supported"
ROPE_ROWS_MSG = "q and k have 2147483648 tokens of 2 heads .*; at most 2147483647 rows are supported"
# head counts in 32 bits, at most one block per row of head_dim: name -> (call(tk), message)
HEAD_AND_ROW_LIMITS = {
    # 2^31 query heads (and 2^31 - 1 + 1: the sum overflows): one head repeated, no memory
    "rope_q_heads": (lambda t: t.ops.rope(expanded(1, 1, BIG), bf(1, 1, 1, 2), *rope_tables(1), "neox", False),
                     HEADS_MSG),
    "rope_heads_sum": (lambda t: t.ops.rope(expanded(1, 1, INT_MAX), bf(1, 1, 1, 2), *rope_tables(1), "neox", False),
                       HEADS_MSG),
    "rope__heads": (lambda t: t.ops.rope_(expanded(1, 1, BIG), bf(1, 1, 1, 2), *rope_tables(1), "neox", False),
                    HEADS_MSG),
    "hf_rope_heads": (lambda t: t.apply_rotary_pos_emb(expanded(1, BIG, 1), bf(1, 1, 1, 2), *rope_tables(1)),
                      HEADS_MSG),
    # 2^16 x 2^15 tokens of q's and k's head: 2^32 rows
    "rope_rows": (lambda t: t.ops.rope(expanded(2**16, 2**15, 1), expanded(2**16, 2**15, 1), *rope_tables(2**15),
                                       "neox", False), ROPE_ROWS_MSG),
    "hf_rope_rows": (lambda t: t.apply_rotary_pos_emb(expanded(2**16, 1, 2**15), expanded(2**16, 1, 2**15),
                                                      *rope_tables(2**15)), ROPE_ROWS_MSG),
    "ltx_rope_from_coords_rows": (lambda t: t.ltx_rope_from_coords(expanded(2**16, 2**15), expanded(2**16, 2**15),
                                                                   f32(1, 2**15, 3), f32(0)), ROPE_ROWS_MSG),
}

# name -> (call(tk, x float64), message)
FLOAT64_INPUTS = {
    "rope": (lambda t, x: t.apply_rotary_pos_emb(x[None], x[None], x[:, :1], x[:, :1]), "q must be float32"),
    "rope_cached_": (lambda t, x: t.rotary_embedding(torch.zeros(4, dtype=torch.long, device="cuda"), x[0], x[0], 8,
                                                     x[0, :, :8]), "query must be float32"),
    "ltx_rope_from_coords": (lambda t, x: t.ltx_rope_from_coords(x, x, x[..., :3].float(), x[0, 0, :1].float()),
                             "ltx_rope_from_coords: q must be float32"),
}


def rope_q_over_cos(t):
    buf = bf(1, 4, 192)  # q's two heads in [..., :128]; cos overlaps its second head
    q = buf[..., :128].unflatten(-1, (2, 64))
    return t.ops.rope_(q, bf(1, 4, 2, 64), buf[..., 64:128], bf(1, 4, 192)[..., 64:128], "neox", False)


# in-place operands that are expanded or overlap the tables
OVERLAPS = {
    "rope__q_expanded": (lambda t: t.ops.rope_(expanded(1, 4, 2, last=64), bf(1, 4, 2, 64), bf(1, 4, 64),
                                               bf(1, 4, 64), "neox", False), "q must not have overlapping elements"),
    "hf_rope__k_expanded": (lambda t: t.apply_rotary_pos_emb_(bf(1, 2, 4, 64), expanded(1, 2, 4, last=64),
                                                              bf(1, 4, 64), bf(1, 4, 64)),
                            "k must not have overlapping elements"),
    "rope__q_overlaps_cos": (rope_q_over_cos, "q must not share memory with cos"),
    "rope_table_strides": (lambda t: t.ops.rope(bf(1, 4, 2, 64), bf(1, 4, 2, 64), bf(1, 4, 64), bf(1, 4, 128)[..., :64],
                                                "neox", False), "cos and sin must have the same strides"),
    "rope__table_strides": (lambda t: t.ops.rope_(bf(1, 4, 2, 64), bf(1, 4, 2, 64), bf(1, 4, 64),
                                                  bf(1, 4, 128)[..., :64], "neox", False),
                            "cos and sin must have the same strides"),
}


# vLLM's rotary_embedding: head size, token count, positions, overlap
def vllm(t, positions=None, query=None, key=None, head_size=64, cache=None):
    """4 tokens, 2 query heads and 1 key head of 64, a [32, 64] cache; what is given replaces the valid one."""
    positions = torch.zeros(4, dtype=torch.long, device="cuda") if positions is None else positions
    return t.rotary_embedding(positions, bf(4, 128) if query is None else query, bf(4, 64) if key is None else key,
                              head_size, bf(32, 64) if cache is None else cache)


def vllm_query_over(t, what):
    if what == "key":
        buf = bf(4, 192)
        return vllm(t, query=buf[:, :128], key=buf[:, 64:128])
    if what == "cache":
        buf = bf(32, 128)
        return vllm(t, query=buf[:4], cache=buf[:, :64])
    query = bf(4, 128)
    return vllm(t, positions=query.view(-1).view(torch.int64)[:4], query=query)


ROTARY_EMBEDDING_CHECKS = {
    "head_size_zero": (lambda t: vllm(t, head_size=0), "head_size must be positive, got 0"),
    "head_size_negative": (lambda t: vllm(t, head_size=-64), "head_size must be positive"),
    "head_size_3d_mismatch": (lambda t: vllm(t, query=bf(4, 2, 64), head_size=32), "query must be"),
    "key_head_size": (lambda t: vllm(t, key=bf(4, 1, 32)), "key must be"),
    "key_tokens": (lambda t: vllm(t, key=bf(5, 64)), "key must have query's num_tokens 4"),
    "positions_strided": (lambda t: vllm(t, positions=torch.zeros(8, dtype=torch.long, device="cuda")[::2]),
                          "positions must be contiguous with one entry per token"),
    "positions_cpu": (lambda t: vllm(t, positions=torch.zeros(4, dtype=torch.long)),
                      r"positions must be on the same device as query \(cuda:0\), got cpu"),
    "positions_empty": (lambda t: vllm(t, positions=torch.zeros(0, dtype=torch.long, device="cuda")),
                        "one entry per token"),
    "query_expanded": (lambda t: vllm(t, query=expanded(4, last=128)), "query must not have overlapping elements"),
    "query_overlaps_key": (lambda t: vllm_query_over(t, "key"), "query must not share memory with key"),
    "query_overlaps_cache": (lambda t: vllm_query_over(t, "cache"), "query must not share memory with cos_sin_cache"),
    "query_overlaps_positions": (lambda t: vllm_query_over(t, "positions"),
                                 "query must not share memory with positions"),
    "cache_cpu": (lambda t: vllm(t, cache=torch.randn(32, 64, dtype=torch.bfloat16)),
                  r"cos_sin_cache must be on the same device as query \(cuda:0\), got cpu"),
    "cache_last_dim_strided": (lambda t: vllm(t, cache=bf(64, 32).t()), "cos_sin_cache must be contiguous"),
}
