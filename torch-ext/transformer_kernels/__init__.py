"""transformer-kernels: fused CUDA kernels for Hugging Face diffusers and transformers models.

Every op is registered in C++ under this build's op namespace (reach it through ``ops``) and has
a fake implementation, so it runs under ``torch.compile(fullgraph=True)`` without graph breaks.
"""

from . import layers
from ._ops import add_op_namespace_prefix, ops
from .activation import (
    act_mul,
    gated_add,
    geglu,
    gelu,
    gelu_and_mul,
    gelu_tanh_and_mul,
    silu,
    silu_and_mul,
)
from .group_norm import add_group_norm, group_norm
from .norm import (
    fused_add_rms_norm,
    fused_add_rms_norm_,
    gated_add_norm_modulate,
    layer_norm,
    norm_modulate,
    rms_norm,
)
from .rope import (
    apply_rotary_pos_emb,
    apply_rotary_pos_emb_,
    qk_norm_rope,
    flux_rotary_emb,
    ltx_qk_norm_rope,
    ltx_qk_norm_rope_from_coords,
    ltx_rotary_emb,
    ltx_rope_from_coords,
    hf_qk_norm_rope,
    rotary_embedding,
)

__all__ = [
    "act_mul",
    "add_group_norm",
    "add_op_namespace_prefix",
    "apply_rotary_pos_emb",
    "apply_rotary_pos_emb_",
    "qk_norm_rope",
    "flux_rotary_emb",
    "fused_add_rms_norm",
    "fused_add_rms_norm_",
    "gated_add",
    "gated_add_norm_modulate",
    "geglu",
    "gelu",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
    "group_norm",
    "layer_norm",
    "layers",
    "ltx_qk_norm_rope",
    "ltx_qk_norm_rope_from_coords",
    "ltx_rotary_emb",
    "ltx_rope_from_coords",
    "norm_modulate",
    "ops",
    "hf_qk_norm_rope",
    "rms_norm",
    "rotary_embedding",
    "silu",
    "silu_and_mul",
]
