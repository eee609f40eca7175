"""transformer-kernels: fused CUDA kernels for Hugging Face diffusers and transformers models.

Every op is registered in C++ under this build's op namespace (reach it through ``ops``) and has
a fake implementation, so it runs under ``torch.compile(fullgraph=True)`` without graph breaks.
"""

from . import layers
from ._ops import add_op_namespace_prefix, ops
from .norm import rms_norm

__all__ = ["layers", "ops", "add_op_namespace_prefix", "rms_norm"]
