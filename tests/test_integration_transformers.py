"""transformers integration: inject() on Llama and Qwen3 models built from small configs.

On CPU the injected model runs with the eager reference code in place of the kernels and must give
exactly the original logits (the wiring), with every switch off, on, and each one off alone, and
every replaced kind's kernel function called; uninject() gives back the original model bit for bit.
On the GPU the real kernels run."""

import importlib
import inspect
import itertools
import logging
from types import SimpleNamespace

import pytest
import torch

from helpers import EAGER_LAYERS, randomize_norm_weights
from integration_helpers import CountingKernels, assert_every_kind_ran, assert_restored, snapshot
from reference.activations import eager_act_mul
from reference.norms import hf_fused_add_rms_norm
from reference.rope import hf_apply_rotary_pos_emb, hf_qk_norm_rope

transformers = pytest.importorskip("transformers")
from transformer_kernels_integrations import KernelFallbackError, injected, patching, transformers_models  # noqa: E402
from transformer_kernels_integrations import inject as inject_any  # noqa: E402
from transformer_kernels_integrations.transformers_models import SWITCHES, inject, uninject  # noqa: E402

EAGER_TK = SimpleNamespace(
    layers=EAGER_LAYERS,
    fused_add_rms_norm=lambda x, residual, w=None, eps=1e-6: hf_fused_add_rms_norm(x, residual, w, eps),
    act_mul=lambda gate, up, activation="silu": eager_act_mul(gate, up, activation),
    apply_rotary_pos_emb=hf_apply_rotary_pos_emb,
    hf_qk_norm_rope=hf_qk_norm_rope,
)

CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2, vocab_size=101),
    "qwen3": lambda: transformers.Qwen3Config(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                              vocab_size=101),
}
CLASSES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def modeling(name):
    return importlib.import_module(f"transformers.models.{name}.modeling_{name}")


@pytest.fixture(autouse=True)
def restore_rotary_functions():
    """inject() swaps apply_rotary_pos_emb in the modeling modules: a test that leaves a model
    injected gets transformers' functions back afterwards, so that every test's eager model is
    transformers' own."""
    originals = {name: modeling(name).apply_rotary_pos_emb for name in CLASSES}
    yield
    patching._GLOBAL_SWAPS.clear()
    for name, fn in originals.items():
        modeling(name).apply_rotary_pos_emb = fn


def small_model(name, dtype=torch.float32, device="cpu"):
    torch.manual_seed(0)
    model = getattr(transformers, CLASSES[name])(CONFIGS[name]())
    randomize_norm_weights(model)
    return model.to(device, dtype).eval()


