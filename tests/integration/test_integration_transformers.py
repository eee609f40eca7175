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

from families import family_module
from helpers import EAGER_LAYERS, randomize_norm_weights
from integration_helpers import CountingKernels, assert_every_kind_ran, assert_restored, snapshot
from reference.activations import eager_act_and_mul, eager_act_mul
from reference.norms import hf_fused_add_rms_norm
from reference.rope import hf_apply_rotary_pos_emb, hf_qk_norm_rope

transformers = pytest.importorskip("transformers")
from transformer_kernels_integrations import KernelFallbackError, injected, merging, patching, transformers_models  # noqa: E402
from transformer_kernels_integrations import inject as inject_any  # noqa: E402
from transformer_kernels_integrations.transformers_models import SWITCHES, inject, uninject  # noqa: E402

EAGER_TK = SimpleNamespace(
    layers=EAGER_LAYERS,
    fused_add_rms_norm=lambda x, residual, w=None, eps=1e-6: hf_fused_add_rms_norm(x, residual, w, eps),
    act_mul=lambda gate, up, activation="silu": eager_act_mul(gate, up, activation),
    silu_and_mul=lambda x: eager_act_and_mul(x, "silu", True),
    apply_rotary_pos_emb=hf_apply_rotary_pos_emb,
    hf_qk_norm_rope=hf_qk_norm_rope,
    decode_linear=family_module("gemm", "eager").IMPLS["decode_linear"],
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


# what inject() replaces in each small model: Qwen3's attention fuses its q/k norms with the rotation;
# q/k/v and gate/up become one GEMM each (merge_projections=True, the default)
REPLACED = {
    "llama": {"decoder_layer": 2, "merged_gate_up_mlp": 2, "rms_norm": 3, "merged_qkv_rope": 2},  # + the final norm
    "qwen3": {"decoder_layer": 2, "merged_gate_up_mlp": 2, "rms_norm": 3, "merged_qkv_qk_norm_rope": 2},
}
REPLACED_UNMERGED = {
    "llama": {"decoder_layer": 2, "mlp": 2, "rms_norm": 3, "rope": 2},
    "qwen3": {"decoder_layer": 2, "mlp": 2, "rms_norm": 3, "qk_norm_rope": 2},
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_report(name, merge):
    model = small_model(name)
    report = inject(model, EAGER_TK, merge_projections=merge)
    assert report.replaced == (REPLACED if merge else REPLACED_UNMERGED)[name] and not report.skipped, report
    fallback_kind = ("merged_qkv_rope" if merge else "rope") if name == "llama" else (
        "merged_qkv_qk_norm_rope" if merge else "qk_norm_rope")
    merged_mlp = {"merged_gate_up_mlp"} if merge else set()
    assert set(report.fallbacks) == set(report.replaced), report  # every patched forward falls back off the GPU
    assert "transformers'" in report.fallbacks[fallback_kind]
    assert "can fall back: " + fallback_kind in str(report)
    assert all("gradients" in report.fallbacks[kind] for kind in {fallback_kind} | merged_mlp if kind.startswith("merged"))
    # the report says which ops each kind runs, by the ops' names
    assert set(report.ops) == set(report.replaced) and report.ops["decoder_layer"] == ("fused_add_rms_norm",)
    assert "2 decoder_layer [fused_add_rms_norm]" in str(report)
    assert report.ops["merged_gate_up_mlp" if merge else "mlp"] == (("act_and_mul",) if merge else ("act_mul",))


def test_switches_are_the_table_s_and_unknown_ones_are_refused(tk):
    assert SWITCHES == ("fused_add_rms_norm", "fused_linear_cross_entropy", "merge_projections", "qk_norm_rope",
                        "rms_norm", "rope", "swiglu")
    with pytest.raises(TypeError, match=r"unknown switch\(es\) \['rmsnorm'\]; the switches are"):
        inject(small_model("llama"), tk, rmsnorm=False)
    with pytest.raises(TypeError, match="True or False"):
        inject(small_model("llama"), tk, rope="no")


# What each switch turned off alone leaves (the rules that need it are off; their children fall
# to the rules after them). Qwen3's q/k/v merge only with its fused attention (qk_norm_rope).
REPLACED_WITHOUT = {
    "llama": {
        "rms_norm": {"merged_gate_up_mlp": 2, "merged_qkv_rope": 2},
        "rope": {"decoder_layer": 2, "merged_gate_up_mlp": 2, "rms_norm": 3},
        "swiglu": {"decoder_layer": 2, "rms_norm": 3, "merged_qkv_rope": 2},
        "fused_add_rms_norm": {"merged_gate_up_mlp": 2, "rms_norm": 5, "merged_qkv_rope": 2},
        "qk_norm_rope": REPLACED["llama"],
        "merge_projections": REPLACED_UNMERGED["llama"],
        "fused_linear_cross_entropy": REPLACED["llama"],  # its rule applies in training only
    },
    "qwen3": {
        "rms_norm": {"merged_gate_up_mlp": 2, "rope": 2},
        "rope": {"decoder_layer": 2, "merged_gate_up_mlp": 2, "rms_norm": 7},
        "swiglu": {"decoder_layer": 2, "rms_norm": 3, "merged_qkv_qk_norm_rope": 2},
        "fused_add_rms_norm": {"merged_gate_up_mlp": 2, "rms_norm": 5, "merged_qkv_qk_norm_rope": 2},
        "qk_norm_rope": {"decoder_layer": 2, "merged_gate_up_mlp": 2, "rms_norm": 7, "rope": 2},
        "merge_projections": REPLACED_UNMERGED["qwen3"],
        "fused_linear_cross_entropy": REPLACED["qwen3"],
    },
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("off", SWITCHES)
def test_each_switch_off(tk, name, off):
    model = small_model(name)
    report = inject(model, tk, **{off: False})
    assert report.replaced == REPLACED_WITHOUT[name][off], report
    assert report.switches[off] is False and all(v for k, v in report.switches.items() if k != off)
    # without qk_norm_rope the rope and rms_norm rules take what the fused rule leaves, without
    # merge_projections the unmerged rules; fused_linear_cross_entropy's rule is not in the
    # inference table (test_training_integration turns it off in training)
    if off not in ("qk_norm_rope", "merge_projections", "fused_linear_cross_entropy"):
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


def test_qwen3_attention_the_fused_rule_skips_falls_to_rope():
    model = small_model("qwen3")
    model.model.layers[0].self_attn.k_norm.variance_epsilon = 1e-5  # the op takes one eps for q and k
    report = inject(model, EAGER_TK)
    # layer 0: apply_rotary_pos_emb swapped, its q/k norms left to the RMSNorm rule
    assert report.replaced == {"decoder_layer": 2, "merged_gate_up_mlp": 2, "rms_norm": 5,
                               "merged_qkv_qk_norm_rope": 1, "rope": 1}, report
    assert not report.skipped, report
    assert "model.layers.0.self_attn" not in report.skipped, report


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("switches", SWITCH_SETS, ids=lambda s: "all_on" if not s else
                         "all_off" if len(s) > 1 else f"no_{next(iter(s))}")
def test_wiring_matches_eager_model_exactly_and_uninject_restores_it_on_cpu(monkeypatch, name, switches):
    """The eager stand-ins run through every patched forward on CPU (KERNEL_DEVICES widened): the
    logits are the original's exactly, every replaced kind's kernel function ran (under no_grad,
    where the merged projections run), with gradients wanted the merged kinds fall back to the
    separate projections with the same logits, and uninject gives back the original model (every
    attribute the same object, every weight the same bits and layout, no storage shared that was
    not before) and transformers' apply_rotary_pos_emb."""
    model = small_model(name)
    ids = torch.randint(0, 101, (2, 13), generator=torch.Generator().manual_seed(3))
    expected = model(ids).logits
    before, rotary = snapshot(model), modeling(name).apply_rotary_pos_emb
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    kernels = CountingKernels(EAGER_TK)
    report = inject(model, kernels, **switches)
    with torch.no_grad(), kernels.counting(model):
        torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
    assert_every_kind_ran(report, kernels)
    assert not report.fallbacks_taken, report
    torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)  # gradients wanted
    assert set(report.fallbacks_taken) == {kind for kind in report.replaced if kind.startswith("merged_")}, report
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


def test_calls_per_forward_with_merged_projections_under_no_grad(monkeypatch):
    """Inference: one merged q/k/v GEMM and one merged gate/up GEMM per layer, silu_and_mul on the
    latter, and no separate projection or act_mul."""
    model = small_model("llama")
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    kernels = CountingKernels(EAGER_TK)
    report = inject(model, kernels)
    with torch.no_grad(), kernels.counting(model):
        model(torch.randint(0, 101, (1, 5)))
    assert kernels.calls == {"fused_add_rms_norm": 2, "merged.gate_up": 2, "silu_and_mul": 2, "layers.RMSNorm": 3,
                             "merged.qkv": 2, "apply_rotary_pos_emb": 2}
    assert not report.fallbacks_taken


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
    """On CPU tensors (KERNEL_DEVICES is the GPU's) every patched forward runs transformers' code
    and no kernel function is called: Llama's RoPE gives one warning however many calls, and the
    report counts each kind (the decoder layers', whose own forward still calls the patched
    attention, MLP and input norms, which fall back in turn)."""
    model = small_model("llama")
    ids = torch.randint(0, 101, (2, 7), generator=torch.Generator().manual_seed(1))
    expected = model(ids).logits
    kernels = CountingKernels(EAGER_TK)
    report = inject(model, kernels, merge_projections=False)
    with caplog.at_level(logging.WARNING, logger="transformer_kernels_integrations"):
        torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
        model(ids)
    warnings = [r for r in caplog.records if "rope runs the library's own code" in r.getMessage()]
    assert len(warnings) == 1 and "tensors on cpu" in warnings[0].getMessage()
    assert report.fallbacks_taken == {"decoder_layer": 4, "rms_norm": 6, "rope": 4, "mlp": 4} and not kernels.calls
    assert "fell back 4x: rope" in str(report)


def test_merged_fallbacks_are_logged_once_and_counted(caplog):
    """The merged Llama: on CPU tensors the decoder layers, norms, merged attention (whose RoPE
    falls back too) and merged MLP run transformers' code and no kernel function is called; on the
    kernel device with gradients wanted the merged kinds take the separate projections. One warning
    per kind and reason."""
    model = small_model("llama")
    ids = torch.randint(0, 101, (2, 7), generator=torch.Generator().manual_seed(1))
    expected = model(ids).logits
    kernels = CountingKernels(EAGER_TK)
    report = inject(model, kernels)
    with caplog.at_level(logging.WARNING, logger="transformer_kernels_integrations"):
        torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
        model(ids)
    messages = [r.getMessage() for r in caplog.records]
    assert sorted(messages) == sorted([
        "transformer-kernels: decoder_layer runs the library's own code: tensors on cpu",
        "transformer-kernels: rms_norm runs the library's own code: tensors on cpu",
        "transformer-kernels: merged_qkv_rope runs the library's own code: tensors on cpu",
        "transformer-kernels: rope runs the library's own code: tensors on cpu",
        "transformer-kernels: merged_gate_up_mlp runs the library's own code: tensors on cpu"]), messages
    assert report.fallbacks_taken == {"decoder_layer": 4, "rms_norm": 6, "merged_qkv_rope": 4, "rope": 4,
                                      "merged_gate_up_mlp": 4}
    assert not kernels.calls

    caplog.clear()
    with pytest.MonkeyPatch.context() as mp, caplog.at_level(logging.WARNING, logger="transformer_kernels_integrations"):
        mp.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
        torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2 and all("runs the separate projections: gradients are wanted" in m for m in messages)
    assert report.fallbacks_taken == {"decoder_layer": 4, "rms_norm": 6, "merged_qkv_rope": 6, "rope": 4,
                                      "merged_gate_up_mlp": 6}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_strict_makes_a_fallback_raise(name, merge):
    """CPU tensors: the first patched forward they reach (the decoder layer's) raises under strict."""
    model = small_model(name)
    inject(model, EAGER_TK, strict=True, merge_projections=merge)
    with pytest.raises(KernelFallbackError, match="decoder_layer runs the library's own code: tensors on cpu"):
        model(torch.randint(0, 101, (1, 4)))


def test_strict_makes_merged_projections_raise_where_gradients_are_wanted(monkeypatch):
    model = small_model("llama")
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    inject(model, EAGER_TK, strict=True)
    ids = torch.randint(0, 101, (1, 4))
    with torch.no_grad():
        model(ids)  # inference: no fallback
    with pytest.raises(KernelFallbackError, match="merged_qkv_rope runs the separate projections: gradients are wanted"):
        model(ids)


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
    assert inject(model, kernels).replaced["merged_qkv_qk_norm_rope"] == 2
    torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)  # grad mode: unmerged projections
    assert kernels.calls.get("hf_qk_norm_rope") == 2  # the fused path ran, once per layer
    for ours, eager in zip(prefill_then_decode(model, ids), expected_steps):  # no_grad: merged projections
        torch.testing.assert_close(ours, eager, rtol=0, atol=0)
    assert kernels.calls["hf_qk_norm_rope"] == 2 + 4
    assert kernels.calls["silu_and_mul"] == 4  # the merged gate/up path ran under no_grad


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


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_qwen3_fused_attention_keeps_transformers_code_for_cpu_tensors(merge):
    model = small_model("qwen3")
    ids = torch.randint(0, 101, (2, 7), generator=torch.Generator().manual_seed(7))
    expected = model(ids).logits
    kernels = CountingKernels(EAGER_TK)
    report = inject(model, kernels, merge_projections=merge)
    torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
    # every patched forward falls back (tensors on cpu): the decoder layers, whose own forward calls
    # the patched attention, MLP and input norms, which fall back in turn, and the final norm
    attention, mlp = ("merged_qkv_qk_norm_rope", "merged_gate_up_mlp") if merge else ("qk_norm_rope", "mlp")
    assert report.fallbacks_taken == {"decoder_layer": 2, "rms_norm": 3, attention: 2, mlp: 2}, report
    assert not kernels.calls
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
    assert "hf_qk_norm_rope" not in kernels.calls and "silu_and_mul" not in kernels.calls


# ---- merged projections ----

def storages(model) -> dict[int, int]:
    return {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_merged_projections_wiring_exact_on_cpu(monkeypatch, name):
    """Under no_grad the merged GEMMs run (reference stand-ins on CPU) and the logits, prefill and a
    cached decode step, are the unmerged model's exactly; the projections' parameters are views of
    one weight per merge, so the parameters take no more memory than before."""
    model = small_model(name)
    ids = torch.randint(0, 101, (2, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = model(ids).logits
    expected_steps = prefill_then_decode(model, ids)
    before = sum(storages(model).values())
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    splits = []
    split = merging.MergedLinear.split
    monkeypatch.setattr(merging.MergedLinear, "split", lambda self, x: (splits.append(self.names), split(self, x))[1])
    kernels = CountingKernels(EAGER_TK)
    inject(model, kernels)
    assert sum(storages(model).values()) == before, "merging grew the parameters' memory"
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert len({p.untyped_storage().data_ptr() for p in (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)}) == 1
    assert mlp.gate_proj.weight.untyped_storage().data_ptr() == mlp.up_proj.weight.untyped_storage().data_ptr()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
    assert kernels.calls["silu_and_mul"] == 2  # merged gate/up, once per layer
    assert splits == [("q_proj", "k_proj", "v_proj")] * 2  # merged q/k/v, once per layer
    for ours, eager in zip(prefill_then_decode(model, ids), expected_steps):
        torch.testing.assert_close(ours, eager, rtol=0, atol=0)


@pytest.mark.parametrize("name,window", [("mistral", None), ("mistral", 5), ("qwen2", None)])
def test_merged_attention_wiring_exact_for_mistral_and_qwen2_on_cpu(monkeypatch, name, window):
    """The generic merged attention forward on Mistral (its config's sliding window) and Qwen2 (q/k/v
    with biases, merged too): logits and a cached decode step are eager's exactly."""
    cls, config_cls = {"mistral": ("MistralForCausalLM", "MistralConfig"), "qwen2": ("Qwen2ForCausalLM", "Qwen2Config")}[name]
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, vocab_size=101,
                                               sliding_window=window)
    config._attn_implementation = "sdpa"
    model = getattr(transformers, cls)(config)
    randomize_norm_weights(model)
    model.eval()
    ids = torch.randint(0, 101, (2, 13), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        expected = model(ids).logits
    expected_steps = prefill_then_decode(model, ids)
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    modeling = __import__("sys").modules[type(model.model.layers[0].self_attn).__module__]
    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)  # undone after the test
    report = inject(model, EAGER_TK)
    assert report.replaced["merged_qkv_rope"] == 2 and report.replaced["merged_gate_up_mlp"] == 2, report
    if name == "qwen2":
        assert model.model.layers[0].self_attn._tk_merged["qkv"].bias is not None
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
    for ours, eager in zip(prefill_then_decode(model, ids), expected_steps):
        torch.testing.assert_close(ours, eager, rtol=0, atol=0)


def test_merged_projections_keep_gradients_on_the_original_parameters(monkeypatch):
    """With gradients wanted the separate projections run: every parameter gets its gradient."""
    model = small_model("llama")
    ids = torch.randint(0, 101, (2, 9), generator=torch.Generator().manual_seed(4))
    reference = small_model("llama")
    reference(ids).logits.square().mean().backward()
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    kernels = CountingKernels(EAGER_TK)
    inject(model, kernels)
    model(ids).logits.square().mean().backward()
    assert "silu_and_mul" not in kernels.calls
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)


def test_merged_projections_state_dict_save_and_load(monkeypatch, tmp_path):
    """state_dict keys and values are the unmerged model's; save_pretrained/from_pretrained round-trips;
    load_state_dict (in place) updates the merged weight; .to() merges the converted weights again."""
    model = small_model("llama")
    keys = list(model.state_dict())
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    inject(model, EAGER_TK)
    assert list(model.state_dict()) == keys
    ids = torch.randint(0, 101, (1, 7), generator=torch.Generator().manual_seed(6))

    fresh = small_model("llama")
    with torch.no_grad():
        for p in fresh.parameters():
            p.add_(0.01)
    model.load_state_dict(fresh.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, fresh(ids).logits, rtol=0, atol=0)

    model.save_pretrained(tmp_path)
    loaded = getattr(transformers, CLASSES["llama"]).from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, fresh(ids).logits, rtol=0, atol=0)

    model.to(torch.float64)
    fresh.to(torch.float64)
    attn = model.model.layers[1].self_attn
    assert attn._tk_merged["qkv"].weight.dtype == torch.float64
    assert attn.q_proj.weight.untyped_storage().data_ptr() == attn._tk_merged["qkv"].weight.untyped_storage().data_ptr()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, fresh(ids).logits, rtol=0, atol=0)

    copy = __import__("copy").deepcopy(model)  # the copy's merges are its own
    copy.to(torch.float32)
    assert copy.model.layers[1].self_attn._tk_merged["qkv"].weight.dtype == torch.float32
    assert attn._tk_merged["qkv"].weight.dtype == torch.float64

    # a parameter replaced by assignment is noticed at the next eager call
    new = fresh.model.layers[1].self_attn.k_proj.weight.detach().clone() * 2
    attn.k_proj.weight = torch.nn.Parameter(new)
    fresh.model.layers[1].self_attn.k_proj.weight = torch.nn.Parameter(new.clone())
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, fresh(ids).logits, rtol=0, atol=0)


