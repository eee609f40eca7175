"""Exact integration checks.

On the CPU:
- the eager reference copies in reference/ give, bit for bit, what the installed transformers and
  diffusers modules give on the same inputs (fp32 and bf16);
- the models injected with the package's real Python code (API wrappers and Hub layers, see
  tests/eager_kernel.py), its C++ ops replaced by the eager code they reproduce, give the eager
  model's output bit for bit in bf16, where the three RMSNorm roundings differ (a layer that picked
  the wrong rounding, eps, weight or bias would show).

On the GPU (bf16, the real kernels):
- every output element within ULPS ulps of eager's (ulps at the larger of |eager| and the RMS of its
  row), at most SHARE_BEYOND of the elements beyond that, none beyond CAP_ULPS;
- greedy generation: GENERATE_TOKENS new tokens equal eager's, or the first divergence is a near
  tie in eager's own logits (explained in the failure message otherwise).
"""

import copy
import importlib
import types

import pytest
import torch

from eager_kernel import eager_kernel
from helpers import perturbed, randomize_norm_weights
from reference import activations as ref_act
from reference import norms as ref_norms
from reference import rope as ref_rope

transformers = pytest.importorskip("transformers")
diffusers = pytest.importorskip("diffusers")
from transformer_kernels_integrations import diffusers_models, transformers_models  # noqa: E402

ULPS = 16  # bf16 ulps of max(|eager|, row RMS)
SHARE_BEYOND = 1e-2  # of the elements may exceed ULPS
# No element may be farther from eager than NOISE_FACTOR times the farthest element of the eager
# model with one ulp added to a tenth of its weights (the noise floor: bf16 on the CPU gives 5 to
# 14 ulps for these models), nor than ULPS where that is less, nor ever than CAP_ULPS.
NOISE_FACTOR = 8
CAP_ULPS = 128
GENERATE_TOKENS = 32
# Our logits may differ from eager's by at most this share of the row's largest |logit| (a few bf16
# roundings through two layers are ~1 %; garbage, zeroed or misrouted logits are ~100 %).
LOGIT_TOLERANCE = 32 * 2.0**-8

# ---- small models (the shapes of the integration tests: every injected path, a few layers) ----

LLM_CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2, vocab_size=101),
    "qwen3": lambda: transformers.Qwen3Config(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                              vocab_size=101),
}
LLM_CLASSES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}


@pytest.fixture(autouse=True)
def restore_rotary_functions(monkeypatch):
    """inject() swaps apply_rotary_pos_emb in the modeling modules: undone after each test."""
    for name in LLM_CLASSES:
        modeling = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)


def small_llm(name, dtype, device):
    torch.manual_seed(0)
    model = getattr(transformers, LLM_CLASSES[name])(LLM_CONFIGS[name]())
    randomize_norm_weights(model)
    return model.to(device, dtype).eval()


def small_ltx(dtype, device):
    torch.manual_seed(0)
    model = diffusers.LTXVideoTransformer3DModel(in_channels=8, out_channels=8, num_attention_heads=4,
                                                 attention_head_dim=32, cross_attention_dim=128, num_layers=2,
                                                 caption_channels=32)
    randomize_norm_weights(model)
    return model.to(device, dtype).eval()


def ltx_inputs(dtype, device, B=2, F=3, H=4, W=6, T=7):
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(B, T)
    mask[1, -2:] = 0
    return dict(hidden_states=torch.randn(B, F * H * W, 8, generator=g).to(device, dtype),
                encoder_hidden_states=torch.randn(B, T, 32, generator=g).to(device, dtype),
                timestep=torch.tensor([300, 700], device=device), encoder_attention_mask=mask.to(device, dtype),
                num_frames=F, height=H, width=W, rope_interpolation_scale=(8 / 25, 32, 32), return_dict=False)


def small_flux(dtype, device):
    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                             attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                             pooled_projection_dim=16, axes_dims_rope=(4, 6, 6))
    randomize_norm_weights(model)
    return model.to(device, dtype).eval()