# what inject() replaces in each small model: Qwen3's attention fuses its q/k norms with the rotation
REPLACED = {
    "llama": {"decoder_layer": 2, "mlp": 2, "rms_norm": 3, "rope": 2},  # input norms and the final norm
    "qwen3": {"decoder_layer": 2, "mlp": 2, "rms_norm": 3, "qk_norm_rope": 2},
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_report(tk, name):
    model = small_model(name)
    report = inject(model, tk)
    assert report.replaced == REPLACED[name] and not report.skipped, report
    fallback_kind = "rope" if name == "llama" else "qk_norm_rope"
    assert set(report.fallbacks) == {fallback_kind} and "transformers'" in report.fallbacks[fallback_kind]
    assert "can fall back: " + fallback_kind in str(report)


def test_switches_are_the_table_s_and_unknown_ones_are_refused(tk):
    assert SWITCHES == ("fused_add_rms_norm", "qk_norm_rope", "rms_norm", "rope", "swiglu")
    with pytest.raises(TypeError, match=r"unknown switch\(es\) \['rmsnorm'\]; the switches are"):
        inject(small_model("llama"), tk, rmsnorm=False)
    with pytest.raises(TypeError, match="True or False"):
        inject(small_model("llama"), tk, rope="no")


# What each switch turned off alone leaves (the rules that need it are off; their children fall
# to the rules after them)
REPLACED_WITHOUT = {
    "llama": {
        "rms_norm": {"mlp": 2, "rope": 2},
        "rope": {"decoder_layer": 2, "mlp": 2, "rms_norm": 3},
        "swiglu": {"decoder_layer": 2, "rms_norm": 3, "rope": 2},
        "fused_add_rms_norm": {"mlp": 2, "rms_norm": 5, "rope": 2},
        "qk_norm_rope": REPLACED["llama"],
    },
    "qwen3": {
        "rms_norm": {"mlp": 2, "rope": 2},
        "rope": {"decoder_layer": 2, "mlp": 2, "rms_norm": 7},
        "swiglu": {"decoder_layer": 2, "rms_norm": 3, "qk_norm_rope": 2},
        "fused_add_rms_norm": {"mlp": 2, "rms_norm": 5, "qk_norm_rope": 2},
        "qk_norm_rope": {"decoder_layer": 2, "mlp": 2, "rms_norm": 7, "rope": 2},
    },
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("off", SWITCHES)
def test_each_switch_off(tk, name, off):
    model = small_model(name)
    report = inject(model, tk, **{off: False})
    assert report.replaced == REPLACED_WITHOUT[name][off], report
    assert report.switches[off] is False and all(v for k, v in report.switches.items() if k != off)
    if off != "qk_norm_rope":  # without it the rope and rms_norm rules take what the fused rule leaves
        assert any(f"{off}=False" in why for why in report.skipped.values()), report
    assert f"switched off: {off}" in str(report)


def test_all_switches_off_patch_nothing(tk):
    model = small_model("llama")
    before = snapshot(model)
    report = inject(model, tk, **{s: False for s in SWITCHES})
    assert report.replaced == {} and "rms_norm=False" in report.skipped["model.norm"], report
    assert_restored_after_uninject(model, before)


def assert_restored_after_uninject(model, before):
    uninject(model)
    assert_restored(model, before)


# Every switch off, every switch on, and each one off alone
SWITCH_SETS = [{}, {s: False for s in SWITCHES}] + [{s: False} for s in SWITCHES]


def test_qwen3_attention_the_fused_rule_skips_falls_to_rope(tk):
    model = small_model("qwen3")
    model.model.layers[0].self_attn.k_norm.variance_epsilon = 1e-5  # the op takes one eps for q and k
    report = inject(model, tk)
    # layer 0: apply_rotary_pos_emb swapped, its q/k norms left to the RMSNorm rule
    assert report.replaced == {"decoder_layer": 2, "mlp": 2, "rms_norm": 5, "qk_norm_rope": 1, "rope": 1}, report
    assert "model.layers.0.self_attn" not in report.skipped, report


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("switches", SWITCH_SETS, ids=lambda s: "all_on" if not s else
                         "all_off" if len(s) > 1 else f"no_{next(iter(s))}")
def test_wiring_matches_eager_model_exactly_and_uninject_restores_it_on_cpu(monkeypatch, name, switches):
    """The eager stand-ins run through every patched forward on CPU (KERNEL_DEVICES widened): the
    logits are the original's exactly, every replaced kind's kernel function ran, and uninject
    gives back the original model (every attribute the same object, every weight the same bits)
    and transformers' apply_rotary_pos_emb."""
    model = small_model(name)
    ids = torch.randint(0, 101, (2, 13), generator=torch.Generator().manual_seed(3))
    expected = model(ids).logits
    before, rotary = snapshot(model), modeling(name).apply_rotary_pos_emb
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    kernels = CountingKernels(EAGER_TK)
    report = inject(model, kernels, **switches)
    torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
    assert_every_kind_ran(report, kernels)
    assert not report.fallbacks_taken, report
    assert uninject(model) > 0 or not report.replaced
    assert_restored(model, before)
    assert modeling(name).apply_rotary_pos_emb is rotary
    assert not patching._GLOBAL_SWAPS
    torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
    assert uninject(model) == 0  # twice is harmless


def test_calls_per_forward_are_one_per_patched_module(monkeypatch):
    model = small_model("llama")
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    kernels = CountingKernels(EAGER_TK)
    inject(model, kernels)
    model(torch.randint(0, 101, (1, 5)))
    assert kernels.calls == {"fused_add_rms_norm": 2, "act_mul": 2, "layers.RMSNorm": 3, "apply_rotary_pos_emb": 2}


def test_rope_swap_is_shared_and_restored_with_the_last_model(tk):
    rotary = modeling("llama").apply_rotary_pos_emb
    first, second = small_model("llama"), small_model("llama")
    inject(first, tk)
    swapped = modeling("llama").apply_rotary_pos_emb
    assert swapped is not rotary
    inject(second, tk)
    assert modeling("llama").apply_rotary_pos_emb is swapped  # one swap for the process
    uninject(first)
    assert modeling("llama").apply_rotary_pos_emb is swapped  # the second model still uses it
    uninject(second)
    assert modeling("llama").apply_rotary_pos_emb is rotary


def test_inject_twice_needs_uninject_between(tk):
    model = small_model("llama")
    inject(model, tk)
    with pytest.raises(ValueError, match="injected already; call uninject"):
        inject(model, tk)
    uninject(model)
    assert inject(model, tk).replaced == REPLACED["llama"]


def test_injected_context_manager_restores_on_exit_and_on_error(tk):
    model = small_model("qwen3")
    before = snapshot(model)
    with injected(model, tk, swiglu=False) as report:
        assert report.replaced == REPLACED_WITHOUT["qwen3"]["swiglu"]
    assert_restored(model, before)
    with pytest.raises(RuntimeError, match="inside"):
        with injected(model, tk):
            raise RuntimeError("inside")
    assert_restored(model, before)


def test_top_level_inject_dispatches_to_the_transformers_rules(tk):
    model = small_model("llama")
    assert inject_any(model, tk).replaced == REPLACED["llama"]
    with pytest.raises(TypeError, match="unknown switch"):
        inject_any(small_model("llama"), tk, no_such_op=False)
    assert inject_any(small_model("qwen3"), tk, gelu=False).replaced == REPLACED["qwen3"]  # another table's switch


def test_fallback_is_logged_once_and_counted(caplog):
    """Llama's RoPE on CPU tensors runs transformers' function (KERNEL_DEVICES is the GPU's): one
    warning however many calls, and the report counts them."""
    model = small_model("llama")
    ids = torch.randint(0, 101, (2, 7), generator=torch.Generator().manual_seed(1))
    expected = model(ids).logits
    kernels = CountingKernels(EAGER_TK)
    report = inject(model, kernels)
    with caplog.at_level(logging.WARNING, logger="transformer_kernels_integrations"):
        torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
        model(ids)
    warnings = [r for r in caplog.records if "rope runs the library's own code" in r.getMessage()]
    assert len(warnings) == 1 and "tensors on cpu" in warnings[0].getMessage()
    assert report.fallbacks_taken == {"rope": 4} and "apply_rotary_pos_emb" not in kernels.calls
    assert "fell back 4x: rope" in str(report)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_strict_makes_a_fallback_raise(name):
    model = small_model(name)
    inject(model, EAGER_TK, strict=True)
    kind = "rope" if name == "llama" else "qk_norm_rope"
    with pytest.raises(KernelFallbackError, match=f"{kind} runs the library's own code: tensors on cpu"):
        model(torch.randint(0, 101, (1, 4)))


def prefill_then_decode(model, ids):
    """Logits of a prefill of all but the last token, then of one decode step through the KV cache."""
    # transformers 5 names the cache `cache`, 4.x `past_key_values`
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with torch.no_grad():
        prefill = model(ids[:, :-1], use_cache=True)
        step = model(ids[:, -1:], use_cache=True, **{cache_arg: prefill[cache_arg]})
    return prefill.logits, step.logits


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_qwen3_fused_attention_wiring_on_cpu(monkeypatch, attn):
    """Qwen3's fused attention forward run on CPU with the eager reference in place of the kernel
    (KERNEL_DEVICES widened): the model's logits, prefill and a cached decode step, are eager's exactly."""
    model = small_model("qwen3")
    model.config._attn_implementation = attn
    ids = torch.randint(0, 101, (2, 13), generator=torch.Generator().manual_seed(5))
    expected, expected_steps = model(ids).logits, prefill_then_decode(model, ids)
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    kernels = CountingKernels(EAGER_TK)
    assert inject(model, kernels).replaced["qk_norm_rope"] == 2
    torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
    assert kernels.calls.get("hf_qk_norm_rope") == 2  # the fused path ran, once per layer
    for ours, eager in zip(prefill_then_decode(model, ids), expected_steps):
        torch.testing.assert_close(ours, eager, rtol=0, atol=0)
    assert kernels.calls["hf_qk_norm_rope"] == 2 + 4


def test_qwen3_fused_attention_compiles_fullgraph_on_cpu(monkeypatch):
    """The fused attention forward traces without graph breaks (the reference stands in for the op)."""
    model = small_model("qwen3")
    ids = torch.randint(0, 101, (2, 13), generator=torch.Generator().manual_seed(9))
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    inject(model, EAGER_TK)
    torch._dynamo.reset()
    with torch.no_grad():
        expected = model(ids).logits
        compiled = torch.compile(lambda ids: model(ids).logits, fullgraph=True)(ids)
    torch.testing.assert_close(compiled, expected, rtol=1e-5, atol=1e-5)  # inductor fuses the reference's ops


def test_qwen3_fused_attention_keeps_transformers_code_for_cpu_tensors():
    model = small_model("qwen3")
    ids = torch.randint(0, 101, (2, 7), generator=torch.Generator().manual_seed(7))
    expected = model(ids).logits
    kernels = CountingKernels(EAGER_TK)
    report = inject(model, kernels)
    torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
    assert "hf_qk_norm_rope" not in kernels.calls and report.fallbacks_taken == {"qk_norm_rope": 2}


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_injected_model_matches_eager_on_gpu(tk, name):
    model = small_model(name, torch.bfloat16, "cuda")
    ids = torch.randint(0, 101, (2, 33), device="cuda")
    expected = model(ids).logits.float()
    kernels = CountingKernels(tk)
    report = inject(model, kernels, strict=True)  # no fallback on the GPU
    assert report.replaced == REPLACED[name], report
    out = model(ids).logits.float()
    assert_every_kind_ran(report, kernels)
    assert ((out - expected).norm() / expected.norm()).item() < 1e-2
    generated = model.generate(ids[:, :5], max_new_tokens=4, do_sample=False)  # decode with a KV cache
    assert generated.shape == (2, 9)


@pytest.mark.gpu
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_qwen3_fused_attention_matches_eager_on_gpu(tk, attn):
    """The fused q/k norm + RoPE kernel in a Qwen3 model with Qwen3-8B's head layout (GQA 4:1,
    head_dim 128): prefill and a cached decode step against the eager model, within bf16 tolerance."""
    config = transformers.Qwen3Config(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                      num_attention_heads=8, num_key_value_heads=2, head_dim=128, vocab_size=101,
                                      rope_theta=1000000.0, attn_implementation=attn)
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config)
    randomize_norm_weights(model)
    model = model.to("cuda", torch.bfloat16).eval()
    ids = torch.randint(0, 101, (2, 37), device="cuda")
    expected = prefill_then_decode(model, ids)
    kernels = CountingKernels(tk)
    assert inject(model, kernels).replaced["qk_norm_rope"] == 2
    for ours, eager in zip(prefill_then_decode(model, ids), expected):
        assert ((ours.float() - eager.float()).norm() / eager.float().norm()).item() < 1e-2
    assert kernels.calls["hf_qk_norm_rope"] == 4  # both layers, prefill and decode
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(lambda ids: model(ids).logits, fullgraph=True)(ids)
        eager = model(ids).logits.float()
    # inductor recomputes the rest of the model (the cos/sin tables, residual adds): bf16-level differences
    assert ((compiled.float() - eager).norm() / eager.norm()).item() < 1e-2


def test_hub_layers_validate_against_transformers_layers(tk):
    """kernelize's own validation of each mapped layer against the class (or function) it replaces."""
    from kernels.layer.layer import _create_func_module, _validate_layer
    from transformers import activations
    from transformers.models.llama import modeling_llama

    from transformer_kernels_integrations.transformers_models import HUB_LAYERS, kernel_mapping

    hosts = {"RMSNorm": modeling_llama.LlamaRMSNorm, "SiLU": getattr(activations, "SiLUActivation", None),
             "GeluTanh": getattr(activations, "GELUTanh", None),
             "rotary_pos_emb": _create_func_module(modeling_llama.apply_rotary_pos_emb)}
    for hub_name, layer in HUB_LAYERS.items():
        if hosts[hub_name] is not None:  # older transformers lack some of the classes
            _validate_layer(check_cls=hosts[hub_name], cls=getattr(tk.layers, layer), repo=hub_name)
    assert set(kernel_mapping()) == set(HUB_LAYERS)


# ---- transformers' own Hub path: from_pretrained(..., use_kernels=True, kernel_config=...) ----


def transformers_takes_installed_kernels() -> str | None:
    """Why transformers' kernel integration is off with the installed kernels, or None."""
    from importlib.metadata import version

    from transformers.utils import import_utils

    if import_utils.is_kernels_available():
        return None
    return (f"transformers {transformers.__version__} accepts kernels >= {import_utils.KERNELS_MIN_VERSION}, "
            f"< {import_utils.KERNELS_MAX_VERSION}; kernels {version('kernels')} is installed, so its hub "
            f"layers are not registered and use_kernels=True raises")


def test_kernel_config_names_our_layers_with_trust_and_the_v1_branch(tk):
    """The KernelConfig describes our layers (revision v1, trust_remote_code=True, RMSNorm last),
    and each entry loads the layer it names through the LayerRepository transformers builds."""
    from kernels import LayerRepository

    from transformer_kernels_integrations.loading import REPO_ID
    from transformer_kernels_integrations.transformers_models import HUB_LAYERS, kernel_config

    config = kernel_config()
    assert list(config.kernel_mapping) == ["SiLU", "rotary_pos_emb", "RMSNorm"]
    for name, per_device in config.kernel_mapping.items():
        repo, meta = per_device["cuda"]
        assert repo == f"{REPO_ID}:{HUB_LAYERS[name]}" and meta == {"revision": "v1", "trust_remote_code": True}
        layer = LayerRepository(REPO_ID, layer_name=HUB_LAYERS[name], **meta).load()
        assert layer is getattr(tk.layers, HUB_LAYERS[name])
    with pytest.raises(ValueError, match="no layer of ours"):
        kernel_config(("MultiScaleDeformableAttention",))


def save_small_llama(tmp_path):
    model = small_model("llama")
    model.save_pretrained(tmp_path)
    return model


def test_from_pretrained_with_our_kernel_config_on_cpu(tmp_path, tk):
    """use_kernels=True with our KernelConfig: the mapping passes transformers' checks and loads our
    layers; on CPU kernelize keeps transformers' forwards (the mapping is for cuda), so the logits
    are the eager ones."""
    why = transformers_takes_installed_kernels()
    if why:
        pytest.skip(why)
    from transformer_kernels_integrations.transformers_models import kernel_config

    eager = save_small_llama(tmp_path)
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path, use_kernels=True, kernel_config=kernel_config())
    ids = torch.randint(0, 101, (2, 9), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(model(ids).logits, eager(ids).logits, rtol=0, atol=0)


@pytest.mark.gpu
def test_from_pretrained_with_our_kernel_config_on_gpu(tmp_path, tk):
    """On the GPU, kernelize binds our RMSNorm layer's forward to every RMSNorm (and SiLU, RoPE),
    the kernel runs (call counts) and the logits match eager within bf16 rounding."""
    why = transformers_takes_installed_kernels()
    if why:
        pytest.skip(why)
    from transformer_kernels_integrations.transformers_models import kernel_config

    save_small_llama(tmp_path)
    eager = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).to("cuda").eval()
    model = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16, device_map="cuda",
                                                          use_kernels=True, kernel_config=kernel_config())
    norms = [m for m in model.modules() if type(m).__name__ == "LlamaRMSNorm"]
    assert norms and all(m.forward.__func__ is tk.layers.RMSNorm.forward for m in norms)
    ids = torch.randint(0, 101, (2, 33), device="cuda")
    with torch.no_grad():
        expected = eager(ids).logits.float()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            out = model(ids).logits.float()
    calls = {e.key: e.count for e in prof.key_averages()}
    assert calls.get(tk.add_op_namespace_prefix("rms_norm")) == len(norms), calls  # every norm ran our op
    assert ((out - expected).norm() / expected.norm()).item() < 1e-2


