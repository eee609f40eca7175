"""diffusers integration: inject() on LTX-Video, Flux and SD3.5 transformers built from small configs.

On CPU the injected model runs against a stand-in kernel made of the eager reference code, which
checks the wiring (which tensor goes to which op, with which eps and rounding) exactly; on the GPU
the real kernels run and the output must match the eager model within bf16 rounding. Every wiring
test counts the kernel calls of each replaced kind; uninject() gives back the original model bit for
bit."""

import logging
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from helpers import EAGER_LAYERS, randomize_norm_weights
from integration_helpers import CountingKernels, assert_every_kind_ran, assert_restored, snapshot
from reference.activations import eager_activation, eager_gated_add
from reference.norms import diffusers_norm_modulate, ltx_gated_add_norm_modulate
from reference.rope import diffusers_interleaved_rotary, diffusers_qk_norm_rope, ltx_tables_from_coords

diffusers = pytest.importorskip("diffusers")
from transformer_kernels_integrations import inject as inject_any  # noqa: E402
from transformer_kernels_integrations import injected  # noqa: E402
from transformer_kernels_integrations.diffusers_models import SWITCHES, LTXAttnProcessor, inject, uninject  # noqa: E402

# CPU tests inject eager stand-ins that take CPU tensors (conftest.stand_ins_take_cpu_tensors)
pytestmark = pytest.mark.usefixtures("stand_ins_take_cpu_tensors")

# The kernel API, implemented with the eager code each op replaces.
EAGER_TK = SimpleNamespace(
    layers=EAGER_LAYERS,
    norm_modulate=lambda x, scale, shift=None, weight=None, bias=None, eps=1e-6, norm="rms":
        diffusers_norm_modulate(x, scale, shift, norm, weight, bias, eps),
    gated_add_norm_modulate=lambda x, y, gate, scale, shift=None, weight=None, bias=None, eps=1e-6, norm="rms":
        ltx_gated_add_norm_modulate(x, y, gate, scale, shift, norm, weight, bias, eps),
    gated_add=lambda x, y, gate: eager_gated_add(x, y, gate),
    gelu=lambda x, approximate="none": eager_activation(x, "gelu" if approximate == "none" else "gelu_tanh"),
    linear_gelu=lambda x, weight, bias=None: eager_activation(F.linear(x, weight, bias), "gelu_tanh"),
    ltx_rope=lambda q, k, cos, sin: (diffusers_interleaved_rotary(q, cos, sin),
                                     diffusers_interleaved_rotary(k, cos, sin)),
    ltx_qk_norm_rope=diffusers_qk_norm_rope,
    ltx_rope_from_coords=lambda q, k, grid, freqs: EAGER_TK.ltx_rope(
        q, k, *ltx_tables_from_coords(grid, freqs, q.shape[-1])),
    ltx_qk_norm_rope_from_coords=lambda q, k, q_weight, k_weight, eps, grid, freqs: diffusers_qk_norm_rope(
        q, k, q_weight, k_weight, eps, *ltx_tables_from_coords(grid, freqs, q.shape[-1])),
    flux_rope=lambda q, k, cos, sin: (diffusers_interleaved_rotary(q, cos[None, :, None], sin[None, :, None]),
                                      diffusers_interleaved_rotary(k, cos[None, :, None], sin[None, :, None])),
)


def small_ltx(dtype=torch.float32, device="cpu"):
    torch.manual_seed(0)
    model = diffusers.LTXVideoTransformer3DModel(in_channels=8, out_channels=8, num_attention_heads=4,
                                                 attention_head_dim=32, cross_attention_dim=128, num_layers=2,
                                                 caption_channels=32)
    randomize_norm_weights(model)
    return model.to(device, dtype).eval()


def ltx_inputs(dtype=torch.float32, device="cpu", B=2, F=3, H=4, W=6, T=7):
    g = torch.Generator().manual_seed(1)
    mask = torch.ones(B, T)
    mask[1, -2:] = 0
    return dict(hidden_states=torch.randn(B, F * H * W, 8, generator=g).to(device, dtype),
                encoder_hidden_states=torch.randn(B, T, 32, generator=g).to(device, dtype),
                timestep=torch.tensor([300, 700], device=device), encoder_attention_mask=mask.to(device, dtype),
                num_frames=F, height=H, width=W, rope_interpolation_scale=(8 / 25, 32, 32), return_dict=False)