def test_merged_projections_follow_replaced_children_and_moved_data(monkeypatch):
    """What the per-call check notices: a child Linear replaced by another (merged again), one
    wrapped in another module (that merge turns off, the separate projections run), a weight's
    .data moved to new storage (merged again). The logits stay the eager model's."""
    import copy

    model, reference = small_model("llama"), small_model("llama")
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    inject(model, EAGER_TK)
    ids = torch.randint(0, 101, (2, 7), generator=torch.Generator().manual_seed(8))
    attn, ref_attn = model.model.layers[0].self_attn, reference.model.layers[0].self_attn

    def check():
        with torch.no_grad():
            torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=0, atol=0)

    torch.manual_seed(1)
    new = torch.nn.Linear(64, attn.k_proj.out_features, bias=False)
    ref_attn.k_proj, attn.k_proj = copy.deepcopy(new), new
    check()
    merged = attn._tk_merged["qkv"]
    assert merged.enabled and new.weight.untyped_storage().data_ptr() == merged.weight.untyped_storage().data_ptr()

    mlp, ref_mlp = model.model.layers[1].mlp, reference.model.layers[1].mlp
    mlp.up_proj, ref_mlp.up_proj = torch.nn.Sequential(mlp.up_proj), torch.nn.Sequential(ref_mlp.up_proj)
    check()
    assert not mlp._tk_merged["gate_up"].enabled

    moved = attn.q_proj.weight.detach().clone() * 3
    attn.q_proj.weight.data, ref_attn.q_proj.weight.data = moved, moved.clone()
    check()
    assert attn.q_proj.weight.untyped_storage().data_ptr() == merged.weight.untyped_storage().data_ptr()