@pytest.mark.gpu
def test_kernelize_with_our_kernel_mapping_on_gpu(monkeypatch, tk):
    """kernels' own path, which works whatever transformers accepts: tag the RMSNorm class (what
    replace_kernel_forward_from_hub does; transformers tags it only when it takes the installed
    kernels), kernelize with kernel_mapping(): every RMSNorm runs our op, logits within bf16."""
    from kernels import Mode, kernelize, use_kernel_mapping
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from transformer_kernels_integrations.transformers_models import kernel_mapping

    if getattr(LlamaRMSNorm, "kernel_layer_name", None) is None:
        monkeypatch.setattr(LlamaRMSNorm, "kernel_layer_name", "RMSNorm", raising=False)
        monkeypatch.setattr(LlamaRMSNorm, "kernel_condition", staticmethod(lambda module: True), raising=False)
    model = small_model("llama", torch.bfloat16, "cuda")
    ids = torch.randint(0, 101, (2, 33), device="cuda")
    with torch.no_grad():
        expected = model(ids).logits.float()
    with use_kernel_mapping(kernel_mapping()):
        kernelize(model, mode=Mode.INFERENCE, device="cuda")
    norms = [m for m in model.modules() if isinstance(m, LlamaRMSNorm)]
    assert all(m.forward.__func__ is tk.layers.RMSNorm.forward for m in norms)
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = model(ids).logits.float()
    calls = {e.key: e.count for e in prof.key_averages()}
    assert calls.get(tk.add_op_namespace_prefix("rms_norm")) == len(norms), calls
    assert ((out - expected).norm() / expected.norm()).item() < 1e-2
