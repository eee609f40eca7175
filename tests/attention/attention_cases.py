"""The attention family's catalog entries (tests/op_catalog.py gathers them): attention_8bit with the
default scale and with one given, on q [B, H, Sq, D] and k, v [B, H, Sk, D] in each layout the op
takes: contiguous heads ([B, H, S, D]), diffusers' [B, S, H, D] transposed (heads inner to the
sequence) and views of one fused q/k/v projection [B, S, 3, H, D]. float16 and bfloat16 only: the
float32 dtype of a catalog run takes bfloat16 (as linear_fp8's outputs)."""

import torch

# case -> (B, H, Sq, Sk, D, layout): key blocks of 64 whole and partial (77, 130, 1000 keys), one key,
# cross attention (Sq != Sk), no queries and no keys; "empty_width" is no keys (zeros out)
SHAPES = {
    "small": (1, 2, 64, 64, 64, "heads"),
    "aligned": (2, 3, 128, 192, 128, "heads"),
    "wide": (1, 4, 320, 1000, 128, "tokens"),
    "odd": (1, 2, 77, 130, 64, "tokens"),
    "strided": (2, 3, 65, 65, 64, "qkv"),
    "empty": (2, 2, 0, 64, 64, "tokens"),
    "empty_width": (1, 2, 33, 0, 64, "heads"),
}
CASES = tuple(SHAPES)
GIVEN_SCALE = 0.2


def dtype_of(m) -> torch.dtype:
    """The case's dtype: bfloat16 for float32, which the op refuses."""
    return torch.bfloat16 if m.dtype == torch.float32 else m.dtype


def qkv(m, case):
    """q, k, v for a case: values drawn [B, H, S, D] on the CPU (the same bits in every layout),
    placed in the case's layout on the Maker's device."""
    B, H, Sq, Sk, D, layout = SHAPES[case]
    dtype = dtype_of(m)
    q, k, v = (m.values((B, H, s, D), scale=1.0, offset=0.25) for s in (Sq, Sk, Sk))
    if layout == "heads":
        return tuple(m.place(t, dtype=dtype) for t in (q, k, v))
    if layout == "tokens":  # [B, S, H, D] memory, as diffusers' processors hold it
        return tuple(m.place(t.transpose(1, 2), dtype=dtype).transpose(1, 2) for t in (q, k, v))
    assert Sq == Sk, case  # one fused projection [B, S, 3, H, D]
    fused = m.place(torch.stack((q, k, v), dim=2).transpose(1, 3), dtype=dtype)  # [B, S, 3, H, D]
    return tuple(fused[:, :, i].transpose(1, 2) for i in range(3))


def entries():
    def attention(scale):
        def build(m, case):
            return (*qkv(m, case), scale), ()
        return build

    return {"attention_8bit": ("attention_8bit", attention(None)),
            "attention_8bit[scale]": ("attention_8bit", attention(GIVEN_SCALE))}
