"""transformer-kernels: fused CUDA kernels for Hugging Face diffusers and transformers models.

Every op is registered in C++ under this build's op namespace (reach it through ``ops``, and its
qualified names through ``add_op_namespace_prefix``: both importable, not part of ``__all__``, the
public functions the kernel card lists) and has
a fake implementation, so it runs under ``torch.compile(fullgraph=True)`` without graph breaks.
A function has the name of the op it calls, except where it keeps the name of the library function
it replaces (``apply_rotary_pos_emb``, vLLM's ``rotary_embedding``, ``silu_and_mul``, ...) or is
a model's form of a shared op (``ltx_rope``, ``flux_rope``, ``ltx_qk_norm_rope``); those name
their op in their docstrings.
Ops with a backward (``has_backward(name)``) train in eager and under ``torch.compile``; the others
refuse inputs that require grad under grad mode instead of dropping their gradients.
"""

from . import layers
from ._autograd import has_backward
from ._ops import add_op_namespace_prefix, ops  # noqa: F401 (importable plumbing, not in __all__)
from .activation import (
    act_mul,
    geglu,
    gelu,
    gelu_and_mul,
    gelu_tanh_and_mul,
    silu,
    silu_and_mul,
)
from .attention import attention_8bit
from .group_norm import add_group_norm, group_norm
from .gemm import decode_linear, linear_fp8, linear_gelu, linear_gelu_fused
from .loss import fused_linear_cross_entropy
from .norm import (
    fused_add_rms_norm,
    fused_add_rms_norm_,
    fused_add_rms_norm_fp8,
    gated_add,
    gated_add_norm_modulate,
    gated_add_norm_modulate_fp8,
    layer_norm,
    layer_norm_fp8,
    norm_modulate,
    norm_modulate_fp8,
    rms_norm,
    rms_norm_fp8,
)
from .qk_norm_rope import (
    hf_qk_norm_rope,
    ltx_qk_norm_rope,
    ltx_qk_norm_rope_from_coords,
    qk_norm_rope,
)
from .quant import act_mul_fp8, quantize_fp8
from .rope import (
    apply_rotary_pos_emb,
    apply_rotary_pos_emb_,
    flux_rope,
    ltx_rope,
    ltx_rope_from_coords,
    rotary_embedding,
)

__all__ = [
    "act_mul",
    "act_mul_fp8",
    "add_group_norm",
    "apply_rotary_pos_emb",
    "apply_rotary_pos_emb_",
    "attention_8bit",
    "decode_linear",
    "flux_rope",
    "fused_add_rms_norm",
    "fused_add_rms_norm_",
    "fused_add_rms_norm_fp8",
    "fused_linear_cross_entropy",
    "gated_add",
    "gated_add_norm_modulate",
    "gated_add_norm_modulate_fp8",
    "geglu",
    "has_backward",
    "gelu",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "group_norm",
    "hf_qk_norm_rope",
    "layer_norm",
    "layer_norm_fp8",
    "layers",
    "linear_fp8",
    "linear_gelu",
    "linear_gelu_fused",
    "ltx_qk_norm_rope",
    "ltx_qk_norm_rope_from_coords",
    "ltx_rope",
    "ltx_rope_from_coords",
    "norm_modulate",
    "norm_modulate_fp8",
    "qk_norm_rope",
    "quantize_fp8",
    "rms_norm",
    "rms_norm_fp8",
    "rotary_embedding",
    "silu",
    "silu_and_mul",
]

# Every op left without an Autograd kernel (out= and in-place forms, backward ops) refuses grad.
from ._autograd import refuse_the_rest as _refuse_the_rest  # noqa: E402

_refuse_the_rest()