# the FFNs' GELU(tanh) with its projection: one GEMM with the epilogue (linear_gelu); the caption
# projection's nn.GELU (gelu); per block the self-attention's q/k/v and the cross-attention's k/v merged
LTX_REPLACED = {"ltx_rope_coords": 1, "ltx_merged_projections": 2, "ltx_block": 2, "ltx_attention": 4,
                "linear_gelu": 2, "gelu": 1, "layer_norm": 1}
_MERGED, _FFN = {"ltx_merged_projections": 2}, {"linear_gelu": 2, "gelu": 1}

# What each switch turned off alone leaves in the small LTX transformer
LTX_REPLACED_WITHOUT = {
    "rms_norm": {"ltx_rope_coords": 1, **_MERGED, "ltx_attention_rope": 4, **_FFN, "layer_norm": 1},
    "layer_norm": {"ltx_rope_coords": 1, **_MERGED, "ltx_block": 2, "ltx_attention": 4, **_FFN},
    "rope": {"ltx_block": 2, "rms_norm": 8, **_FFN, "layer_norm": 1},
    "qk_norm_rope": {"ltx_rope_coords": 1, **_MERGED, "ltx_block": 2, "ltx_attention_unfused": 4, **_FFN,
                     "layer_norm": 1},
    "gelu": {"ltx_rope_coords": 1, **_MERGED, "ltx_block": 2, "ltx_attention": 4, "layer_norm": 1},
    "norm_modulate": {"ltx_rope_coords": 1, **_MERGED, "ltx_attention": 4, "rms_norm": 4, **_FFN, "layer_norm": 1},
    "merge_projections": {"ltx_rope_coords": 1, "ltx_block": 2, "ltx_attention": 4, **_FFN, "layer_norm": 1},
    "linear_gelu": {"ltx_rope_coords": 1, **_MERGED, "ltx_block": 2, "ltx_attention": 4, "gelu": 3, "layer_norm": 1},
    # Stable Diffusion's switches: LTX-Video has no GroupNorm or GEGLU (tests/integration/test_integration_sd.py)
    "group_norm": LTX_REPLACED,
    "geglu": LTX_REPLACED,
}


def test_switches():
    assert SWITCHES == ("geglu", "gelu", "group_norm", "layer_norm", "linear_gelu", "merge_projections",
                        "norm_modulate", "qk_norm_rope", "rms_norm", "rope")
    with pytest.raises(TypeError, match="unknown switch"):
        inject(small_ltx(), EAGER_TK, swiglu=False)  # a transformers switch: not this table's


@pytest.mark.parametrize("off", SWITCHES)
def test_each_switch_off_report(off):
    report = inject(small_ltx(), EAGER_TK, **{off: False})
    assert report.replaced == LTX_REPLACED_WITHOUT[off], report
    # the unfused attention rule takes what the fused one leaves, the unmerged rules what the merged
    # ones leave, the gelu rule what linear_gelu leaves; no rule of the SD switches matches LTX-Video
    if off not in ("qk_norm_rope", "merge_projections", "linear_gelu", "group_norm", "geglu"):
        assert any(f"{off}=False" in why for why in report.skipped.values()), report
    assert f"switched off: {off}" in str(report)


def test_report_and_patched_modules(tk):
    model = small_ltx()
    report = inject(model, tk)
    assert report.replaced == LTX_REPLACED, report
    # run-time fallbacks: every patched forward and processor off the GPU; besides, where gradients are
    # wanted (merges) or the dtype/autocast differs (linear_gelu)
    assert set(report.fallbacks) == set(report.replaced), report
    off_gpu = "tensors off the GPU: diffusers' own code"
    assert all(why.endswith(off_gpu) for kind, why in report.fallbacks.items() if not kind.endswith("merged_projections"))
    assert {kind for kind, why in report.fallbacks.items() if why != off_gpu} == {"ltx_merged_projections", "linear_gelu"}
    assert all(isinstance(m.processor, LTXAttnProcessor) for m in model.modules() if hasattr(m, "processor"))
    block = model.transformer_blocks[0]
    assert block.forward.__func__.__qualname__.startswith("_ltx_block_forward")
    assert not hasattr(block.norm1, "_old_forward") and "forward" not in vars(block.norm1)  # fused by the block
    assert "ltx_block" in str(report)