def flux_inputs(dtype, device, B=2, S_img=24, S_txt=7):
    g = torch.Generator().manual_seed(2)
    return dict(hidden_states=torch.randn(B, S_img, 16, generator=g).to(device, dtype),
                encoder_hidden_states=torch.randn(B, S_txt, 32, generator=g).to(device, dtype),
                pooled_projections=torch.randn(B, 16, generator=g).to(device, dtype),
                timestep=torch.tensor([0.3, 0.7], device=device, dtype=dtype),
                img_ids=torch.randint(0, 8, (S_img, 3), generator=g).float().to(device),
                txt_ids=torch.zeros(S_txt, 3, device=device), return_dict=False)


def small_sd3(dtype, device):
    torch.manual_seed(0)
    model = diffusers.SD3Transformer2DModel(sample_size=16, patch_size=2, in_channels=4, num_layers=2,
                                            attention_head_dim=16, num_attention_heads=4, joint_attention_dim=32,
                                            caption_projection_dim=64, pooled_projection_dim=24, out_channels=4,
                                            qk_norm="rms_norm", dual_attention_layers=(0,))
    randomize_norm_weights(model)
    return model.to(device, dtype).eval()


def sd3_inputs(dtype, device, B=2):
    g = torch.Generator().manual_seed(4)
    return dict(hidden_states=torch.randn(B, 4, 16, 16, generator=g).to(device, dtype),
                encoder_hidden_states=torch.randn(B, 7, 32, generator=g).to(device, dtype),
                pooled_projections=torch.randn(B, 24, generator=g).to(device, dtype),
                timestep=torch.tensor([100, 500], device=device), return_dict=False)


DIT = {"ltx": (small_ltx, ltx_inputs), "flux": (small_flux, flux_inputs), "sd3": (small_sd3, sd3_inputs)}
def LLM_IDS(device):  # noqa: N802
    return torch.randint(0, 101, (2, 13), generator=torch.Generator().manual_seed(3)).to(device)


def model_output(name, dtype, device, tk=None, monkeypatch=None, merged=True, noise=False):
    """The model's output (logits for the LLMs), eager or with `tk` injected (with inject's merged
    projections and linear_gelu, its defaults, or without); `noise`: the eager model with one ulp
    added to a tenth of its weights (helpers.perturbed)."""
    if name in DIT:
        make, inputs = DIT[name]
        model = make(dtype, device)
        if noise:
            model = perturbed(model)
        if tk is not None:
            if device == "cpu":  # the CPU stand-ins take CPU tensors (else diffusers' own code runs)
                monkeypatch.setattr(diffusers_models, "KERNEL_DEVICES", ("cuda", "cpu"))
            report = diffusers_models.inject(model, tk, merge_projections=merged, linear_gelu=merged)
            assert report.replaced, report
        with torch.no_grad():
            return model(**inputs(dtype, device))[0]
    model = small_llm(name, dtype, device)
    if noise:
        model = perturbed(model)
    if tk is not None:
        if device == "cpu":  # the fused attention forward is taken for CUDA tensors only
            monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
        report = transformers_models.inject(model, tk, merge_projections=merged)
        assert report.replaced, report
    with torch.no_grad():
        return model(LLM_IDS(device)).logits


MODELS = ["llama", "qwen3", "ltx", "flux", "sd3"]


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "unmerged"])
@pytest.mark.parametrize("name", MODELS)
def test_wiring_in_bf16_with_the_real_layers_on_cpu(name, merged, monkeypatch):
    """bf16 on the CPU, the package's Python code over eager ops: the eager model's output exactly."""
    expected = model_output(name, torch.bfloat16, "cpu")
    ours = model_output(name, torch.bfloat16, "cpu", eager_kernel(), monkeypatch, merged)
    assert ours.dtype == expected.dtype
    differ = (ours != expected).sum().item()
    assert differ == 0, f"{name}: {differ} of {ours.numel()} elements differ from the eager model in bf16"


