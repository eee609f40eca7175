"""What the diffusers rules share: the projection names, our attention processors' base (the
processor it replaces runs for tensors off the GPU), the merged projections' lookup, the q/k RMSNorm
through the Hub layer, and the patch that installs a processor.
"""

from __future__ import annotations

from types import ModuleType
from typing import Callable

import torch

from .. import merging

QKV = ("to_q", "to_k", "to_v")
MERGED_FALLBACK = "where gradients are wanted, the separate projections"


def merged_projection(attn, key: str, x: torch.Tensor):
    """The merged projection ``key`` of attn where it can run for x (no gradient wanted), or None
    (a merge that cannot run reports it: ``MergedLinear.use``)."""
    merged = merging.merged_of(attn, key)
    return merged if merged is not None and merged.use(x) else None


def torch_rms_norm(tk: ModuleType, norm: torch.nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """A q/k ``torch.nn.RMSNorm`` through the Hub layer's forward (torch rounding, its eps=None)."""
    return tk.layers.RMSNorm.forward(norm, x)


class KernelProcessor:
    """Base of our attention processors. ``Injection.set_processor`` gives it the processor it
    replaces and the devices our kernels take: hidden states elsewhere run the replaced one (a
    logged fallback; ``KernelFallbackError`` under ``strict=True``)."""

    replaced = None
    kernel_devices: Callable[[], tuple[str, ...]] = None
    off_device: Callable[[torch.device], None] = None

    def _replaced_for(self, hidden_states: torch.Tensor):
        """The replaced processor where `hidden_states` is off the kernel devices, else None."""
        if self.replaced is None or hidden_states.device.type in self.kernel_devices():
            return None
        self.off_device(hidden_states.device)
        return self.replaced


def processor(cls: type, **options) -> Callable[[torch.nn.Module, object], None]:
    """A patch that gives the attention module ``cls(tk, **options)``, told which ops to run
    (``Injection.ours``: in training, those with a backward)."""
    return lambda module, inj: inj.set_processor(module, cls(inj.tk, ours=inj.ours, **options))
