"""Attention references: exact attention in float64, and an emulation of ``attention_8bit``'s
quantization and tiling (SageAttention2's recipe, as csrc/attention/ops.h states it).

``attention_reference`` is ``softmax(q kᵀ · scale) v`` in float64: the ground truth, with SDPA's
math-backend semantics at the edges (a NaN anywhere in a row's scores makes the row NaN; no keys
give zeros).

``attention_8bit_emulation`` computes what the kernel computes, step by step, on the CPU (or any
device), in float32 where the kernel works in float32 and exactly where the kernel's integer
products are exact:

0. the channel balance (``channel_balance``): per (b, h) and channel ``b = sqrt(amax(k - mean) /
   amax q)``; q is multiplied and the smoothed k divided by it before their codes (q·kᵀ unchanged).
1. q·b per row (each (b, h, i)): ``scale_q = amax|q_i| / 127`` (1 where amax is 0), codes
   ``round_half_even(q / scale_q)`` clamped to ±127 (INT8).
2. k smoothed by its per-channel mean over all keys of (b, h) (``ks = k - mean``, float32) and
   divided by b, then per block of 64 keys (the last block partial) ``scale_k = amax|ks| / 127`` over
   the block's keys and all channels (1 where 0), codes as q's.
3. v per (b, h) and channel: ``scale_v = amax_j |v[j, c]| / 448`` (1 where 0), codes
   ``e4m3(v / scale_v)`` (torch's cast: nearest even).
4. scores in the log2 domain, ``s = (qcode · kcode) · scale_q · scale_k · scale · log2(e)`` (the
   integer dot product is exact).
5. online softmax over the key blocks in order: ``m' = max(m, rowmax(s_blk))``,
   ``alpha = exp2(m - m')``, ``p = exp2(s_blk - m')``, ``l = l·alpha + rowsum(p)`` (the float32 p),
   ``o = o·alpha + e4m3(p · 448) @ vcode`` (float32 accumulation).
6. ``out = o / l · scale_v / 448``, rounded to the input dtype.

That is p·v on FP8 tensor cores (``values="e4m3"``), which the binding runs on sm_89. On sm_90 and
later, where mma.sync has no native e4m3, it runs p·v on 16-bit tensor cores instead
(``values="input"``): step 3 is skipped, step 5 multiplies p rounded to v's dtype with v as given,
and step 6 is ``o / l``.

Subtracting k's mean adds the same constant ``q_i · mean`` to every score of row i, which softmax
cancels: the smoothing changes only what the INT8 codes lose (keys with a large common offset
would otherwise spend their 8 bits on it). The keyword switches of ``emulate_attention_8bit`` turn
each quantization off, so a test can check the tiling and scaling math alone against float64, and
what each quantization costs.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch

INT8_MAX = 127.0
E4M3_MAX = 448.0
KEY_BLOCK = 64  # keys per block: k's INT8 scales and the online softmax's steps
LOG2E = math.log2(math.e)


def softmax_scale(head_dim: int, scale: Optional[float]) -> float:
    """The op's scale: ``scale`` when given, else ``1 / sqrt(head_dim)``."""
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        scale: Optional[float] = None) -> torch.Tensor:
    """Exact non-causal attention ``softmax(q kᵀ · scale) v`` in float64 (returned in float64).

    q ``[B, H, Sq, D]``, k and v ``[B, H, Sk, D]``, any layout; scale defaults to ``1/sqrt(D)``. As
    SDPA's math backend: a NaN in q's row i makes out row i NaN, a NaN in any key makes every row
    NaN, a NaN in v[j, c] makes column c NaN; Sk = 0 gives zeros."""
    q64, k64, v64 = q.double(), k.double(), v.double()
    s = torch.matmul(q64, k64.transpose(-1, -2)) * softmax_scale(q.shape[-1], scale)
    if k.shape[-2] == 0:
        return torch.zeros(*q.shape[:-1], v.shape[-1], dtype=torch.float64, device=q.device)
    return torch.matmul(torch.softmax(s, dim=-1), v64)