def test_the_real_layers_pick_each_rounding_on_cpu():
    """The Hub RMSNorm layer gives each host module's own bf16 output (the three roundings differ
    here: the test would fail if a layer used another module's)."""
    tk = eager_kernel()
    torch.manual_seed(5)
    x = (torch.randn(4, 64) * 3).to(torch.bfloat16)
    hosts = {
        "transformers": transformers.models.llama.modeling_llama.LlamaRMSNorm(64, eps=1e-5),
        "diffusers": diffusers.models.normalization.RMSNorm(64, eps=1e-5, elementwise_affine=True),
        "torch": torch.nn.RMSNorm(64, eps=1e-5),
        "torch_eps_none": torch.nn.RMSNorm(64),
    }
    outs = {}
    for name, host in hosts.items():
        host = host.to(torch.bfloat16)
        with torch.no_grad():
            host.weight.uniform_(0.5, 1.5)
        expected = host(x)
        host.forward = tk.layers.RMSNorm.forward.__get__(host)
        outs[name] = host(x)
        assert torch.equal(outs[name], expected), name
    # the three roundings of the same weight and input are distinguishable in bf16
    w = hosts["torch"].weight
    by_rounding = {r: ref_norms.RMS_NORM_EAGER[r](x, w, 1e-5) for r in ("hf", "diffusers", "torch")}
    assert not torch.equal(by_rounding["hf"], by_rounding["torch"])


# ---- reference copies against the installed libraries (CPU, bit for bit) ----

DTYPES_CPU = [torch.float32, torch.bfloat16]


def weights(n, dtype):
    return (torch.rand(n) + 0.5).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES_CPU, ids=str)
def test_reference_rms_norms_match_the_libraries(dtype):
    torch.manual_seed(1)
    x = (torch.randn(3, 5, 96) * 2 + 0.5).to(dtype)
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.mistral.modeling_mistral import MistralRMSNorm
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    for cls in (LlamaRMSNorm, MistralRMSNorm, Qwen3RMSNorm):
        for wdt in {dtype, torch.float32}:
            m = cls(96, eps=1e-6)
            m.weight.data = weights(96, wdt)
            assert torch.equal(ref_norms.hf_rms_norm(x, m.weight, 1e-6), m(x)), (cls.__name__, wdt)
    for affine in (True, False):
        for wdt in {dtype, torch.float32}:
            m = diffusers.models.normalization.RMSNorm(96, eps=1e-5, elementwise_affine=affine)
            if affine:
                m.weight.data = weights(96, wdt)
            assert torch.equal(ref_norms.diffusers_rms_norm(x, m.weight, 1e-5), m(x)), (affine, wdt)
    m = torch.nn.RMSNorm(96, eps=1e-5).to(dtype)
    m.weight.data = weights(96, dtype)
    assert torch.equal(ref_norms.torch_rms_norm(x, m.weight, 1e-5), m(x))
    ln = torch.nn.LayerNorm(96, eps=1e-5).to(dtype)
    ln.weight.data, ln.bias.data = weights(96, dtype), weights(96, dtype) - 1
    assert torch.equal(ref_norms.torch_layer_norm(x, ln.weight, ln.bias, 1e-5), ln(x))


@pytest.mark.parametrize("dtype", DTYPES_CPU, ids=str)
def test_reference_activations_match_the_libraries(dtype):
    torch.manual_seed(2)
    x = (torch.randn(4, 64) * 3).to(dtype)
    from transformers.activations import ACT2FN

    for act, hf_name in (("silu", "silu"), ("gelu", "gelu"), ("gelu_tanh", "gelu_pytorch_tanh")):
        assert torch.equal(ref_act.eager_activation(x, act), ACT2FN[hf_name](x)), act
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=48)
    mlp = transformers.models.llama.modeling_llama.LlamaMLP(config).to(dtype)
    h = (torch.randn(3, 32)).to(dtype)
    with torch.no_grad():
        assert torch.equal(mlp.down_proj(ref_act.eager_act_mul(mlp.gate_proj(h), mlp.up_proj(h), "silu")), mlp(h))
    geglu = diffusers.models.activations.GEGLU(32, 24).to(dtype)  # exact GELU on the second half
    with torch.no_grad():
        assert torch.equal(ref_act.eager_act_and_mul(geglu.proj(h), "gelu", act_first=False), geglu(h))
    for approximate, act in (("none", "gelu"), ("tanh", "gelu_tanh")):
        gelu = diffusers.models.activations.GELU(32, 24, approximate=approximate).to(dtype)
        with torch.no_grad():
            assert torch.equal(ref_act.eager_activation(gelu.proj(h), act), gelu(h)), approximate


