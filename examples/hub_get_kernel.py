#!/usr/bin/env python3
"""Loading transformer-kernels from the Kernel Hub with ``kernels.get_kernel``, and ``kernelize``.

    python examples/hub_get_kernel.py                 # from the Hub
    python examples/hub_get_kernel.py --local-build   # the same code, resolved to ./build (LOCAL_KERNELS)
"""

import torch

from _cli import parse, parser
from transformer_kernels_integrations.loading import REPO_ID, VERSION


def main() -> None:
    parse(parser(__doc__))  # --local-build: what the Hub would serve, from this checkout's build/

    from kernels import LayerRepository, Mode, get_kernel, kernelize, replace_kernel_forward_from_hub, use_kernel_mapping

    # trust_remote_code=True: transformer-kernels is not a trusted Kernel Hub publisher, and kernels
    # refuses such a repository without it (LOCAL_KERNELS, --local-build, never asks)
    tk = get_kernel(REPO_ID, version=VERSION, trust_remote_code=True)
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(4096, device="cuda", dtype=torch.bfloat16) + 0.5
    residual = torch.randn_like(x)
    print("rms_norm:", tk.rms_norm(x, w, eps=1e-5).shape)
    out, new_residual = tk.fused_add_rms_norm(x, residual, w, 1e-5)
    print("fused_add_rms_norm:", out.shape, new_residual.shape)
    gate_up = torch.randn(8, 2 * 14336, device="cuda", dtype=torch.bfloat16)
    print("silu_and_mul:", tk.silu_and_mul(gate_up).shape)

    # kernelize: transformers' RMSNorm modules carry use_kernel_forward_from_hub("RMSNorm") when
    # transformers accepts the installed kernels (transformers 5.24 with the pinned kernels 0.18.3);
    # with another kernels, tag the class here so it works either way
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    if getattr(LlamaRMSNorm, "kernel_layer_name", None) is None:
        replace_kernel_forward_from_hub(LlamaRMSNorm, "RMSNorm")

    config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1000)
    model = LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    mapping = {"RMSNorm": {"cuda": LayerRepository(REPO_ID, layer_name="RMSNorm", revision="v1", trust_remote_code=True)}}
    with use_kernel_mapping(mapping):
        model = kernelize(model, mode=Mode.INFERENCE, device="cuda")
    assert model.model.norm.forward.__func__ is tk.layers.RMSNorm.forward, "kernelize left RMSNorm alone"
    ids = torch.randint(0, 1000, (1, 12), device="cuda")
    with torch.no_grad():
        print("kernelized Llama logits:", model(ids).logits.shape)


if __name__ == "__main__":
    main()