def assert_wiring_exact(model, inputs, **switches):
    """The model injected with the eager stand-ins (EAGER_TK) gives exactly its original output: the
    patched forwards call the right ops with the right arguments, and every replaced kind's ops
    ran (under no_grad, where the merged projections run; with gradients wanted the merges fall
    back to the separate projections, same output). uninject() then gives back the original model,
    attribute for attribute and bit for bit (no storage shared that was not before), with its
    original output. Returns the report and the calls of the no_grad forward."""
    expected = model(**inputs)[0]
    before = snapshot(model)
    kernels = CountingKernels(EAGER_TK)
    report = inject(model, kernels, **switches)
    with torch.no_grad(), kernels.counting(model):
        torch.testing.assert_close(model(**inputs)[0], expected, rtol=0, atol=0)
    assert_every_kind_ran(report, kernels)
    assert not report.fallbacks_taken, report
    calls = dict(kernels.calls)
    torch.testing.assert_close(model(**inputs)[0], expected, rtol=0, atol=0)  # gradients wanted
    assert set(report.fallbacks_taken) == {kind for kind in report.replaced if kind.endswith("merged_projections")}
    uninject(model)
    assert_restored(model, before)
    torch.testing.assert_close(model(**inputs)[0], expected, rtol=0, atol=0)
    return report, SimpleNamespace(calls=calls)


SWITCH_SETS = [{}, {s: False for s in SWITCHES}] + [{s: False} for s in SWITCHES]


@pytest.mark.parametrize("switches", SWITCH_SETS, ids=lambda s: "all_on" if not s else
                         "all_off" if len(s) > 1 else f"no_{next(iter(s))}")
def test_wiring_matches_eager_model_exactly_and_uninject_restores_it_on_cpu(switches):
    """Same math op for op: the injected model with eager stand-ins equals the original, with every
    switch on, off, and each one off alone."""
    report, _ = assert_wiring_exact(small_ltx(), ltx_inputs(), **switches)
    assert report.replaced == (LTX_REPLACED if not switches else {} if len(switches) > 1
                               else LTX_REPLACED_WITHOUT[next(iter(switches))])


def test_calls_per_forward_are_one_per_patched_module():
    _, kernels = assert_wiring_exact(small_ltx(), ltx_inputs())
    # 2 blocks: their modulations and residuals, one merged q/k/v GEMM and one fused self-attention
    # each, one merged cross-attention k/v GEMM and two cross-attention norms each, the FFN GEMMs with
    # the GELU epilogue, the caption projection's GELU, the output LayerNorm
    assert kernels.calls == {"norm_modulate": 2, "gated_add": 4, "gated_add_norm_modulate": 2, "merged.qkv": 2,
                             "ltx_qk_norm_rope_from_coords": 2, "merged.kv": 2, "layers.RMSNorm": 4,
                             "linear_gelu": 2, "gelu": 1, "layers.LayerNorm": 1}
    _, kernels = assert_wiring_exact(small_ltx(), ltx_inputs(), merge_projections=False, linear_gelu=False)
    assert kernels.calls == {"norm_modulate": 2, "gated_add": 4, "gated_add_norm_modulate": 2,
                             "ltx_qk_norm_rope_from_coords": 2, "layers.RMSNorm": 4, "gelu": 3,
                             "layers.LayerNorm": 1}


def test_top_level_inject_and_context_manager_on_ltx():
    model = small_ltx()
    before = snapshot(model)
    with injected(model, EAGER_TK, rope=False) as report:
        assert report.replaced == LTX_REPLACED_WITHOUT["rope"]
        assert "forward" in vars(model.transformer_blocks[0])
    assert_restored(model, before)
    assert inject_any(model, EAGER_TK, swiglu=False).replaced == LTX_REPLACED  # the union of the tables' switches


