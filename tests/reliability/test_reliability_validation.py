"""Checks the bindings make that no other test reaches: more than 2^31 - 1 rows (expanded views, so
no memory is needed), more heads than 32 bits count, float64 inputs, eps = inf, outputs that
overlap each other, in-place operands that are expanded or overlap the tables, vLLM's
rotary_embedding's head size, token count, positions and overlaps, and outputs of act_mul and
gated_add aliasing an input. Each must raise a clear error naming the argument, with no launch."""

import pytest
import torch

from helpers import assert_rejects

pytestmark = pytest.mark.gpu

BIG = 2**31  # one past the largest row (and head) count the kernels take
INT_MAX = 2**31 - 1
ROWS_MSG = f"has {BIG} rows; at most {INT_MAX} are supported"


def bf(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def f32(*shape):
    return torch.rand(*shape, device="cuda")


def expanded(*shape, last=2, dtype=torch.bfloat16):
    """A [*shape, last] tensor of one row repeated (stride 0 in every leading dimension): no memory."""
    return torch.randn(*([1] * len(shape)), last, device="cuda", dtype=dtype).expand(*shape, last)


# ---- more rows than the grid holds (row ops): check_row_count ----

ROWS = {
    "rms_norm": lambda t: t.rms_norm(expanded(BIG), None),
    "rms_norm_out": lambda t: t.rms_norm(expanded(BIG), None, out=expanded(BIG)),
    "fused_add_rms_norm": lambda t: t.fused_add_rms_norm(expanded(BIG), expanded(BIG)),
    "fused_add_rms_norm_": lambda t: t.fused_add_rms_norm_(expanded(BIG), expanded(BIG)),
    "layer_norm": lambda t: t.layer_norm(expanded(BIG)),
    "norm_modulate": lambda t: t.norm_modulate(expanded(BIG), bf(2)),
    "gated_add_norm_modulate": lambda t: t.gated_add_norm_modulate(expanded(BIG), expanded(BIG), bf(2), bf(2)),
    "activation": lambda t: t.silu(expanded(BIG)),
    "act_and_mul": lambda t: t.silu_and_mul(expanded(BIG, last=4)),
    "act_mul": lambda t: t.act_mul(expanded(BIG), expanded(BIG)),
    "gated_add": lambda t: t.gated_add(expanded(BIG), expanded(BIG), bf(2)),
    # 2^16 x 2^15 rows in two leading dimensions (their product overflows 32 bits)
    "rms_norm_3d": lambda t: t.rms_norm(expanded(2**16, 2**15), None),
}


@pytest.mark.parametrize("case", sorted(ROWS))
def test_more_rows_than_the_grid_raise(tk, case):
    assert_rejects(lambda: ROWS[case](tk), ValueError, ROWS_MSG)


# ---- RoPE: head counts in 32 bits, at most one block per row of head_dim (new checks) ----

def rope_tables(S, R=2, dtype=torch.bfloat16):
    return torch.randn(1, S, R, device="cuda", dtype=dtype), torch.randn(1, S, R, device="cuda", dtype=dtype)


HEADS_MSG = "q and k have .* heads; at most 2147483647 in all are supported"
ROPE_ROWS_MSG = "q and k have 2147483648 tokens of 2 heads .*; at most 2147483647 rows are supported"
ROPE_LIMITS = {
    # 2^31 query heads (and 2^31 - 1 + 1: the sum overflows): one head repeated, no memory
    "rope_q_heads": (lambda t: t.ops.rope(expanded(1, 1, BIG), bf(1, 1, 1, 2), *rope_tables(1), "neox", False),
                     HEADS_MSG),
    "rope_heads_sum": (lambda t: t.ops.rope(expanded(1, 1, INT_MAX), bf(1, 1, 1, 2), *rope_tables(1), "neox", False),
                       HEADS_MSG),
    "rope__heads": (lambda t: t.ops.rope_(expanded(1, 1, BIG), bf(1, 1, 1, 2), *rope_tables(1), "neox", False),
                    HEADS_MSG),
    "hf_rope_heads": (lambda t: t.apply_rotary_pos_emb(expanded(1, BIG, 1), bf(1, 1, 1, 2), *rope_tables(1)),
                      HEADS_MSG),
    "qk_norm_rope_heads": (lambda t: t.ops.qk_norm_rope(expanded(1, 1, BIG), bf(1, 1, 1, 2), bf(2), bf(2), 1e-6,
                                                        *rope_tables(1, dtype=torch.float32)), HEADS_MSG),
    "hf_qk_norm_rope_heads": (lambda t: t.hf_qk_norm_rope(expanded(1, 1, BIG), bf(1, 1, 1, 2), bf(2), bf(2), 1e-6,
                                                          *rope_tables(1)), HEADS_MSG),
    # 2^16 x 2^15 tokens of q's and k's head: 2^32 rows
    "rope_rows": (lambda t: t.ops.rope(expanded(2**16, 2**15, 1), expanded(2**16, 2**15, 1), *rope_tables(2**15),
                                       "neox", False), ROPE_ROWS_MSG),
    "hf_rope_rows": (lambda t: t.apply_rotary_pos_emb(expanded(2**16, 1, 2**15), expanded(2**16, 1, 2**15),
                                                      *rope_tables(2**15)), ROPE_ROWS_MSG),
    "hf_qk_norm_rope_rows": (lambda t: t.hf_qk_norm_rope(expanded(2**16, 2**15, 1), expanded(2**16, 2**15, 1), bf(2),
                                                         bf(2), 1e-6, *rope_tables(2**15)), ROPE_ROWS_MSG),
    "ltx_rope_from_coords_rows": (lambda t: t.ltx_rope_from_coords(expanded(2**16, 2**15), expanded(2**16, 2**15),
                                                                   f32(1, 2**15, 3), f32(0)), ROPE_ROWS_MSG),
    "ltx_qk_norm_rope_from_coords_rows": (lambda t: t.ltx_qk_norm_rope_from_coords(
        expanded(2**16, 2**15), expanded(2**16, 2**15), bf(2), bf(2), 1e-6, f32(1, 2**15, 3), f32(0)), ROPE_ROWS_MSG),
}


@pytest.mark.parametrize("case", sorted(ROPE_LIMITS))
def test_rope_head_and_row_counts_raise(tk, case):
    call, message = ROPE_LIMITS[case]
    assert_rejects(lambda: call(tk), ValueError, message)


@pytest.mark.large
def test_rope_cached_row_count_raises(tk):
    """vLLM's form checks query for overlap first, so its 2^31 rows must be real: 2^16 tokens of
    2^15 query heads of 2 elements, 8 GiB of bf16 (skips where the GPU has less free)."""
    need = 2 * 2**31 + (1 << 30)
    if torch.cuda.mem_get_info()[0] < need:
        pytest.skip(f"needs {need / 2**30:.0f} GiB of free GPU memory")
    T, Hq = 2**16, 2**15
    query = torch.empty(T, Hq * 2, device="cuda", dtype=torch.bfloat16)
    key = bf(T, 2)
    positions = torch.zeros(T, dtype=torch.long, device="cuda")
    message = f"q and k have {T} tokens of {Hq + 1} heads .*; at most 2147483647 rows are supported"
    assert_rejects(lambda: tk.rotary_embedding(positions, query, key, 2, bf(8, 2)), ValueError, message)


# ---- float64 inputs, eps = inf ----

F64 = {
    "rms_norm": (lambda t, x: t.rms_norm(x), "rms_norm: x must be float32, float16 or bfloat16, got Double"),
    "layer_norm": (lambda t, x: t.layer_norm(x), "layer_norm: x must be float32"),
    "fused_add_rms_norm": (lambda t, x: t.fused_add_rms_norm(x, x), "x must be float32"),
    "norm_modulate": (lambda t, x: t.norm_modulate(x, x), "norm_modulate: x must be float32"),
    "gated_add_norm_modulate": (lambda t, x: t.gated_add_norm_modulate(x, x, None, x), "x must be float32"),
    "activation": (lambda t, x: t.gelu(x), "activation: x must be float32"),
    "act_and_mul": (lambda t, x: t.geglu(x), "act_and_mul: x must be float32"),
    "act_mul": (lambda t, x: t.act_mul(x, x), "act_mul: gate must be float32"),
    "gated_add": (lambda t, x: t.gated_add(x, x, x), "gated_add: x must be float32"),
    "rope": (lambda t, x: t.apply_rotary_pos_emb(x[None], x[None], x[:, :1], x[:, :1]), "q must be float32"),
    "rope_cached_": (lambda t, x: t.rotary_embedding(torch.zeros(4, dtype=torch.long, device="cuda"), x[0], x[0], 8,
                                                     x[0, :, :8]), "query must be float32"),
    "qk_norm_rope": (lambda t, x: t.qk_norm_rope(x[None], x[None], x[0, 0], x[0, 0], 1e-6, x[0], x[0]),
                     "qk_norm_rope: q must be float32"),
    "ltx_rope_from_coords": (lambda t, x: t.ltx_rope_from_coords(x, x, x[..., :3].float(), x[0, 0, :1].float()),
                             "ltx_rope_from_coords: q must be float32"),
}


@pytest.mark.parametrize("case", sorted(F64))
def test_float64_inputs_raise(tk, case):
    call, message = F64[case]
    x = torch.randn(2, 4, 8, device="cuda", dtype=torch.float64)
    assert_rejects(lambda: call(tk, x), TypeError, message)


INF = float("inf")
EPS_INF = {
    "rms_norm": lambda t: t.rms_norm(bf(4, 64), bf(64), INF),
    "rms_norm_out": lambda t: t.rms_norm(bf(4, 64), bf(64), INF, out=bf(4, 64)),
    "fused_add_rms_norm": lambda t: t.fused_add_rms_norm(bf(4, 64), bf(4, 64), bf(64), INF),
    "fused_add_rms_norm_": lambda t: t.fused_add_rms_norm_(bf(4, 64), bf(4, 64), bf(64), INF),
    "layer_norm": lambda t: t.layer_norm(bf(4, 64), eps=INF),
    "norm_modulate": lambda t: t.norm_modulate(bf(2, 4, 64), bf(2, 1, 64), eps=INF),
    "gated_add_norm_modulate": lambda t: t.gated_add_norm_modulate(bf(2, 4, 64), bf(2, 4, 64), None, bf(2, 1, 64),
                                                                   eps=INF),
    "ltx_qk_norm_rope": lambda t: t.ltx_qk_norm_rope(bf(1, 4, 64), bf(1, 4, 64), bf(64), bf(64), INF, f32(1, 4, 64),
                                                     f32(1, 4, 64)),
    "hf_qk_norm_rope": lambda t: t.hf_qk_norm_rope(bf(1, 4, 2, 64), bf(1, 4, 1, 64), bf(64), bf(64), INF, bf(1, 4, 64),
                                                   bf(1, 4, 64)),
    "ltx_qk_norm_rope_from_coords": lambda t: t.ltx_qk_norm_rope_from_coords(bf(1, 4, 64), bf(1, 4, 64), bf(64), bf(64),
                                                                             INF, f32(1, 4, 3), f32(10)),
}


@pytest.mark.parametrize("case", sorted(EPS_INF))
def test_infinite_eps_raises(tk, case):
    assert_rejects(lambda: EPS_INF[case](tk), ValueError, "eps must be a finite number >= 0, got inf")


# ---- outputs that overlap each other; in-place operands that are expanded or overlap ----

def shifted(t):
    """A view of t's buffer one element further on, t's shape: it overlaps t without being t."""
    flat = torch.empty(t.numel() + 1, device=t.device, dtype=t.dtype)
    return flat[:-1].view(t.shape), flat[1:].view(t.shape)


def fused_add_outs(t, same):
    a, b = (bf(4, 64),) * 2 if same else shifted(bf(4, 64))
    return t.fused_add_rms_norm(bf(4, 64), bf(4, 64), bf(64), out=a, residual_out=b)


def gated_outs(t, same):
    a, b = (bf(2, 4, 64),) * 2 if same else shifted(bf(2, 4, 64))
    return t.gated_add_norm_modulate(bf(2, 4, 64), bf(2, 4, 64), bf(2, 1, 64), bf(2, 1, 64), h_out=a, out=b)


def rope_q_over_cos(t):
    buf = bf(1, 4, 192)  # q's two heads in [..., :128]; cos overlaps its second head
    q = buf[..., :128].unflatten(-1, (2, 64))
    return t.ops.rope_(q, bf(1, 4, 2, 64), buf[..., 64:128], bf(1, 4, 192)[..., 64:128], "neox", False)


OVERLAP = {
    "fused_add_out_is_residual_out": (lambda t: fused_add_outs(t, True), "out must not share memory with residual_out"),
    "fused_add_out_overlaps_residual_out": (lambda t: fused_add_outs(t, False),
                                            "out must not share memory with residual_out"),
    "gated_out_is_h_out": (lambda t: gated_outs(t, True), "out must not share memory with h_out"),
    "gated_out_overlaps_h_out": (lambda t: gated_outs(t, False), "out must not share memory with h_out"),
    "fused_add_in_place_x_expanded": (lambda t: t.fused_add_rms_norm_(expanded(4, last=64), bf(4, 64), bf(64)),
                                      "x must not have overlapping elements"),
    "fused_add_in_place_residual_expanded": (lambda t: t.fused_add_rms_norm_(bf(4, 64), expanded(4, last=64), bf(64)),
                                             "residual must not have overlapping elements"),
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


@pytest.mark.parametrize("case", sorted(OVERLAP))
def test_overlapping_outputs_and_operands_raise(tk, case):
    call, message = OVERLAP[case]
    assert_rejects(lambda: call(tk), ValueError, message)


# ---- vLLM's rotary_embedding: head size, token count, positions, overlap ----

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


CACHED = {
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


@pytest.mark.parametrize("case", sorted(CACHED))
def test_rotary_embedding_checks(tk, case):
    call, message = CACHED[case]
    assert_rejects(lambda: call(tk), ValueError, message)


# ---- act_mul, gated_add (and act_and_mul): outputs aliasing an input ----

def gated_add_out_over_gate(t):
    buf = bf(2, 3, 8)
    return t.gated_add(bf(2, 3, 8), bf(2, 3, 8), buf[:, :1], out=buf)


ALIASED = {
    "act_mul_out_is_gate": (lambda t: (lambda g: t.act_mul(g, bf(4, 8), out=g))(bf(4, 8)),
                            "act_mul: out must not share memory with gate"),
    "act_mul_out_is_up": (lambda t: (lambda u: t.act_mul(bf(4, 8), u, out=u))(bf(4, 8)),
                          "act_mul: out must not share memory with up"),
    "act_mul_out_overlaps_up": (lambda t: (lambda a: t.act_mul(bf(4, 8), a[0], out=a[1]))(shifted(bf(4, 8))),
                                "out must not share memory with up"),
    "gated_add_out_is_x": (lambda t: (lambda x: t.gated_add(x, bf(4, 8), bf(8), out=x))(bf(4, 8)),
                           "gated_add: out must not share memory with x"),
    "gated_add_out_is_y": (lambda t: (lambda y: t.gated_add(bf(4, 8), y, bf(8), out=y))(bf(4, 8)),
                           "gated_add: out must not share memory with y"),
    "gated_add_out_over_gate": (gated_add_out_over_gate, "gated_add: out must not share memory with gate"),
    "silu_and_mul_out_in_x": (lambda t: (lambda x: t.silu_and_mul(x, out=x[:, :4]))(bf(4, 8)),
                              "act_and_mul: out must not share memory with x"),
    "act_mul_out_expanded": (lambda t: t.act_mul(bf(4, 8), bf(4, 8), out=expanded(4, last=8)),
                             "out must not have overlapping elements"),
}


@pytest.mark.parametrize("case", sorted(ALIASED))
def test_outputs_aliasing_an_input_raise(tk, case):
    call, message = ALIASED[case]
    assert_rejects(lambda: call(tk), ValueError, message)