def neox_tables(B, S, d, dtype):
    a = torch.rand(B, S, d // 2) * 100
    a = torch.cat((a, a), -1)
    return a.cos().to(dtype), a.sin().to(dtype)


@pytest.mark.parametrize("dtype", DTYPES_CPU, ids=str)
def test_reference_rotary_functions_match_the_libraries(dtype):
    torch.manual_seed(3)
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen3 import modeling_qwen3

    q, k = (torch.randn(2, 4, 7, 32) * 2).to(dtype), (torch.randn(2, 2, 7, 32) * 2).to(dtype)  # [B, H, S, d]
    cos, sin = neox_tables(2, 7, 32, dtype)
    assert torch.equal(ref_rope.rotate_half(q), modeling_llama.rotate_half(q))
    for ours, theirs in zip(ref_rope.hf_apply_rotary_pos_emb(q, k, cos, sin),
                            modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)):
        assert torch.equal(ours, theirs)
    # Qwen3's attention: q_norm / k_norm per head on [B, S, H, d], transpose, rotate
    qs, ks = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
    norm = modeling_qwen3.Qwen3RMSNorm(32, eps=1e-6).to(dtype)
    norm.weight.data = weights(32, dtype)
    theirs = modeling_qwen3.apply_rotary_pos_emb(norm(qs).transpose(1, 2), norm(ks).transpose(1, 2), cos, sin)
    ours = ref_rope.hf_qk_norm_rope(qs, ks, norm.weight, norm.weight, 1e-6, cos, sin)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b.transpose(1, 2))


@pytest.mark.parametrize("dtype", DTYPES_CPU, ids=str)
def test_reference_diffusers_rotary_matches_the_libraries(dtype):
    torch.manual_seed(4)
    from diffusers.models.embeddings import apply_rotary_emb as flux_apply_rotary_emb
    from diffusers.models.transformers import transformer_ltx

    # LTX-Video: x [B, S, C], fp32 tables [B, S, C]
    x = (torch.randn(2, 9, 96) * 2).to(dtype)
    a = (torch.rand(2, 9, 48) * 100).repeat_interleave(2, -1)
    cos, sin = a.cos(), a.sin()
    theirs = transformer_ltx.apply_rotary_emb(x, (cos, sin))
    assert torch.equal(ref_rope.diffusers_interleaved_rotary(x, cos, sin), theirs)
    # LTX's q/k norm (torch.nn.RMSNorm over all heads) then the rotation
    norm = torch.nn.RMSNorm(96, eps=1e-6).to(dtype)
    norm.weight.data = weights(96, dtype)
    ours = ref_rope.diffusers_qk_norm_rope(x, x, norm.weight, norm.weight, 1e-6, cos, sin)[0]
    assert torch.equal(ours, transformer_ltx.apply_rotary_emb(norm(x), (cos, sin)))
    # Flux: x [B, H, S, d] with [S, d] tables (use_real_unbind_dim=-1), as its attention processor calls it
    xh = (torch.randn(2, 3, 9, 16) * 2).to(dtype)
    a2 = (torch.rand(9, 8) * 100).repeat_interleave(2, -1)
    c2, s2 = a2.cos(), a2.sin()
    theirs = flux_apply_rotary_emb(xh, (c2, s2), use_real=True, use_real_unbind_dim=-1)
    assert torch.equal(ref_rope.diffusers_interleaved_rotary(xh, c2[None, None], s2[None, None]), theirs)


def test_reference_ltx_tables_match_the_rotary_module():
    """reference.rope's tables from (grid, freqs) are LTXVideoRotaryPosEmbed's own, bit for bit."""
    from diffusers.models.transformers.transformer_ltx import LTXVideoRotaryPosEmbed

    from transformer_kernels_integrations.diffusers_models import ltx_rope_coords

    for C in (96, 100, 98, 8):
        rope = LTXVideoRotaryPosEmbed(C, base_num_frames=20, base_height=2048, base_width=2048, patch_size=1,
                                      patch_size_t=1, theta=10000.0)
        hidden = torch.empty(2, 3 * 5 * 7, C)
        kwargs = dict(num_frames=3, height=5, width=7, rope_interpolation_scale=(8 / 25, 32, 32))
        cos, sin = rope(hidden, **kwargs)
        grid, freqs = ltx_rope_coords(rope, hidden, **kwargs)
        ref_cos, ref_sin = ref_rope.ltx_tables_from_coords(grid, freqs, C)
        assert torch.equal(ref_cos, cos) and torch.equal(ref_sin, sin), C