def _scale_of(amax: torch.Tensor, code_max: float) -> torch.Tensor:
    """amax / code_max in float32, 1 where amax is 0 (NaN stays NaN)."""
    return torch.where(amax == 0, torch.ones_like(amax), amax / code_max)


def _int8_codes(x32: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """round_half_even(x / scale) clamped to ±127, kept in float32 (exact integers; a NaN stays NaN
    where an int8 cast would be undefined)."""
    return torch.round(x32 / scale).clamp(-INT8_MAX, INT8_MAX)


def _e4m3(x32: torch.Tensor) -> torch.Tensor:
    """torch's float8_e4m3fn cast (nearest even; the values here are within ±448 up to float32's
    rounding of a quotient, which the cast rounds back to ±448), back in float32."""
    return x32.to(torch.float8_e4m3fn).float()


class Quantized(NamedTuple):
    """What the kernel's prologue makes of q, k and v (float32 tensors; codes are exact values)."""

    q_codes: torch.Tensor  # [B, H, Sq, D] integers in [-127, 127]
    q_scale: torch.Tensor  # [B, H, Sq, 1]
    k_mean: torch.Tensor  # [B, H, 1, D] per-channel mean over the keys
    k_codes: torch.Tensor  # [B, H, Sk, D] integers in [-127, 127], of k - k_mean
    k_scale: torch.Tensor  # [B, H, ceil(Sk / 64)] one per key block
    v_codes: torch.Tensor  # [B, H, Sk, D] e4m3 values
    v_scale: torch.Tensor  # [B, H, 1, D] per channel


def quantize_q(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 1: (codes, scale) of q per row, INT8."""
    q32 = q.float()
    scale = _scale_of(q32.abs().amax(dim=-1, keepdim=True), INT8_MAX)
    return _int8_codes(q32, scale), scale


def smooth_k(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 2's smoothing: (k - mean, mean), the mean over all keys per channel, float32."""
    k32 = k.float()
    mean = k32.mean(dim=-2, keepdim=True)
    return k32 - mean, mean


def channel_balance(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The per-channel balance ``b = sqrt(amax(k - mean) / amax q)`` ([B, H, 1, D], float32) that q
    is multiplied and the smoothed k divided by before their INT8 codes (SmoothQuant's migration:
    q·kᵀ is unchanged, and an outlier channel of either spends its range on both). As the kernel:
    amax(k - mean) is ``max(max k - mean, mean - min k)`` over the keys, q's amax counts finite
    values only (a NaN or infinity in one row of q leaves the other rows finite), and a balance that
    is not finite and positive is 1."""
    q32, k32 = q.float(), k.float()
    mean = k32.mean(dim=-2, keepdim=True)
    k_amax = torch.maximum(k32.amax(dim=-2, keepdim=True) - mean, mean - k32.amin(dim=-2, keepdim=True))
    q_amax = torch.where(q32.isfinite(), q32.abs(), torch.zeros_like(q32)).amax(dim=-2, keepdim=True)
    b = torch.sqrt(k_amax / q_amax)
    return torch.where(b.isfinite() & (b > 0), b, torch.ones_like(b))


def key_blocks(n_keys: int, block: int = KEY_BLOCK) -> list[slice]:
    """The key blocks in order: keys [64 j, 64 j + 64), the last one partial."""
    return [slice(start, min(start + block, n_keys)) for start in range(0, n_keys, block)]


def quantize_k_blocks(ks: torch.Tensor, block: int = KEY_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 2's INT8 codes of the smoothed keys: one scale per block of ``block`` keys over the
    block's keys and all channels. Returns (codes [B, H, Sk, D], scales [B, H, n_blocks])."""
    blocks = key_blocks(ks.shape[-2], block)
    scales = [_scale_of(ks[..., b, :].abs().amax(dim=(-2, -1)), INT8_MAX) for b in blocks]
    scale = torch.stack(scales, dim=-1) if scales else ks.new_ones((*ks.shape[:-2], 0))
    codes = torch.cat([_int8_codes(ks[..., b, :], scale[..., j, None, None]) for j, b in enumerate(blocks)], dim=-2) \
        if blocks else ks.clone()
    return codes, scale


def quantize_v(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 3: (e4m3 codes, scale) of v per channel over all keys."""
    v32 = v.float()
    scale = _scale_of(v32.abs().amax(dim=-2, keepdim=True), E4M3_MAX)
    return _e4m3(v32 / scale), scale


def quantize(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int = KEY_BLOCK) -> Quantized:
    """Steps 1-3 (with the channel balance: q·b, (k - mean)/b)."""
    b = channel_balance(q, k)
    q_codes, q_scale = quantize_q(q.float() * b)
    ks, mean = smooth_k(k)
    k_codes, k_scale = quantize_k_blocks(ks / b, block)
    v_codes, v_scale = quantize_v(v)
    return Quantized(q_codes, q_scale, mean, k_codes, k_scale, v_codes, v_scale)


VALUES = ("e4m3", "input", "exact")


def emulate_attention_8bit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float] = None, *,
                           values: str = "e4m3", int8_qk: bool = True, smooth: bool = True, balance: bool = True,
                           smooth_q: bool = False, key_scale: str = "block", block: int = KEY_BLOCK,
                           out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Steps 1-6, with the p·v product of either of the kernel's forms and switches for the tests.

    ``values``: ``"e4m3"``, p·v on FP8 tensor cores (steps 3 and 5: p·448 and v's per-channel codes
    in e4m3; sm_89); ``"input"``, p·v on 16-bit tensor cores (p rounded to v's dtype, v as given,
    no v scale; what the binding runs on sm_90 and later, where mma.sync has no native e4m3);
    ``"exact"``, p and v in float32 (neither rounded). ``int8_qk=False`` takes q and the (smoothed or
    not) k unquantized into the scores; ``smooth=False`` quantizes k itself (no mean subtracted);
    ``balance=False`` leaves out the channel balance (``channel_balance``) before the codes. The
    scores, the online softmax over blocks of ``block`` keys and the final division run as the
    kernel's either way. Returns contiguous ``[B, H, Sq, D]`` in ``out_dtype`` (default q's dtype;
    float32 keeps the unrounded result).

    Two steps the kernel does not take yet, for measuring the next recipe (benchmarks/NOTES.md
    §8-bit attention): ``smooth_q=True`` subtracts q's channel mean over the queries before its codes
    and adds its product with the smoothed k, a per-key bias, to the scores exactly (SageAttention 2's
    q smoothing); ``key_scale="key"`` gives k one INT8 scale per key instead of per block."""
    assert values in VALUES, values
    out_dtype = q.dtype if out_dtype is None else out_dtype
    B, H, Sq, D = q.shape
    Sk = k.shape[-2]
    if Sk == 0 or q.numel() == 0:
        return torch.zeros(B, H, Sq, v.shape[-1], dtype=out_dtype, device=q.device)
    assert key_scale in ("block", "key"), key_scale
    q32, k32, v32 = q.float(), k.float(), v.float()
    if smooth:
        k32, _ = smooth_k(k32)
    key_bias = None  # [B, H, 1, Sk]: q's mean times each (smoothed) key
    if int8_qk and smooth_q:
        q_mean = q32.mean(dim=-2, keepdim=True)
        q32 = q32 - q_mean
        key_bias = torch.matmul(q_mean.double(), k32.double().transpose(-1, -2)).float()
    if int8_qk and balance:
        b = channel_balance(q32, k)
        q32, k32 = q32 * b, k32 / b
    if int8_qk:
        qa, q_scale = quantize_q(q32)
        if key_scale == "key":
            ka, per_key = quantize_q(k32)  # one scale per row of k: per key
        else:
            ka, k_scale = quantize_k_blocks(k32, block)
    else:
        qa, q_scale = q32, torch.ones_like(q32[..., :1])
        ka, k_scale = k32, torch.ones(B, H, len(key_blocks(Sk, block)), device=q.device)
    if values == "e4m3":
        va, v_scale = quantize_v(v32)
        p_unit = E4M3_MAX  # p · 448 in e4m3; v's codes carry 1/448 of their scale
    else:
        va, v_scale, p_unit = v32, torch.ones_like(v32[..., :1, :]), 1.0
    # step 4's factor per row (scale_q · scale · log2 e); scale_k joins per block
    row_factor = q_scale * torch.tensor(softmax_scale(D, scale), dtype=torch.float32) \
        * torch.tensor(LOG2E, dtype=torch.float32)
    m = torch.full((B, H, Sq, 1), -math.inf, dtype=torch.float32, device=q.device)
    l = torch.zeros((B, H, Sq, 1), dtype=torch.float32, device=q.device)
    o = torch.zeros((B, H, Sq, D), dtype=torch.float32, device=q.device)
    for j, keys in enumerate(key_blocks(Sk, block)):
        # the integer dot products, exact in float64 (|sum| <= 128 * 127^2 < 2^24: exact in float32
        # too); unquantized, the float64 product rounded once
        dots = torch.matmul(qa.double(), ka[..., keys, :].double().transpose(-1, -2)).float()
        if int8_qk and key_scale == "key":
            s = dots * per_key[..., keys, 0].unsqueeze(-2) * row_factor
        else:
            s = dots * k_scale[..., j, None, None] * row_factor
        if key_bias is not None:
            s = s + key_bias[..., keys] * torch.tensor(softmax_scale(D, scale) * LOG2E, dtype=torch.float32)
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        alpha = torch.exp2(m - m_new)
        p = torch.exp2(s - m_new)
        l = l * alpha + p.sum(dim=-1, keepdim=True)
        if values == "e4m3":
            pa = _e4m3(p * E4M3_MAX)
        elif values == "input":
            pa = p.to(v.dtype).float()
        else:
            pa = p
        acc = torch.matmul(pa.double(), va[..., keys, :].double()).float()  # fp32 accumulation, summed once
        o = o * alpha + acc
        m = m_new
    out = o / l * v_scale / p_unit
    return out.to(out_dtype)


def attention_8bit_emulation(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float] = None,
                             values: str = "e4m3") -> torch.Tensor:
    """What ``attention_8bit`` computes (steps 1-6 of the module docstring): INT8 q·kᵀ after
    smoothing k, float32 online softmax over blocks of 64 keys, p·v on FP8 e4m3 (``values="e4m3"``,
    sm_89) or on 16-bit tensor cores with p rounded to v's dtype (``values="input"``, sm_90+),
    rounded once to q's dtype. Returns a contiguous ``[B, H, Sq, D]`` tensor (the op's layout is its
    own matter). Agrees with the kernel up to float32 rounding order (the mean's and the
    accumulators' sums, exp2's approximation), which can move an 8-bit code by one step now and then."""
    return emulate_attention_8bit(q, k, v, scale, values=values)


def cosine_and_rel_l2(out: torch.Tensor, ref: torch.Tensor, dims=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine similarity and relative L2 error ``|out - ref| / |ref|`` of out against ref in float64,
    over all elements (``dims=None``) or over ``dims`` (e.g. ``(-2, -1)``: one per (b, h))."""
    a, b = out.double(), ref.double()
    dims = tuple(range(a.dim())) if dims is None else dims
    dot = (a * b).sum(dim=dims)
    na, nb = a.pow(2).sum(dim=dims).sqrt(), b.pow(2).sum(dim=dims).sqrt()
    return dot / (na * nb), (a - b).pow(2).sum(dim=dims).sqrt() / nb
