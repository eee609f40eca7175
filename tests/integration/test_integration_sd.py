"""diffusers integration for Stable Diffusion: inject() on SD 1.5- and SDXL-shaped UNets, their VAE
(AutoencoderKL) and the pipelines, built from small configs with random weights.

On CPU the injected models run against stand-ins made of the eager code (F.group_norm, F.silu, the
time add, GEGLU's chunk and F.gelu), which checks the wiring exactly: same output bit for bit. On the
GPU the real kernels run and the output must match the eager model within bf16 rounding."""

from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from helpers import EAGER_LAYERS, randomize_norm_weights
from reference.activations import eager_act_and_mul
from reference.group_norm import eager_group_norm

diffusers = pytest.importorskip("diffusers")
from transformer_kernels_integrations.diffusers_models import inject, uninject  # noqa: E402

# CPU tests inject eager stand-ins that take CPU tensors (conftest.stand_ins_take_cpu_tensors)
pytestmark = pytest.mark.usefixtures("stand_ins_take_cpu_tensors")


def stand_in(calls: Counter | None = None):
    """The kernel API, implemented with the eager code each op replaces; `calls` counts the ops."""
    calls = Counter() if calls is None else calls

    def counted(name, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return call

    tk = SimpleNamespace()
    tk.layers = SimpleNamespace(**vars(EAGER_LAYERS), GroupNorm=EAGER_LAYERS.LayerNorm)
    tk.group_norm = counted("group_norm", lambda x, num_groups, weight=None, bias=None, eps=1e-5, activation=None:
                            eager_group_norm(x, num_groups, weight, bias, eps, activation))
    tk.add_group_norm = counted(
        "add_group_norm", lambda x, bias_nc, num_groups, weight=None, bias=None, eps=1e-5, activation=None:
        eager_group_norm(x, num_groups, weight, bias, eps, activation, bias_nc=bias_nc))
    tk.geglu = counted("geglu", lambda x, approximate="none": eager_act_and_mul(x, "gelu", act_first=False))
    tk.calls = calls
    return tk


# SD 1.5's and SDXL's block structure at small widths: 8 groups over 24 and 48 channels (D = 3 and 6,
# not powers of two, as SD's 10, 20 and 40), cross-attention, GEGLU feed-forwards.
SD15 = dict(sample_size=16, in_channels=4, out_channels=4, block_out_channels=(24, 48), layers_per_block=1,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            cross_attention_dim=32, attention_head_dim=4, norm_num_groups=8)
SDXL = dict(sample_size=16, in_channels=4, out_channels=4, block_out_channels=(24, 48), layers_per_block=1,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
            transformer_layers_per_block=(1, 2), cross_attention_dim=32, attention_head_dim=(3, 6),
            use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=8,
            projection_class_embeddings_input_dim=8 * 6 + 32, norm_num_groups=8)
VAE = dict(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(24, 48), layers_per_block=1,
           down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2, norm_num_groups=8)
TEXT_TOKENS, TEXT_CHANNELS, POOLED = 7, 32, 32


def small_unet(config, dtype=torch.float32, device="cpu"):
    torch.manual_seed(0)
    model = diffusers.UNet2DConditionModel(**config)
    randomize_norm_weights(model)
    return model.to(device, dtype).eval()


def small_vae(dtype=torch.float32, device="cpu"):
    torch.manual_seed(0)
    model = diffusers.AutoencoderKL(**VAE)
    randomize_norm_weights(model)
    return model.to(device, dtype).eval()


def unet_inputs(config, dtype=torch.float32, device="cpu", B=2):
    g = torch.Generator().manual_seed(3)
    x = dict(sample=torch.randn(B, 4, 16, 16, generator=g).to(device, dtype),
             timestep=torch.tensor([10, 700], device=device),
             encoder_hidden_states=torch.randn(B, TEXT_TOKENS, TEXT_CHANNELS, generator=g).to(device, dtype),
             return_dict=False)
    if config.get("addition_embed_type") == "text_time":
        x["added_cond_kwargs"] = {"text_embeds": torch.randn(B, POOLED, generator=g).to(device, dtype),
                                  "time_ids": torch.tensor([[32, 32, 0, 0, 32, 32]] * B).to(device, dtype)}
    return x


def class_counts(model) -> Counter:
    return Counter(type(m).__name__ for m in model.modules())


def expected_replaced(model) -> dict:
    """What inject must replace in a UNet or VAE, from its modules."""
    n = class_counts(model)
    gn_left = n["GroupNorm"] - 2 * n["ResnetBlock2D"] - sum(
        1 for m in model.modules() if type(m).__name__ in ("UNet2DConditionModel", "Encoder", "Decoder"))
    expected = {"resnet_block": n["ResnetBlock2D"], "group_norm": gn_left,
                "norm_out_silu": n["UNet2DConditionModel"] + n["Encoder"] + n["Decoder"],
                "geglu": n["GEGLU"], "layer_norm": n["LayerNorm"]}
    return {k: v for k, v in expected.items() if v}


@pytest.mark.parametrize("config", [SD15, SDXL], ids=["sd15", "sdxl"])
def test_unet_report(tk, config):
    model = small_unet(config)
    n = class_counts(model)
    report = inject(model, tk)
    assert report.replaced == expected_replaced(model), report
    # every norm of the model is taken: each resnet's two, each Transformer2DModel's input norm, the output norm
    assert n["GroupNorm"] == 2 * n["ResnetBlock2D"] + n["Transformer2DModel"] + 1
    assert report.replaced["group_norm"] == n["Transformer2DModel"]
    assert report.replaced["layer_norm"] == 3 * n["BasicTransformerBlock"]
    block = next(m for m in model.modules() if type(m).__name__ == "ResnetBlock2D")
    assert block.forward.__func__.__qualname__.startswith("_resnet_block_forward")
    assert "forward" not in vars(block.norm1) and "forward" not in vars(block.norm2)  # fused by the block
    assert model.conv_act(torch.ones(1)) == 1  # its SiLU is computed by conv_norm_out
    assert not report.left, report.left


def test_vae_report(tk):
    vae = small_vae()
    report = inject(vae, tk)
    assert report.replaced == expected_replaced(vae), report
    assert report.replaced["norm_out_silu"] == 2 and report.replaced["group_norm"] == 2  # the mid-block attentions


def assert_exact(fn, model, inputs, calls_expected=True):
    expected = fn(model, inputs)
    tk = stand_in()
    inject(model, tk)
    out = fn(model, inputs)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    if calls_expected:
        assert tk.calls["group_norm"] > 0 and tk.calls["add_group_norm"] > 0, tk.calls
    return tk.calls


def run_unet(model, inputs):
    with torch.no_grad():
        return model(**inputs)[0]


@pytest.mark.parametrize("config", [SD15, SDXL], ids=["sd15", "sdxl"])
def test_unet_wiring_matches_eager_exactly_on_cpu(config):
    """The injected UNet with the eager stand-ins gives the original output bit for bit: each
    patched forward sends the right tensors, eps, groups and activation to the right op."""
    model = small_unet(config)
    n = class_counts(model)
    calls = assert_exact(run_unet, model, unet_inputs(config))
    assert calls["add_group_norm"] == n["ResnetBlock2D"]  # every time add fused into its norm2
    assert calls["geglu"] == n["GEGLU"]
    assert calls["group_norm"] == n["ResnetBlock2D"] + 1  # norm1s and conv_norm_out (the others are layers)


@pytest.mark.parametrize("config", [SD15, SDXL], ids=["sd15", "sdxl"])
def test_unet_channels_last_wiring(config):
    """A channels-last UNet (diffusers' recommended memory format) takes the same path: same output."""
    model = small_unet(config).to(memory_format=torch.channels_last)
    inputs = unet_inputs(config)
    inputs["sample"] = inputs["sample"].contiguous(memory_format=torch.channels_last)
    assert_exact(run_unet, model, inputs)


def vae_roundtrip(vae, image):
    with torch.no_grad():
        latent = vae.encode(image).latent_dist.mode()
        return vae.decode(latent, return_dict=False)[0]


def test_vae_wiring_matches_eager_exactly_on_cpu():
    image = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    calls = assert_exact(vae_roundtrip, small_vae(), image, calls_expected=False)
    assert calls["group_norm"] > 0 and calls["add_group_norm"] == 0  # no time embedding in the VAE


def test_switches_turn_rules_off(tk):
    model = small_unet(SDXL)
    report = inject(model, tk, geglu=False)
    assert "geglu" not in report.replaced and report.replaced["resnet_block"] > 0
    assert all("forward" not in vars(m) for m in model.modules() if type(m).__name__ == "GEGLU")
    model = small_unet(SDXL)
    report = inject(model, tk, group_norm=False)
    assert not {"resnet_block", "group_norm", "norm_out_silu"} & set(report.replaced) and report.replaced["geglu"] > 0
    with pytest.raises(TypeError, match="groupnorm"):
        inject(small_unet(SD15), tk, groupnorm=False)


@pytest.mark.parametrize("switches", [{}, {"geglu": False}, {"group_norm": False}], ids=["all", "no_geglu", "no_gn"])
def test_uninject_restores_the_unet_and_its_vae(switches):
    """uninject gives back every forward the SD rules patched (ResNet blocks, conv_norm_out and its
    conv_act, GEGLU, the GroupNorm layers), attribute for attribute and bit for bit."""
    from integration_helpers import assert_restored, snapshot

    for model, fn, inputs in ((small_unet(SDXL), run_unet, unet_inputs(SDXL)),
                              (small_vae(), vae_roundtrip, torch.randn(1, 3, 32, 32))):
        expected = fn(model, inputs)
        before = snapshot(model)
        report = inject(model, stand_in(), **switches)
        needs = {"resnet_block": "group_norm", "norm_out_silu": "group_norm", "group_norm": "group_norm",
                 "geglu": "geglu"}
        assert report.replaced == {k: v for k, v in expected_replaced(model).items()
                                   if switches.get(needs.get(k), True)}, report
        assert all(report.switches[k] is v for k, v in switches.items())
        torch.testing.assert_close(fn(model, inputs), expected, rtol=0, atol=0)
        assert (uninject(model) > 0) == bool(report.replaced)
        assert_restored(model, before)
        torch.testing.assert_close(fn(model, inputs), expected, rtol=0, atol=0)


def test_mixed_dtype_fallback_is_reported_and_raises_under_strict():
    """The fp32 norm1 under bf16 activations is a fallback of resnet_block: listed in the report,
    counted once per forward, and a KernelFallbackError under strict=True."""
    from transformer_kernels_integrations.patching import KernelFallbackError

    model = small_unet(SD15, torch.bfloat16)
    next(m for m in model.modules() if type(m).__name__ == "ResnetBlock2D").norm1.float()
    inputs = unet_inputs(SD15, torch.bfloat16)
    report = inject(model, stand_in())
    assert {"resnet_block", "norm_out_silu"} <= set(report.fallbacks) and "F.group_norm" in report.fallbacks["resnet_block"]
    run_unet(model, inputs)
    assert report.fallbacks_taken == {"resnet_block": 1}, report
    uninject(model)
    inject(model, stand_in(), strict=True)
    with pytest.raises(KernelFallbackError, match="resnet_block runs F.group_norm \\+ F.silu: norm parameters"):
        run_unet(model, inputs)


def test_mixed_dtype_norm_falls_back_to_the_module_math():
    """A norm kept in fp32 under bf16 activations (F.group_norm takes it on CPU) runs F.group_norm
    itself, not the kernel: the output is still the eager one."""
    model = small_unet(SD15, torch.bfloat16)
    block = next(m for m in model.modules() if type(m).__name__ == "ResnetBlock2D")
    block.norm1.float()
    inputs = unet_inputs(SD15, torch.bfloat16)
    calls = assert_exact(run_unet, model, inputs)
    assert calls["group_norm"] == class_counts(model)["ResnetBlock2D"]  # one norm1 fell back; conv_norm_out did not


# ---- pipelines ----


def sd_pipeline(xl: bool):
    from diffusers import EulerDiscreteScheduler, StableDiffusionPipeline, StableDiffusionXLPipeline

    unet, vae = small_unet(SDXL if xl else SD15), small_vae()
    if xl:
        return StableDiffusionXLPipeline(vae=vae, text_encoder=None, text_encoder_2=None, tokenizer=None,
                                         tokenizer_2=None, unet=unet, scheduler=EulerDiscreteScheduler(steps_offset=1),
                                         add_watermarker=False)
    return StableDiffusionPipeline(vae=vae, text_encoder=None, tokenizer=None, unet=unet,
                                   scheduler=EulerDiscreteScheduler(steps_offset=1), safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)


def generate(pipe, xl: bool, device="cpu", dtype=torch.float32):
    """Two guided steps and the VAE decode from random prompt embeddings (no text encoder)."""
    g = torch.Generator().manual_seed(7)
    embeds = torch.randn(1, TEXT_TOKENS, TEXT_CHANNELS, generator=g).to(device, dtype)
    kwargs = dict(prompt_embeds=embeds, negative_prompt_embeds=torch.zeros_like(embeds))
    if xl:
        pooled = torch.randn(1, POOLED, generator=g).to(device, dtype)
        kwargs.update(pooled_prompt_embeds=pooled, negative_pooled_prompt_embeds=torch.zeros_like(pooled))
    with torch.no_grad():
        return pipe(**kwargs, height=32, width=32, num_inference_steps=2, output_type="pt",
                    generator=torch.Generator(device).manual_seed(0)).images


@pytest.mark.parametrize("xl", [False, True], ids=["sd15", "sdxl"])
def test_pipeline_report_and_exact_images_on_cpu(tk, xl):
    """inject(pipe) takes the UNet and the VAE; with the stand-ins the images are the eager ones."""
    pipe = sd_pipeline(xl)
    report = inject(pipe, tk)
    expected = Counter(expected_replaced(pipe.unet)) + Counter(expected_replaced(pipe.vae))
    assert report.replaced == dict(expected), report
    assert "resnet_block" in str(report) and "geglu" in str(report)
    images = generate(sd_pipeline(xl), xl)
    assert images.shape == (1, 3, 32, 32) and images.isfinite().all()
    pipe = sd_pipeline(xl)
    inject(pipe, stand_in())
    torch.testing.assert_close(generate(pipe, xl), images, rtol=0, atol=0)


@pytest.mark.parametrize("order", ["inject_then_offload", "offload_then_inject"])
def test_offload_hooks_either_order_on_cpu(order):
    """With accelerate's hooks (what enable_model_cpu_offload installs on each component), injected
    before or after, generation runs our forwards and gives the eager images."""
    accelerate = pytest.importorskip("accelerate")

    def offload(pipe):
        hook = None
        for name in ("unet", "vae"):  # model_cpu_offload_seq, minus the absent text encoders
            _, hook = accelerate.cpu_offload_with_hook(getattr(pipe, name), "cpu", prev_module_hook=hook)

    expected = generate(sd_pipeline(True), True)
    pipe = sd_pipeline(True)
    tk = stand_in()
    if order == "inject_then_offload":
        inject(pipe, tk)
        offload(pipe)
    else:
        offload(pipe)
        assert hasattr(pipe.unet, "_hf_hook")
        inject(pipe, tk)
    images = generate(pipe, True)
    assert tk.calls["add_group_norm"] > 0 and hasattr(pipe.unet, "_hf_hook")
    torch.testing.assert_close(images, expected, rtol=0, atol=0)


# ---- GPU: the real kernels ----


def rel_error(out, expected):
    return ((out.float() - expected.float()).norm() / expected.float().norm()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("memory_format", ["contiguous", "channels_last"])
@pytest.mark.parametrize("config", [SD15, SDXL], ids=["sd15", "sdxl"])
def test_injected_unet_matches_eager_on_gpu(tk, config, memory_format):
    model = small_unet(config, torch.bfloat16, "cuda")
    inputs = unet_inputs(config, torch.bfloat16, "cuda")
    if memory_format == "channels_last":
        model = model.to(memory_format=torch.channels_last)
        inputs["sample"] = inputs["sample"].contiguous(memory_format=torch.channels_last)
    expected = run_unet(model, inputs)
    inject(model, tk)
    assert rel_error(run_unet(model, inputs), expected) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_injected_vae_matches_eager_on_gpu(tk, dtype):
    vae = small_vae(dtype, "cuda")
    image = torch.randn(2, 3, 64, 64, device="cuda", dtype=dtype)
    # fp32 with full-precision convolutions: cuDNN's default TF32 rounds each conv input to 10 bits,
    # so that our norms' last-bit differences (fp32 statistics summed in another order) flip TF32
    # roundings, which compound over the layers into ~1e-3 relative: the comparison would measure
    # TF32, not the kernels. Without it the difference stays at the fp32 level.
    cudnn = torch.backends.cudnn
    with cudnn.flags(enabled=cudnn.enabled, benchmark=cudnn.benchmark, deterministic=cudnn.deterministic,
                     allow_tf32=False):
        expected = vae_roundtrip(vae, image)
        inject(vae, tk)
        assert rel_error(vae_roundtrip(vae, image), expected) < (1e-2 if dtype != torch.float32 else 1e-4)


@pytest.mark.gpu
def test_injected_unet_compiles_fullgraph(tk):
    model = small_unet(SDXL, torch.bfloat16, "cuda")
    inputs = unet_inputs(SDXL, torch.bfloat16, "cuda")
    inject(model, tk)
    eager = run_unet(model, inputs)
    torch._dynamo.reset()
    # Inductor drops the bf16 roundings between the eager ops it fuses (closer to fp64, further from
    # eager): over the UNet's few hundred ops that alone came to 1.05e-2 on the H200 (our ops are
    # opaque to it and run the same kernels in both). Keeping eager's casts measures the graph's wiring.
    with torch._inductor.config.patch(emulate_precision_casts=True):
        compiled = torch.compile(model, fullgraph=True)
        assert rel_error(run_unet(compiled, inputs), eager) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("xl", [False, True], ids=["sd15", "sdxl"])
def test_pipeline_with_model_cpu_offload_on_gpu(tk, xl):
    """enable_model_cpu_offload (components moved to the GPU by hooks as they run) with our kernels:
    images close to the eager pipeline's."""
    expected = generate(sd_pipeline(xl).to("cuda", torch.float16), xl, "cuda", torch.float16)
    pipe = sd_pipeline(xl).to(torch.float16)
    inject(pipe, tk)
    pipe.enable_model_cpu_offload()
    images = generate(pipe, xl, "cuda", torch.float16)
    assert rel_error(images.cpu(), expected.cpu()) < 2e-2


def test_benchmark_configs_are_the_real_models(tk):
    """bench_sd builds SDXL's and SD 1.5's UNet and the VAE from configs written out in the script: on
    the meta device they have the published parameter counts, and inject takes every block of them
    (SDXL: 17 ResNet blocks, 11 Transformer2DModel input norms, 70 GEGLU feed-forwards)."""
    from benchmarks.bench_sd import SD15_UNET, SD_VAE, SDXL_UNET

    with torch.device("meta"):
        sdxl = diffusers.UNet2DConditionModel.from_config(SDXL_UNET)
        sd15 = diffusers.UNet2DConditionModel.from_config(SD15_UNET)
        vae = diffusers.AutoencoderKL.from_config(SD_VAE)
    assert sum(p.numel() for p in sdxl.parameters()) == 2_567_463_684
    assert sum(p.numel() for p in sd15.parameters()) == 859_520_964
    assert sum(p.numel() for p in vae.parameters()) == 83_653_863
    for model in (sdxl, sd15, vae):
        expected = expected_replaced(model)
        report = inject(model.eval(), tk)  # as bench_sd runs them (a model in training mode: below)
        assert report.replaced == expected and not report.left, report
    # from_config gives training mode: inject then takes only ops with a backward, which every SD rule's
    # ops now have (GroupNorm's since group_norm_backward)
    uninject(sd15)
    report = inject(sd15.train(), tk)
    assert report.training and report.replaced == expected_replaced(sd15) and not report.skipped, report
    assert expected_replaced(sdxl) == {"resnet_block": 17, "group_norm": 11, "norm_out_silu": 1, "geglu": 70,
                                       "layer_norm": 210}


def test_lora_training_step_through_the_injected_unet_matches_eager(tk):
    """SD fine-tuning as diffusers' LoRA scripts run it: peft adapters on the attention projections
    and the feed-forward's GEGLU projection, the base frozen, the UNet in training mode. inject applies
    the GroupNorm rules (they have a backward) and leaves a GEGLU whose projection carries an adapter
    to diffusers (its rule takes a plain projection only); the loss and every adapter gradient are
    eager's exactly (the stand-ins are the eager code; the kernels' own backward is checked against
    float64 in tests/group_norm/test_group_norm_backward.py)."""
    peft = pytest.importorskip("peft")
    import copy

    eager = small_unet(SD15).train()
    eager.requires_grad_(False)
    eager.add_adapter(peft.LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0", "proj"]))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # peft starts lora_B at zero: lora_A would get no gradient
        for name, p in eager.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    adapters = [name for name, p in eager.named_parameters() if p.requires_grad]
    assert any("ff.net.0.proj" in name for name in adapters) and any("to_q" in name for name in adapters)
    ours = copy.deepcopy(eager)
    kernels = stand_in()
    kernels.has_backward = tk.has_backward
    report = inject(ours, kernels)
    assert report.training and {"resnet_block", "norm_out_silu", "group_norm"} <= set(report.replaced), report
    geglu_skips = [why for path, why in report.skipped.items() if path.endswith("ff.net.0")]
    assert "geglu" not in report.replaced and geglu_skips and set(geglu_skips) == {"not diffusers' GEGLU"}, report
    inputs = unet_inputs(SD15)
    target = torch.randn(2, 4, 16, 16, generator=g)
    losses = [torch.nn.functional.mse_loss(model(**inputs)[0], target) for model in (eager, ours)]
    for loss in losses:
        loss.backward()
    assert torch.equal(losses[0], losses[1])
    assert kernels.calls["add_group_norm"] > 0 and kernels.calls["group_norm"] > 0, kernels.calls
    params = [dict(model.named_parameters()) for model in (eager, ours)]
    for name in adapters:
        assert params[1][name].grad is not None, f"{name}: the adapter got no gradient through the injected UNet"
        torch.testing.assert_close(params[1][name].grad, params[0][name].grad, rtol=0, atol=0, msg=name)