def test_projections_that_cannot_merge_fall_to_the_unmerged_rules():
    model = small_model("llama")
    model.model.layers[0].self_attn.k_proj = torch.nn.Sequential(model.model.layers[0].self_attn.k_proj)  # a wrapper
    model.model.layers[1].mlp.up_proj.bias = torch.nn.Parameter(torch.zeros(160))
    report = inject(model, EAGER_TK)
    assert report.replaced == {"decoder_layer": 2, "merged_gate_up_mlp": 1, "mlp": 1, "rms_norm": 3,
                               "merged_qkv_rope": 1, "rope": 1}, report


def test_uninject_gives_merged_parameters_storage_of_their_own(monkeypatch):
    """uninject after merging: every projection parameter is the same object with storage of its
    own again (none shared, as before inject), holding its current values (here updated in place
    through the merge by load_state_dict), the merged weights are released, and the modules lose
    their merges and _apply wrappers (a later .to() converts plainly); injecting again merges again."""
    import gc
    import weakref

    model = small_model("llama")
    params = dict(model.named_parameters())
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    inject(model, EAGER_TK)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    merged = [weakref.ref(m.weight) for mod in (attn, mlp) for m in mod._tk_merged.values()]
    fresh = small_model("llama")
    with torch.no_grad():
        for p in fresh.parameters():
            p.add_(0.01)
    model.load_state_dict(fresh.state_dict())
    uninject(model)
    gc.collect()
    assert all(ref() is None for ref in merged), "a merged weight outlived uninject"
    assert dict(model.named_parameters()) == params  # the same objects
    pointers = [p.untyped_storage().data_ptr() for p in model.parameters()]
    assert len(set(pointers)) == len(pointers), "parameters still share a storage"
    for (name, p), q in zip(model.named_parameters(), fresh.parameters()):
        assert p.is_contiguous() and p.storage_offset() == 0 and p.untyped_storage().nbytes() == p.nbytes, name
        assert torch.equal(p, q), name
    assert not any("_tk_merged" in vars(m) or "_apply" in vars(m) for m in model.modules())
    ids = torch.randint(0, 101, (1, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, fresh(ids).logits, rtol=0, atol=0)
    model.to(torch.float64)
    assert attn.q_proj.weight.untyped_storage().data_ptr() != attn.k_proj.weight.untyped_storage().data_ptr()
    model.to(torch.float32)
    assert inject(model, EAGER_TK).replaced == REPLACED["llama"] and "qkv" in attn._tk_merged


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_injected_model_matches_eager_on_gpu(tk, name):
    model = small_model(name, torch.bfloat16, "cuda")
    ids = torch.randint(0, 101, (2, 33), device="cuda")
    expected = model(ids).logits.float()
    kernels = CountingKernels(tk)
    report = inject(model, kernels, strict=True)  # no fallback on the GPU
    assert report.replaced == REPLACED[name], report
    with torch.no_grad(), kernels.counting(model):  # inference: the merged projections run (strict)
        out = model(ids).logits.float()
    assert_every_kind_ran(report, kernels)
    assert ((out - expected).norm() / expected.norm()).item() < 1e-2
    generated = model.generate(ids[:, :5], max_new_tokens=4, do_sample=False)  # decode with a KV cache
    assert generated.shape == (2, 9)


@pytest.mark.gpu
@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_qwen3_fused_attention_matches_eager_on_gpu(tk, attn, merge):
    """The fused q/k norm + RoPE kernel in a Qwen3 model with Qwen3-8B's head layout (GQA 4:1,
    head_dim 128), on q/k/v from one GEMM or three: prefill and a cached decode step against the
    eager model, within bf16 tolerance."""
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
    rule = "merged_qkv_qk_norm_rope" if merge else "qk_norm_rope"  # the report names the attention's path
    assert inject(model, kernels, merge_projections=merge).replaced[rule] == 2
    for ours, eager in zip(prefill_then_decode(model, ids), expected):
        assert ((ours.float() - eager.float()).norm() / eager.float().norm()).item() < 1e-2
    assert kernels.calls["hf_qk_norm_rope"] == 4  # both layers, prefill and decode
    torch._dynamo.reset()
    with torch.no_grad():
        compiled = torch.compile(lambda ids: model(ids).logits, fullgraph=True)(ids)
        eager = model(ids).logits.float()
    # inductor recomputes the rest of the model (the cos/sin tables, residual adds): bf16-level differences
    assert ((compiled.float() - eager).norm() / eager.norm()).item() < 1e-2


def hub_function(host):
    """The function transformers marks for the Hub: kernels >= 0.18 has already wrapped it in a module
    whose forward takes (*args, **kwargs), holding the function in its closure."""
    if not isinstance(host, torch.nn.Module):
        return host
    forward = type(host).forward
    return dict(zip(forward.__code__.co_freevars, (c.cell_contents for c in forward.__closure__)))["func"]


def test_hub_layers_validate_against_transformers_layers(tk):
    """kernelize's own validation of each mapped layer against the class it replaces; for the hub
    function (RoPE), our layer's forward takes the function's parameters (names and kinds)."""
    import inspect

    from kernels.layer.layer import _validate_layer
    from transformers import activations
    from transformers.models.llama import modeling_llama

    from transformer_kernels_integrations.transformers_models import HUB_LAYERS, kernel_mapping

    hosts = {"RMSNorm": modeling_llama.LlamaRMSNorm, "SiLU": getattr(activations, "SiLUActivation", None),
             "GeluTanh": getattr(activations, "GELUTanh", None)}
    for hub_name, layer in HUB_LAYERS.items():
        if hosts.get(hub_name) is not None:  # older transformers lack some of the classes
            _validate_layer(check_cls=hosts[hub_name], cls=getattr(tk.layers, layer), repo=hub_name)
    rope = inspect.signature(hub_function(modeling_llama.apply_rotary_pos_emb)).parameters
    ours = list(inspect.signature(tk.layers.RotaryPosEmb.forward).parameters.values())[1:]  # without self
    assert [(p.name, p.kind, p.default) for p in ours] == [(p.name, p.kind, p.default) for p in rope.values()]
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


def test_transformers_maps_its_marked_layers_to_ours_on_cpu(tk, monkeypatch):
    """The pinned kernels is one the pinned transformers accepts, so its Hub mapping is on: it marks
    LlamaRMSNorm "RMSNorm" itself (no replace_kernel_forward_from_hub), our KernelConfig passes its
    sanitize_kernel_mapping, and create_compatible_mapping turns it into the kernels mapping of a CUDA
    model whose every entry loads our layer. (transformers refuses use_kernels=True for a model on the
    CPU; the forward is the GPU test's.)"""
    from kernels import Mode
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.utils import kernel_config as transformers_kernel_config

    from transformer_kernels_integrations.transformers_models import HUB_LAYERS, LLAMA_HUB_LAYERS, kernel_config

    why = transformers_takes_installed_kernels()
    assert why is None, f"requirements.txt pins a kernels transformers does not take: {why}"
    assert getattr(LlamaRMSNorm, "kernel_layer_name", None) == "RMSNorm"
    model = small_model("llama").eval()
    config = kernel_config()
    config.sanitize_kernel_mapping(model)
    monkeypatch.setattr(transformers_kernel_config, "infer_device", lambda model: "cuda")
    config.create_compatible_mapping(model)
    assert sorted(config.kernel_mapping) == sorted(LLAMA_HUB_LAYERS)
    for name, per_device in config.kernel_mapping.items():
        assert per_device["cuda"][Mode.INFERENCE].load() is getattr(tk.layers, HUB_LAYERS[name])


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
def test_kernelize_with_our_kernel_mapping_on_gpu(tk):
    """The README's kernelize snippet as written: transformers marks LlamaRMSNorm itself (the pinned
    kernels is one it accepts), kernelize with kernel_mapping(): every RMSNorm runs our op, logits
    within bf16 rounding of eager's."""
    from kernels import Mode, kernelize, use_kernel_mapping
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from transformer_kernels_integrations.transformers_models import kernel_mapping

    assert getattr(LlamaRMSNorm, "kernel_layer_name", None) == "RMSNorm", transformers_takes_installed_kernels()
    model = small_model("llama", torch.bfloat16, "cuda")
    ids = torch.randint(0, 101, (2, 33), device="cuda")
    with torch.no_grad():
        expected = model(ids).logits.float()
    with use_kernel_mapping(kernel_mapping()):
        model = kernelize(model, mode=Mode.INFERENCE, device="cuda")
    norms = [m for m in model.modules() if isinstance(m, LlamaRMSNorm)]
    assert norms and all(m.forward.__func__ is tk.layers.RMSNorm.forward for m in norms)
    with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = model(ids).logits.float()
    calls = {e.key: e.count for e in prof.key_averages()}
    assert calls.get(tk.add_op_namespace_prefix("rms_norm")) == len(norms), calls
    assert ((out - expected).norm() / expected.norm()).item() < 1e-2


GEMMA = {
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config"),
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig"),
}


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
@pytest.mark.parametrize("name", sorted(GEMMA))
def test_gemma_runs_our_norms_and_gated_mlp_and_keeps_its_attention(name, merge, monkeypatch):
    """Gemma 2 and 3: every RMSNorm (the (1 + weight) form, Gemma 3's per-head q/k norms too) through
    rms_norm with the fp32 offset weight, the GELU-tanh gated MLP through our gated unit (merged or
    not), the RoPE swap; the attention keeps transformers' forward (Gemma 2's soft-capped logits and
    Gemma 3's q/k norms are not in the merged attention forward, which dropped them: Gemma 3's logits
    were off by 0.28); the logits are eager's exactly on the CPU stand-ins."""
    model_cls, config_cls = GEMMA[name]
    if not hasattr(transformers, config_cls):
        pytest.skip(f"transformers {transformers.__version__} has no {config_cls}")
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                               vocab_size=101)
    model = getattr(transformers, model_cls)(config).to(torch.bfloat16).eval()
    randomize_norm_weights(model)
    ids = torch.randint(0, 101, (2, 9))
    with torch.no_grad():
        expected = model(ids).logits
    from eager_kernel import eager_kernel

    kernels = CountingKernels(eager_kernel())
    report = inject(model, kernels, merge_projections=merge)
    norms = 4 * 2 + 1 + (4 if name == "gemma3" else 0)  # four per layer, the final one, Gemma 3's q/k norms
    assert report.replaced == {"rope": 2, "gemma_rms_norm": norms,
                               ("merged_gate_up_mlp" if merge else "mlp"): 2}, report
    with torch.no_grad():
        assert torch.equal(model(ids).logits, expected)
    assert kernels.calls.get("rms_norm") == norms and kernels.calls.get(
        "gelu_tanh_and_mul" if merge else "act_mul") == 2, kernels.calls
    uninject(model)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(GEMMA))
def test_gemma_on_the_gpu_matches_eager(tk, name):
    """The real kernels in a tiny Gemma 2 / 3 (bf16, CUDA): the logits within bf16 rounding of eager's
    (relative L2 below 1 %), and each patched kind ran."""
    model_cls, config_cls = GEMMA[name]
    if not hasattr(transformers, config_cls):
        pytest.skip(f"transformers {transformers.__version__} has no {config_cls}")
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(hidden_size=256, intermediate_size=640, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                               vocab_size=1001)
    model = getattr(transformers, model_cls)(config).to("cuda", torch.bfloat16).eval()
    randomize_norm_weights(model)
    ids = torch.randint(0, 1001, (2, 33), device="cuda")
    with torch.no_grad():
        expected = model(ids).logits.float()
        kernels = CountingKernels(tk)
        report = inject(model, kernels)
        got = model(ids).logits.float()
    assert report.replaced.get("gemma_rms_norm") and report.replaced.get("merged_gate_up_mlp") == 2, report
    assert (got - expected).norm() / expected.norm() < 1e-2
    assert kernels.calls.get("rms_norm") and kernels.calls.get("gelu_tanh_and_mul") == 2, kernels.calls
    uninject(model)