def test_rope_gives_coordinates_only_where_every_attention_takes_them():
    """The rope module returns LTXRopeCoords once injected, and the processor sends them to the
    coordinate ops; a model with an attention left to diffusers' processor keeps the tables (the
    rope is left alone, with the reason), and so does a context-parallel model."""
    from transformer_kernels_integrations.diffusers_models import LTXRopeCoords

    calls = []
    stand_in = SimpleNamespace(**vars(EAGER_TK))
    stand_in.ltx_qk_norm_rope_from_coords = lambda *a: (calls.append("coords"), EAGER_TK.ltx_qk_norm_rope_from_coords(*a))[1]
    stand_in.ltx_qk_norm_rope = lambda *a: (calls.append("tables"), EAGER_TK.ltx_qk_norm_rope(*a))[1]
    model = small_ltx()
    inject(model, stand_in)
    rope_out = model.rope(torch.zeros(2, 72, 128), 3, 4, 6, (8 / 25, 32, 32))
    assert isinstance(rope_out, LTXRopeCoords) and rope_out.grid.shape == (2, 72, 3)
    model(**ltx_inputs())
    assert calls == ["coords"] * 2  # one self-attention per block

    for spoil in ("norm_q", "parallel"):
        model = small_ltx()
        if spoil == "norm_q":
            model.transformer_blocks[1].attn2.norm_q = torch.nn.LayerNorm(128)
        else:
            model._parallel_config = object()
        report = inject(model, stand_in)
        assert "ltx_rope_coords" not in report.replaced
        assert ("not torch.nn.RMSNorm" if spoil == "norm_q" else "context parallelism") in report.left["LTXVideoTransformer3DModel"]
        assert "forward" not in vars(model.rope) and isinstance(model.rope(torch.zeros(2, 72, 128), 3, 4, 6), tuple)


def test_pipeline_components_and_accelerate_hooks(tk):
    model = small_ltx()
    hook_forward = model.norm_out.forward
    model.norm_out._old_forward = model.norm_out.forward  # accelerate keeps the original here
    pipe = SimpleNamespace(components={"transformer": model, "scheduler": object()})
    report = inject(pipe, tk)
    assert report.replaced["ltx_block"] == 2
    assert model.norm_out._old_forward.__func__.__wrapped__ is tk.layers.LayerNorm.forward  # what the hook calls (device-guarded)
    assert model.norm_out.forward == hook_forward  # the hook itself is untouched
    with pytest.raises(TypeError, match="expected a diffusers pipeline"):
        inject(object(), tk)
    uninject(pipe)
    assert model.norm_out._old_forward == hook_forward and model.norm_out.forward == hook_forward


def assert_injected_matches_eager(model, inputs, tk):
    """The model's output with our kernels injected is the eager output within bf16 rounding, and
    every replaced kind's kernel ran."""
    expected = model(**inputs)[0].float()
    kernels = CountingKernels(tk)
    report = inject(model, kernels, strict=True)
    with torch.no_grad(), kernels.counting(model):  # inference: the merged projections run (strict)
        out = model(**inputs)[0].float()
    assert_every_kind_ran(report, kernels)
    rel = ((out - expected).norm() / expected.norm()).item()
    assert rel < 1e-2, f"relative error {rel:.2e} against the eager model"


@pytest.mark.gpu
def test_injected_model_matches_eager_on_gpu(tk):
    assert_injected_matches_eager(small_ltx(torch.bfloat16, "cuda"), ltx_inputs(torch.bfloat16, "cuda"), tk)


@pytest.mark.gpu
def test_injected_model_compiles_fullgraph(tk):
    model = small_ltx(torch.bfloat16, "cuda")
    inputs = ltx_inputs(torch.bfloat16, "cuda")
    inject(model, tk)
    eager = model(**inputs)[0]
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(**inputs)[0], eager, rtol=2e-2, atol=2e-2)


