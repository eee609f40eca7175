"""layers.RMSNorm through kernels.kernelize, against the modules it replaces."""

import pytest
import torch
from kernels import LayerRepository, Mode, kernelize, use_kernel_forward_from_hub, use_kernel_mapping

from conftest import REPO_ID
from helpers import assert_matches_eager
from reference.norms import diffusers_rms_norm, hf_rms_norm

# revision="v1" is the branch `version=1` names; kernels 0.17 resolves version= on the Hub even
# when LOCAL_KERNELS overrides the repository, so offline runs name the branch.
MAPPING = {"RMSNorm": {"cuda": LayerRepository(repo_id=REPO_ID, layer_name="RMSNorm", revision="v1")}}


@use_kernel_forward_from_hub("RMSNorm")
class LlamaRMSNorm(torch.nn.Module):
    """transformers' LlamaRMSNorm (same attributes and forward)."""

    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        return hf_rms_norm(hidden_states, self.weight, self.variance_epsilon)


@use_kernel_forward_from_hub("RMSNorm")
class DiffusersRMSNorm(torch.nn.Module):
    """diffusers' RMSNorm (attributes eps, weight (None without affine), bias)."""

    def __init__(self, dim, eps, elementwise_affine=True):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(dim)) if elementwise_affine else None
        self.bias = None

    def forward(self, hidden_states):
        return diffusers_rms_norm(hidden_states, self.weight, self.eps)


@use_kernel_forward_from_hub("RMSNorm")
class TorchRMSNorm(torch.nn.RMSNorm):
    pass


def models():
    return {
        "llama": LlamaRMSNorm(2048, eps=1e-5),
        "diffusers_no_weight": DiffusersRMSNorm(2048, eps=1e-6, elementwise_affine=False),
        "diffusers_weight": DiffusersRMSNorm(2048, eps=1e-6),
        "torch_eps_none": TorchRMSNorm(2048, eps=None),
        "torch_eps": TorchRMSNorm(2048, eps=1e-5),
    }


@pytest.mark.parametrize("name", sorted(models()))
def test_kernelize_installs_our_forward(tk, name, monkeypatch):
    """The Hub path end to end (mapping, LOCAL_KERNELS load, layer validation, forward swap)."""
    if not torch.cuda.is_available():  # kernelize(device="cuda") reads the capability; stand in for it
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args, **kwargs: (9, 0))
    module = models()[name]
    with use_kernel_mapping(MAPPING, inherit_mapping=False):
        kernelize(module, mode=Mode.INFERENCE, device="cuda", use_fallback=False)
    assert module.forward.__func__.__qualname__ == "RMSNorm.forward"
    assert module.forward.__func__.__module__ == tk.layers.__name__


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(models()))
def test_kernelized_output_matches_module(tk, name):
    module = models()[name].to("cuda", torch.bfloat16)
    if getattr(module, "weight", None) is not None:
        with torch.no_grad():
            module.weight.copy_(torch.rand(2048) + 0.5)
    x = (torch.randn(3, 77, 2048, device="cuda") * 3).to(torch.bfloat16)
    expected = module(x)
    with use_kernel_mapping(MAPPING, inherit_mapping=False):
        kernelize(module, mode=Mode.INFERENCE, device="cuda", use_fallback=False)
    out = module(x)
    assert out.dtype == expected.dtype and out.shape == expected.shape
    # Equal except where a differently ordered fp32 sum lands a value across a rounding boundary
    # (two roundings: up to 2 ulp).
    assert_matches_eager(out, expected, expected.double().abs(), 4)


@pytest.mark.gpu
def test_kernelized_model_compiles_fullgraph(tk):
    model = torch.nn.Sequential(LlamaRMSNorm(1024), torch.nn.Linear(1024, 1024), LlamaRMSNorm(1024))
    model = model.to("cuda", torch.bfloat16)
    with use_kernel_mapping(MAPPING, inherit_mapping=False):
        kernelize(model, mode=Mode.INFERENCE | Mode.TORCH_COMPILE, device="cuda", use_fallback=False)
    x = torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(x), model(x), rtol=2**-7, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["diffusers_weight", "torch_eps"])
def test_kernelized_norm_takes_channels_first_views(tk, name):
    """LTX-Video's VAE normalizes channels-first activations through movedim (channel stride
    T*H*W): the output equals eager's. diffusers' elementwise code keeps the input's layout and
    so does the layer (torch.nn.RMSNorm's fused kernel returns a contiguous tensor instead)."""
    module = models()[name].to("cuda", torch.bfloat16)
    with torch.no_grad():
        module.weight.copy_(torch.rand(2048) + 0.5)
    x = (torch.randn(2, 2048, 3, 5, 7, device="cuda") * 3).to(torch.bfloat16).movedim(1, -1)
    assert x.stride(-1) != 1
    expected = module(x)
    with use_kernel_mapping(MAPPING, inherit_mapping=False):
        kernelize(module, mode=Mode.INFERENCE, device="cuda", use_fallback=False)
    out = module(x)
    assert out.shape == expected.shape and out.stride() == x.stride()
    if name.startswith("diffusers"):
        assert expected.stride() == x.stride()
    assert_matches_eager(out, expected, expected.double().abs(), 4)
