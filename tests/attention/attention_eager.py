"""The attention family's eager CPU stand-ins (tests/eager_kernel.py gathers them): attention_8bit is
reference/attention.py's emulation of the kernel (its quantization, tiling and rounding), returned in
the layout the kernel allocates (q's: [B, Sq, H, D] memory transposed where q's heads are inner to
its sequence, as the fake gives)."""

import torch

from reference.attention import attention_8bit_emulation


def in_the_layout_of(q: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out [B, H, Sq, D] (contiguous) copied into the kernel's allocation for q."""
    if q.stride(1) < q.stride(2):
        return out.transpose(1, 2).contiguous().transpose(1, 2)
    return out.contiguous()


IMPLS = {
    "attention_8bit": lambda q, k, v, scale=None: in_the_layout_of(q, attention_8bit_emulation(q, k, v, scale)),
}