def small_flux(dtype=torch.float32, device="cpu"):
    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=1, num_single_layers=1,
                                             attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                             pooled_projection_dim=16, axes_dims_rope=(4, 6, 6))
    randomize_norm_weights(model)
    return model.to(device, dtype).eval()


def flux_inputs(dtype=torch.float32, device="cpu", B=2, S_img=24, S_txt=7):
    g = torch.Generator().manual_seed(2)
    return dict(hidden_states=torch.randn(B, S_img, 16, generator=g).to(device, dtype),
                encoder_hidden_states=torch.randn(B, S_txt, 32, generator=g).to(device, dtype),
                pooled_projections=torch.randn(B, 16, generator=g).to(device, dtype),
                timestep=torch.tensor([0.3, 0.7], device=device, dtype=dtype),
                img_ids=torch.randint(0, 8, (S_img, 3), generator=g).float().to(device),
                txt_ids=torch.zeros(S_txt, 3, device=device), return_dict=False)


@pytest.mark.parametrize("name", ["ltx", "flux"])
def test_merged_projections_wiring_exact_on_cpu(monkeypatch, name):
    """Under no_grad the merged q/k/v (and LTX's cross-attention k/v, Flux's added q/k/v) GEMMs run,
    their outputs strided views into the processors' ops (eager stand-ins on CPU): the output is the
    unmerged model's exactly, and the parameters take no more memory than before."""
    from transformer_kernels_integrations import merging

    model, inputs = (small_ltx(), ltx_inputs()) if name == "ltx" else (small_flux(), flux_inputs())
    with torch.no_grad():
        expected = model(**inputs)[0]
    before = sum({p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}.values())
    splits = []
    split = merging.MergedLinear.split
    monkeypatch.setattr(merging.MergedLinear, "split", lambda self, x: (splits.append(self.names), split(self, x))[1])
    inject(model, EAGER_TK)
    after = sum({p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}.values())
    assert after == before, "merging grew the parameters' memory"
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs)[0], expected, rtol=0, atol=0)
    if name == "ltx":  # per block: self-attention q/k/v, cross-attention k/v
        assert splits == [("to_q", "to_k", "to_v"), ("to_k", "to_v")] * 2
    else:  # the joint block: q/k/v and the added q/k/v; the single block: q/k/v
        assert sorted(set(splits)) == [("add_q_proj", "add_k_proj", "add_v_proj"), ("to_q", "to_k", "to_v")]
        assert len(splits) == 3
    model(**inputs)[0].sum().backward()  # gradients wanted: the separate projections, every weight gets one
    assert all(p.grad is not None for n, p in model.named_parameters() if "to_q" in n or "to_k" in n)


def test_unmerged_and_without_linear_gelu_reports():
    report = inject(small_ltx(), EAGER_TK, merge_projections=False, linear_gelu=False)
    assert report.replaced["gelu"] == 3 and "linear_gelu" not in report.replaced
    model = small_ltx()
    inject(model, EAGER_TK, merge_projections=False)
    assert not any(hasattr(m, "_tk_merged") for m in model.modules())


def test_uninject_undoes_the_flux_merges():
    """Flux's joint block merges q/k/v and the added q/k/v: after uninject each projection weight
    has storage of its own again, with its values, and the attention holds no merge."""
    model = small_flux()
    before = snapshot(model)
    report = inject(model, EAGER_TK)
    assert report.replaced["flux_merged_projections"] == 2 and report.replaced["flux_attention"] == 2, report
    joint = model.transformer_blocks[0].attn
    assert set(joint._tk_merged) == {"qkv", "added_qkv"}
    assert joint.add_q_proj.weight.untyped_storage().data_ptr() == joint.add_v_proj.weight.untyped_storage().data_ptr()
    uninject(model)
    assert_restored(model, before)  # includes: no two tensors share a storage that did not before
    assert "_tk_merged" not in vars(joint) and "_apply" not in vars(joint)