# ---- GPU: per-element bounds in ulps against eager, greedy generation ----

def ulps_vs_eager(ours, eager):
    """|ours - eager| in bf16 ulps of max(|eager|, the RMS of eager's row)."""
    e = eager.float()
    scale = torch.maximum(e.abs(), e.pow(2).mean(-1, keepdim=True).sqrt())
    ulp = torch.exp2(torch.floor(torch.log2(scale.clamp_min(2.0**-126))) - 7)  # bf16: 8 significant bits
    return (ours.float() - e).abs() / ulp


def assert_within_ulps(ours, eager, noise, what):
    """ours within ulps of eager, element by element: at most SHARE_BEYOND beyond ULPS, and none
    beyond NOISE_FACTOR x the noise floor's farthest element (at least ULPS, at most CAP_ULPS)."""
    assert ours.shape == eager.shape and ours.dtype == eager.dtype, what
    assert not ours.isnan().any() or torch.equal(ours.isnan(), eager.isnan()), f"{what}: NaN where eager has none"
    u, floor = ulps_vs_eager(ours, eager), ulps_vs_eager(noise, eager).max().item()
    cap = min(CAP_ULPS, max(NOISE_FACTOR * floor, ULPS))
    beyond = (u > ULPS).double().mean().item()
    stats = (f"{what}: max {u.max().item():.1f} ulps (cap {cap:.1f}: the noise floor's max {floor:.1f}), "
             f"{beyond:.3%} of {u.numel()} elements beyond {ULPS} (median {u.median().item():.2f}, "
             f"99th percentile {u.flatten().float().quantile(0.99).item():.1f})")
    print(stats)
    assert beyond <= SHARE_BEYOND and u.max().item() <= cap, stats


@pytest.mark.gpu
@pytest.mark.parametrize("merged", [True, False], ids=["merged", "unmerged"])
@pytest.mark.parametrize("name", MODELS)
def test_injected_model_within_ulps_of_eager(tk, name, merged):
    expected = model_output(name, torch.bfloat16, "cuda")
    noise = model_output(name, torch.bfloat16, "cuda", noise=True)
    ours = model_output(name, torch.bfloat16, "cuda", tk, merged=merged)
    assert_within_ulps(ours, expected, noise, f"{name} ({'merged' if merged else 'unmerged'})")


@pytest.mark.parametrize("name", MODELS)
def test_ulps_bound_catches_a_planted_error_on_cpu(name, monkeypatch):
    """The bound above, on the CPU in bf16: the eager stand-ins (bit-equal to eager) pass, and the
    same stand-ins with every norm's output a quarter too large (PlantedNormScale: the size of a
    dropped or misapplied norm weight, which lies in [0.5, 1.5)) fail."""
    expected = model_output(name, torch.bfloat16, "cpu")
    noise = model_output(name, torch.bfloat16, "cpu", noise=True)
    assert_within_ulps(model_output(name, torch.bfloat16, "cpu", eager_kernel(), monkeypatch), expected, noise, name)
    planted = model_output(name, torch.bfloat16, "cpu", PlantedNormScale(eager_kernel()), monkeypatch)
    with pytest.raises(AssertionError, match="max .* ulps"):
        assert_within_ulps(planted, expected, noise, f"{name} (planted)")


class PlantedNormScale:
    """A kernel module whose norms (functions and Hub layers) return their output a quarter too large."""

    NORMS = ("rms_norm", "layer_norm", "norm_modulate", "fused_add_rms_norm", "gated_add_norm_modulate",
             "qk_norm_rope", "hf_qk_norm_rope", "ltx_qk_norm_rope", "ltx_qk_norm_rope_from_coords")

    def __init__(self, tk):
        self._tk = tk
        self.layers = types.SimpleNamespace(**{
            name: types.SimpleNamespace(forward=self._scaled(getattr(tk.layers, name).forward))
            for name in ("RMSNorm", "LayerNorm")})

    @staticmethod
    def _scaled(fn):
        def call(*args, **kwargs):
            out = fn(*args, **kwargs)
            if isinstance(out, tuple):  # (normalized, and what it passes on unscaled: h, k)
                return (out[0] * 1.25, *out[1:])
            return out * 1.25
        return call

    def __getattr__(self, name):
        attr = getattr(self._tk, name)
        return self._scaled(attr) if name in self.NORMS else attr


