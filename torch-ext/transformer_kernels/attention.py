"""8-bit attention for diffusion transformers: Python API and fake (meta) implementation.

``attention_8bit(q, k, v)`` is non-causal ``softmax(q kᵀ · scale) v`` with its products in 8 bits,
SageAttention2's recipe: q·kᵀ in INT8 (q per row; k per block of 64 keys after subtracting its
per-channel mean over the keys, which softmax cancels, and with q's and k's channels balanced),
the softmax online in float32, p·v in FP8 e4m3 (v per channel) with float32 accumulation across
blocks (on sm_89; sm_90 and later run p·v on 16-bit tensor cores: ``attention_8bit`` says how).
The 8 bits are internal: it takes and returns 16-bit tensors (it is no ``_fp8`` twin: nothing
crosses the FP8 boundary in its arguments). Forward-only (inference); compute capability 8.9 or
later.
"""

from typing import Optional

import torch

from ._autograd import dispatch
from ._fake import register_fake
from ._ops import ops


def attention_8bit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float] = None) -> torch.Tensor:
    """Non-causal attention ``softmax(q kᵀ · scale) v`` with INT8 q·kᵀ and 8-bit p·v.

    What is quantized, and how (each step in float32 unless said):

    1. k minus its per-channel mean over all keys of (b, h) (a constant per score row, which softmax
       cancels: the 8 bits go to what tells the keys apart); then per channel a balance
       ``b = sqrt(amax|k - mean| / amax|q|)`` (over all keys and queries of (b, h)) that q is
       multiplied and the smoothed k divided by (SmoothQuant's migration: q·kᵀ is unchanged, and an
       outlier channel of either shares its range with the other).
    2. q·b per row: ``scale_q = amax / 127``, codes ``round_half_even(q·b / scale_q)`` in INT8; the
       smoothed k / b per block of 64 keys (the last one partial): ``scale_k = amax / 127`` over the
       block's keys and channels, codes in INT8.
    3. v per channel: ``scale_v = amax_j |v[j, c]| / 448``, codes e4m3 (nearest even).
    4. The scores: exact integer dot products times ``scale_q · scale_k · scale · log2(e)``.
    5. Softmax online over the key blocks (``exp2``); each block's probabilities are taken to e4m3
       as ``p · 448`` and multiplied with v's codes, accumulated in float32 across blocks; the
       normalizer sums the float32 probabilities.
    6. ``out = o / l · scale_v / 448``, rounded once to q's dtype.

    A scale is 1 where its amax is 0. Steps 3, 5 and 6 are the FP8 form of p·v, which runs where
    mma.sync multiplies e4m3 natively (compute capability 8.9). On sm_90 and later p·v runs on
    16-bit tensor cores instead: p rounded to v's dtype, v as given, ``out = o / l``.
    ``reference/attention.py``'s ``attention_8bit_emulation`` is either form, step by step.

    Error against exact attention: k's per-channel offsets cost nothing (subtracted first); q·kᵀ's
    INT8 codes cost about 1 % relative L2 on unstructured inputs, more where outlier channels of q
    or k coarsen the other channels' grid (the balance halves that); the FP8 form of p·v adds about
    2.5 % for p and as much for v (e4m3's 3-bit mantissa, whatever the scale).

    Special values as SDPA's math backend gives them: a NaN in q's row i makes out's row i NaN, a
    NaN in any key every row, a NaN in ``v[..., j, c]`` column c.

    Parameters
    ----------
    q : torch.Tensor
        ``[B, H, Sq, D]``, CUDA float16 or bfloat16, D 64 or 128; the last dimension contiguous, the
        others of any stride that is a multiple of 8 elements, from a 16-byte aligned start:
        diffusers' processors hold ``[B, S, H, D]``, whose ``.transpose(1, 2)`` is taken as it is (no
        copy), as are views of one fused q/k/v projection.
    k, v : torch.Tensor
        ``[B, H, Sk, D]``, q's dtype and device, the same shape (Sk may differ from Sq: joint or
        cross attention); no grouped heads (q's H). Strides as q's.
    scale : float, optional
        The softmax scale; ``1 / sqrt(D)`` when not given.

    Returns
    -------
    torch.Tensor
        ``[B, H, Sq, D]`` in q's dtype, a new tensor laid out as q is: where q's heads are inner to
        its sequence (``q.stride(1) < q.stride(2)``, a transposed ``[B, Sq, H, D]``) it is
        ``[B, Sq, H, D]`` memory returned as ``.transpose(1, 2)``, so that the processor's
        ``.transpose(1, 2).flatten(2)`` is a view; otherwise contiguous. Empty where B, H or Sq is
        0; zeros where Sk is 0. No gradient: under grad mode an input that requires grad is refused.
    """
    return dispatch(_attention_8bit, q, k, v, scale)


_attention_8bit = ops.attention_8bit.default


def attention_output_like(q: torch.Tensor) -> torch.Tensor:
    """An empty output of ``attention_8bit(q, ...)``: q's sizes and dtype, ``[B, Sq, H, D]`` memory
    transposed where ``q.stride(1) < q.stride(2)``, contiguous otherwise (the kernel's allocation)."""
    B, H, Sq, D = q.shape
    if q.stride(1) < q.stride(2):
        return q.new_empty((B, Sq, H, D)).transpose(1, 2)
    return q.new_empty((B, H, Sq, D))


@register_fake("attention_8bit")
def _(q, k, v, scale=None):
    torch._check(q.dim() == 4, lambda: f"attention_8bit: q must be 4-D [B, H, Sq, D], got {q.dim()}-D")
    return attention_output_like(q)