def test_a_model_fused_by_diffusers_is_merged_with_its_own_fused_projections():
    """After diffusers' fuse_qkv_projections() the attentions hold to_qkv / to_added_qkv: inject reads
    them as the merge (no third copy of the weights, the children untouched), the output is the fused
    model's exactly, and after uninject unfuse_qkv_projections() works and gives the unfused output."""
    model, inputs = small_flux(), flux_inputs()
    with torch.no_grad():
        unfused = model(**inputs)[0]
    model.fuse_qkv_projections()
    with torch.no_grad():
        expected = model(**inputs)[0]
    joint = model.transformer_blocks[0].attn
    children = {n: getattr(joint, n).weight.data_ptr() for n in ("to_q", "to_k", "to_v", "add_q_proj")}
    before = sum({p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}.values())
    report = inject(model, EAGER_TK)
    assert report.replaced["flux_merged_projections"] == 2, report
    assert joint._tk_merged["qkv"].weight is joint.to_qkv.weight and joint._tk_merged["qkv"].fused
    assert joint._tk_merged["added_qkv"].weight is joint.to_added_qkv.weight
    assert {n: getattr(joint, n).weight.data_ptr() for n in children} == children, "the children were re-merged"
    after = sum({p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}.values())
    assert after == before, "a copy of the fused weights was made"
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs)[0], expected, rtol=0, atol=0)
    uninject(model)
    model.unfuse_qkv_projections()
    assert not hasattr(joint, "to_qkv") and not getattr(joint, "fused_projections", False)
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs)[0], unfused, rtol=0, atol=0)


@pytest.mark.parametrize("strict", [False, True])
def test_linear_gelu_falls_back_under_autocast_logged_once_or_raised(caplog, strict):
    """Under autocast the FFN's GELU(tanh) runs its projection (autocast's dtype), then the gelu
    kernel: a fallback logged once and counted, or raised under strict."""
    from transformer_kernels_integrations import KernelFallbackError

    model = small_ltx()
    report = inject(model, EAGER_TK, strict=strict)
    gelu = model.transformer_blocks[0].ff.net[0]
    x = torch.randn(2, 5, 128, generator=torch.Generator().manual_seed(3))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = EAGER_TK.gelu(gelu.proj(x), approximate="tanh")
        if strict:
            with pytest.raises(KernelFallbackError, match="linear_gelu runs the projection, then the gelu kernel: "
                                                          "autocast is on"):
                gelu(x)
            return
        with caplog.at_level(logging.WARNING, logger="transformer_kernels_integrations"):
            outs = [gelu(x), gelu(x)]
    for out in outs:
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert [r.getMessage() for r in caplog.records if r.name == "transformer_kernels_integrations"] == [
        "transformer-kernels: linear_gelu runs the projection, then the gelu kernel: autocast is on"]
    assert report.fallbacks_taken == {"linear_gelu": 2}


@pytest.mark.parametrize("switches", [{}, {"rope": False}], ids=["all_on", "no_rope"])
def test_flux_report_and_exact_wiring_on_cpu(tk, switches):
    if switches:
        report, _ = assert_wiring_exact(small_flux(), flux_inputs(), **switches)
        assert "flux_attention" not in report.replaced and report.replaced["rms_norm"] == 6  # q/k of both blocks, added q/k
        return
    report = inject(small_flux(), tk)
    assert report.replaced.get("flux_attention") == 2 and report.replaced.get("adaln_zero") == 2
    assert report.replaced.get("adaln_zero_single") == 1, report
    assert_wiring_exact(small_flux(), flux_inputs())


@pytest.mark.gpu
def test_flux_injected_matches_eager_on_gpu(tk):
    assert_injected_matches_eager(small_flux(torch.bfloat16, "cuda"), flux_inputs(torch.bfloat16, "cuda"), tk)


def small_sd3(dtype=torch.float32, device="cpu"):
    """SD3.5-shaped: RMS q/k norms, a dual-attention first block (SD35AdaLayerNormZeroX)."""
    torch.manual_seed(0)
    model = diffusers.SD3Transformer2DModel(sample_size=16, patch_size=2, in_channels=4, num_layers=2,
                                            attention_head_dim=16, num_attention_heads=4, joint_attention_dim=32,
                                            caption_projection_dim=64, pooled_projection_dim=24, out_channels=4,
                                            qk_norm="rms_norm", dual_attention_layers=(0,))
    randomize_norm_weights(model)
    return model.to(device, dtype).eval()