def first_divergence(a, b):
    """(row, position) of the first token where two generations differ, or None."""
    for row in range(a.shape[0]):
        diff = (a[row] != b[row]).nonzero()
        if len(diff):
            return row, diff[0].item()
    return None


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_greedy_generation_matches_eager(tk, name):
    """GENERATE_TOKENS greedy tokens (KV cache: a prefill, then one decode step a token) equal
    eager's; where they differ, the first different token must be a near tie of eager's own logits
    on the common prefix (its margin below our logits' deviation from eager's there)."""
    eager_model = small_llm(name, torch.bfloat16, "cuda")
    ours_model = copy.deepcopy(eager_model)
    prompt = torch.randint(0, 101, (2, 5), generator=torch.Generator().manual_seed(7)).cuda()
    with torch.no_grad():
        expected = eager_model.generate(prompt, max_new_tokens=GENERATE_TOKENS, min_new_tokens=GENERATE_TOKENS,
                                        do_sample=False)
        # eager's logits on every prefix, computed before inject() swaps the rotary function module-wide
        eager_logits = eager_model(expected).logits
    report = transformers_models.inject(ours_model, tk)
    assert report.replaced, report
    with torch.no_grad():
        generated = ours_model.generate(prompt, max_new_tokens=GENERATE_TOKENS, min_new_tokens=GENERATE_TOKENS,
                                        do_sample=False)
        ours_logits = ours_model(expected).logits  # on eager's tokens: every prefix of its generation
    assert_generation_like_eager(generated, expected, ours_logits, eager_logits, name)


def assert_generation_like_eager(generated, expected, ours_logits, eager_logits, what, prompt=5):
    """Our logits on every prefix of eager's generation are within LOGIT_TOLERANCE of the row's
    largest |logit| of eager's; our greedy tokens equal eager's, or first differ where eager's top
    two logits are closer than twice our logits' deviation there (a near tie)."""
    assert generated.shape == expected.shape, what
    ours, theirs = ours_logits.float(), eager_logits.float()
    deviation = (ours - theirs).abs().amax(-1) / theirs.abs().amax(-1).clamp_min(1e-6)  # [B, S]
    worst = deviation.max().item()
    assert worst <= LOGIT_TOLERANCE, (f"{what}: our logits deviate from eager's by up to {worst:.3g} of the row's "
                                      f"largest |logit| (tolerance {LOGIT_TOLERANCE:.3g})")
    where = first_divergence(generated, expected)
    if where is None:
        return
    row, pos = where
    logits = theirs[row, pos - 1]  # eager's logits after the common prefix
    margin = (logits.max() - logits[generated[row, pos]]).item()
    near = 2 * (ours[row, pos - 1] - logits).abs().max().item()
    assert margin <= near, (
        f"{what}: token {pos - prompt} of row {row} differs ({generated[row, pos].item()} vs eager's "
        f"{expected[row, pos].item()}) and is no near tie: eager's margin {margin:.4g} against twice our "
        f"logits' deviation {near:.4g}")
    print(f"{what}: generations agree for {pos - prompt} tokens, then a near tie (margin {margin:.4g})")


def test_generation_check_catches_planted_logits():
    """The check above on planted data: logits within tolerance pass; garbage logits fail even where
    the tokens agree; a divergence at a clear margin fails."""
    g = torch.Generator().manual_seed(0)
    theirs = torch.randn(2, 12, 101, generator=g) * 4
    tokens = torch.randint(0, 101, (2, 12), generator=g)
    ours = theirs + torch.randn(theirs.shape, generator=g) * 1e-3
    assert_generation_like_eager(tokens, tokens, ours, theirs, "close")
    with pytest.raises(AssertionError, match="deviate"):
        assert_generation_like_eager(tokens, tokens, torch.randn(theirs.shape, generator=g), theirs, "garbage")
    with pytest.raises(AssertionError, match="deviate"):
        assert_generation_like_eager(tokens, tokens, torch.zeros_like(theirs), theirs, "zeroed")
    other = tokens.clone()
    other[1, 7] = (theirs[1, 6].argmin())  # eager's least likely token: no near tie
    with pytest.raises(AssertionError, match="no near tie"):
        assert_generation_like_eager(other, tokens, ours, theirs, "clear divergence")

