"""The Hub path for transformers: ``kernelize`` with ``kernel_mapping()``, or
``from_pretrained(..., use_kernels=True, kernel_config=kernel_config())``, swaps in our ``RMSNorm``,
``Silu`` and ``RotaryPosEmb`` layers (``mode=Mode.TRAINING`` takes those whose ``has_backward`` is true).
"""

from __future__ import annotations

from ..loading import REPO_ID, REVISION

# transformers' hub layer names -> our layers, for kernels.use_kernel_mapping + kernelize (the Hub
# path). revision="v1" names the branch version=1 resolves to: LayerRepository resolves version= on
# the Hub even when LOCAL_KERNELS names a local build (plain get_kernel does not), so the branch
# works offline too. trust_remote_code=True: transformer-kernels is not a trusted Kernel Hub
# publisher, and kernels refuses such a repository otherwise (see loading.py).
HUB_LAYERS = {"RMSNorm": "RMSNorm", "rotary_pos_emb": "RotaryPosEmb", "SiLU": "Silu", "GeluTanh": "GeluTanh"}

# The hub layers a Llama-family model (Llama, Mistral, Qwen2, Qwen3) registers, for kernel_config().
LLAMA_HUB_LAYERS = ("SiLU", "rotary_pos_emb", "RMSNorm")


def kernel_mapping(device: str = "cuda") -> dict:
    """The mapping for ``kernels.use_kernel_mapping``: every transformers hub layer we implement."""
    from kernels import LayerRepository

    return {name: {device: LayerRepository(REPO_ID, layer_name=layer, revision=REVISION, trust_remote_code=True)}
            for name, layer in HUB_LAYERS.items()}


def kernel_config(layers: tuple[str, ...] = LLAMA_HUB_LAYERS, device: str = "cuda"):
    """transformers' ``KernelConfig`` mapping the model's hub layers to ours, for
    ``from_pretrained(..., use_kernels=True, kernel_config=kernel_config())``.

    `layers` must be hub layer names the model registers (transformers rejects the others); the
    default is the Llama family's. ``RMSNorm`` goes last: transformers 5.2x re-adds the last entry
    under the name of our layer class, which only matches for ``RMSNorm``."""
    from transformers import KernelConfig

    unknown = [name for name in layers if name not in HUB_LAYERS]
    if unknown:
        raise ValueError(f"kernel_config: no layer of ours for {unknown}; we have {sorted(HUB_LAYERS)}")
    ordered = sorted(layers, key=lambda name: name == "RMSNorm")
    return KernelConfig({name: {device: (f"{REPO_ID}:{HUB_LAYERS[name]}", {"revision": REVISION, "trust_remote_code": True})}
                         for name in ordered})