def sd3_inputs(dtype=torch.float32, device="cpu", B=2):
    g = torch.Generator().manual_seed(4)
    return dict(hidden_states=torch.randn(B, 4, 16, 16, generator=g).to(device, dtype),
                encoder_hidden_states=torch.randn(B, 7, 32, generator=g).to(device, dtype),
                pooled_projections=torch.randn(B, 24, generator=g).to(device, dtype),
                timestep=torch.tensor([100, 500], device=device), return_dict=False)


def test_sd3_report_and_exact_wiring_on_cpu(tk):
    report = inject(small_sd3(), tk)
    # AdaLayerNormContinuous: norm_out and the last block's context norm
    assert report.replaced.get("sd35_adaln_zero_x") == 1 and report.replaced.get("adaln_continuous") == 2
    assert report.replaced.get("adaln_zero") == 2 and report.replaced.get("linear_gelu") == 3
    assert_wiring_exact(small_sd3(), sd3_inputs())


@pytest.mark.gpu
def test_sd3_injected_matches_eager_on_gpu(tk):
    assert_injected_matches_eager(small_sd3(torch.bfloat16, "cuda"), sd3_inputs(torch.bfloat16, "cuda"), tk)


TINY_LTX_VAE = dict(latent_channels=8, block_out_channels=(8, 8, 8, 8), decoder_block_out_channels=(8, 8, 8, 8),
                    layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1, 1))


