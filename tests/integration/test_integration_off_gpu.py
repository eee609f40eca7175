"""The diffusers rules off the GPU: a model whose tensors are on the CPU, injected with the kernel
(a stand-in refusing CPU tensors as the CUDA build does), runs diffusers' own forwards and
processors: the output is the uninjected model's bit for bit, every patched kind's fallback is
counted in the report and logged once, and ``strict=True`` raises ``KernelFallbackError``."""

import logging

import pytest
import torch

from integration_helpers import CudaOnlyKernels

diffusers = pytest.importorskip("diffusers")

from test_integration_diffusers import flux_inputs, ltx_inputs, small_flux, small_ltx, small_sd3, sd3_inputs  # noqa: E402
from test_integration_sd import SDXL, small_unet, small_vae, unet_inputs  # noqa: E402
from transformer_kernels_integrations import KernelFallbackError  # noqa: E402
from transformer_kernels_integrations.diffusers_models import inject, uninject  # noqa: E402


def vae_roundtrip(vae):
    image = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    return lambda: vae.decode(vae.encode(image).latent_dist.mode()).sample


MODELS = {
    "ltx": lambda: (lambda m, x: (m, lambda: m(**x)[0]))(small_ltx(), ltx_inputs()),
    "flux": lambda: (lambda m, x: (m, lambda: m(**x)[0]))(small_flux(), flux_inputs()),
    "sd3": lambda: (lambda m, x: (m, lambda: m(**x)[0]))(small_sd3(), sd3_inputs()),
    "sdxl_unet": lambda: (lambda m, x: (m, lambda: m(**x)[0]))(small_unet(SDXL), unet_inputs(SDXL)),
    "vae": lambda: (lambda m: (m, vae_roundtrip(m)))(small_vae()),
}


@pytest.mark.parametrize("name", MODELS)
def test_cpu_model_runs_diffusers_code(tk, name, caplog):
    model, run = MODELS[name]()
    with torch.no_grad():
        expected = run()
        report = inject(model, CudaOnlyKernels(tk))
        guarded = {kind for kind in report.replaced if not kind.endswith("merged_projections")}
        assert guarded, report
        with caplog.at_level(logging.WARNING, logger="transformer_kernels_integrations"):
            first = run()
            second = run()
    assert torch.equal(first, expected) and torch.equal(second, expected)
    assert set(report.fallbacks_taken) == guarded, report
    assert all(n >= 2 for n in report.fallbacks_taken.values()), report  # counted on every call
    messages = [r.getMessage() for r in caplog.records if "tensors on cpu, not the GPU" in r.getMessage()]
    assert sorted(m.split(":")[1].strip().split(" ")[0] for m in messages) == sorted(guarded)  # once per kind
    uninject(model)


@pytest.mark.parametrize("name", MODELS)
def test_cpu_model_under_strict_raises(tk, name):
    model, run = MODELS[name]()
    inject(model, CudaOnlyKernels(tk), strict=True)
    with torch.no_grad(), pytest.raises(KernelFallbackError, match="tensors on cpu, not the GPU"):
        run()