def test_pipeline_benchmark_wiring_and_exact_injection_on_cpu():
    """bench_ltx --pipeline: LTXPipeline around the transformer with a VAE from its config, driven by
    prompt embeddings; injected into every component (with the eager stand-ins) it gives the same video."""
    from benchmarks.bench_ltx import build_pipeline, pipeline_call

    args = SimpleNamespace(batch_size=1, num_frames=9, height=64, width=64, steps=2)

    def video(inject_eager: bool):
        pipe = build_pipeline(small_ltx(), device="cpu", dtype=torch.float32, vae_config=TINY_LTX_VAE)
        if inject_eager:
            models = {name: m for name, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
            before = {name: snapshot(m) for name, m in models.items()}
            kernels = CountingKernels(EAGER_TK)
            report = inject(pipe, kernels)
            assert report.replaced["ltx_block"] == 2 and report.replaced.get("rms_norm", 0) > 0  # VAE norms too
            with kernels.counting(*models.values()):  # the pipeline runs under no_grad: merged projections
                out = pipeline_call(pipe, args, text_tokens=5, text_channels=32)()
            assert_every_kind_ran(report, kernels)
            uninject(pipe)
            for name, m in models.items():
                assert_restored(m, before[name], added_by_the_run=("_diffusers_hook",))  # the pipeline's own hooks
            return out
        return pipeline_call(pipe, args, text_tokens=5, text_channels=32)()

    expected = video(False)
    assert expected.shape == (1, 9, 3, 64, 64) and expected.isfinite().all()
    torch.testing.assert_close(video(True), expected, rtol=0, atol=0)


@pytest.mark.parametrize("order", ["inject_then_offload", "offload_then_inject"])
def test_real_offload_hooks_either_order_on_cpu(order):
    """With accelerate's offload hooks (what enable_model_cpu_offload installs on each component),
    injected before or after, generation goes through our forwards and gives the eager video."""
    accelerate = pytest.importorskip("accelerate")
    from benchmarks.bench_ltx import build_pipeline, pipeline_call

    args = SimpleNamespace(batch_size=1, num_frames=9, height=64, width=64, steps=2)

    def pipeline():
        return build_pipeline(small_ltx(), device="cpu", dtype=torch.float32, vae_config=TINY_LTX_VAE)

    def offload(pipe):
        hook = None
        for name in ("transformer", "vae"):  # the pipeline's model_cpu_offload_seq, minus the absent text encoder
            _, hook = accelerate.cpu_offload_with_hook(getattr(pipe, name), "cpu", prev_module_hook=hook)

    expected = pipeline_call(pipeline(), args, text_tokens=5, text_channels=32)()
    pipe = pipeline()
    calls = {"fused": 0}
    stand_in = SimpleNamespace(**vars(EAGER_TK))
    stand_in.gated_add_norm_modulate = lambda *a, **k: (calls.__setitem__("fused", calls["fused"] + 1),
                                                        EAGER_TK.gated_add_norm_modulate(*a, **k))[1]
    if order == "inject_then_offload":
        inject(pipe, stand_in)
        offload(pipe)
    else:
        offload(pipe)
        assert hasattr(pipe.transformer, "_hf_hook")
        inject(pipe, stand_in)
    video = pipeline_call(pipe, args, text_tokens=5, text_channels=32)()
    assert calls["fused"] > 0  # our block forward ran under the hooks
    assert hasattr(pipe.transformer, "_hf_hook")  # and the hooks are still there
    torch.testing.assert_close(video, expected, rtol=0, atol=0)
    # uninject either way round leaves the hooks in place, calling the original forwards
    uninject(pipe)
    block = pipe.transformer.transformer_blocks[0]
    assert hasattr(pipe.transformer, "_hf_hook") and calls["fused"] > 0
    fused = calls["fused"]
    assert pipeline_call(pipe, args, text_tokens=5, text_channels=32)().isfinite().all()  # new latents: not `expected`
    assert calls["fused"] == fused and getattr(block, "_old_forward", block.forward).__func__ is type(block).forward


def ltx_rope_inputs(source, B=2, F=3, H=4, W=6, device="cpu"):
    """The rope module's forward arguments, as LTX's pipelines pass them: latent sizes with the
    interpolation scale (0.9.0), without it, or pixel coordinates (0.9.5+: video_coords [B, 3, S])."""
    if source == "video_coords":
        g = torch.Generator().manual_seed(2)
        coords = torch.rand(B, 3, F * H * W, generator=g) * torch.tensor([49.0, 512.0, 768.0])[:, None]
        return dict(video_coords=coords.to(device))
    scale = (8 / 25, 32, 32) if source == "scaled_grid" else None
    return dict(num_frames=F, height=H, width=W, rope_interpolation_scale=scale)


@pytest.mark.parametrize("dim", [2048, 4096, 96, 100, 98, 8])
@pytest.mark.parametrize("source", ["scaled_grid", "grid", "video_coords"])
def test_ltx_rope_coords_rebuild_the_module_tables_exactly(dim, source):
    """ltx_rope_coords gives what LTXVideoRotaryPosEmbed builds its tables from, and the kernels'
    arithmetic (angle j = freqs[j // 3] * (grid[j % 3] * 2 - 1), each pair's cos/sin repeated,
    dim % 6 identity channels in front) rebuilds the module's tables bit for bit (here on CPU; the
    GPU tests in test_rope.py compare the kernels with the module's CUDA tables)."""
    from diffusers.models.transformers.transformer_ltx import LTXVideoRotaryPosEmbed

    from transformer_kernels_integrations.diffusers_models import LTXRopeCoords, ltx_rope_coords
    from reference.rope import ltx_angles_by_index, ltx_angles_from_coords, ltx_tables_from_angles

    rope = LTXVideoRotaryPosEmbed(dim, base_num_frames=20, base_height=2048, base_width=2048, patch_size=1,
                                  patch_size_t=1, theta=10000.0)
    kwargs = ltx_rope_inputs(source)
    hidden_states = torch.zeros(2, 72, dim)
    cos, sin = rope(hidden_states, **kwargs)
    coords = ltx_rope_coords(rope, hidden_states, **kwargs)
    assert isinstance(coords, LTXRopeCoords)
    grid, freqs = coords
    assert grid.dtype == freqs.dtype == torch.float32
    assert grid.shape == (2, 72, 3) and freqs.shape == (dim // 6,)
    for angles in (ltx_angles_from_coords(grid, freqs), ltx_angles_by_index(grid, freqs)):
        c, s = ltx_tables_from_angles(angles, dim)
        assert torch.equal(c, cos) and torch.equal(s, sin)
