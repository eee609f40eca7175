"""transformers integration: inject() on Llama and Qwen3 models built from small configs.

On CPU the injected model runs with the eager reference code in place of the kernels and must give
exactly the original logits (the wiring); on the GPU the real kernels run."""

import inspect
from types import SimpleNamespace

import pytest
import torch

from helpers import EAGER_LAYERS, randomize_norm_weights
from reference.activations import eager_act_and_mul, eager_act_mul
from reference.norms import hf_fused_add_rms_norm
from reference.rope import hf_apply_rotary_pos_emb, hf_qk_norm_rope

transformers = pytest.importorskip("transformers")
from transformer_kernels_integrations import merging, transformers_models  # noqa: E402
from transformer_kernels_integrations.transformers_models import inject  # noqa: E402

EAGER_TK = SimpleNamespace(
    layers=EAGER_LAYERS,
    fused_add_rms_norm=lambda x, residual, w=None, eps=1e-6: hf_fused_add_rms_norm(x, residual, w, eps),
    act_mul=lambda gate, up, activation="silu": eager_act_mul(gate, up, activation),
    silu_and_mul=lambda x: eager_act_and_mul(x, "silu", True),
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


@pytest.fixture(autouse=True)
def restore_rotary_functions(monkeypatch):
    """inject() swaps apply_rotary_pos_emb in the modeling modules: undo it after each test, so
    that every test's eager model is transformers' own."""
    import importlib

    for name in CLASSES:
        modeling = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        monkeypatch.setattr(modeling, "apply_rotary_pos_emb", modeling.apply_rotary_pos_emb)


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


class CountingKernels:
    """The kernel module, counting the calls of each function (to see which path a forward took)."""

    def __init__(self, tk):
        self._tk, self.calls = tk, {}

    def __getattr__(self, name):
        attr = getattr(self._tk, name)
        if not callable(attr) or isinstance(attr, type) or name == "layers":
            return attr

        def counted(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return attr(*args, **kwargs)

        return counted


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_report(name, merge):
    model = small_model(name)
    report = inject(model, EAGER_TK, merge_projections=merge)
    assert report.replaced == (REPLACED if merge else REPLACED_UNMERGED)[name] and not report.left, report


def test_qwen3_attention_the_fused_rule_skips_falls_to_rope():
    model = small_model("qwen3")
    model.model.layers[0].self_attn.k_norm.variance_epsilon = 1e-5  # the op takes one eps for q and k
    report = inject(model, EAGER_TK)
    # layer 0: apply_rotary_pos_emb swapped, its q/k norms left to the RMSNorm rule
    assert report.replaced == {"decoder_layer": 2, "merged_gate_up_mlp": 2, "rms_norm": 5,
                               "merged_qkv_qk_norm_rope": 1, "rope": 1}, report
    assert not report.left, report


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_wiring_matches_eager_model_exactly_on_cpu(name):
    model = small_model(name)
    ids = torch.randint(0, 101, (2, 13), generator=torch.Generator().manual_seed(3))
    expected = model(ids).logits
    inject(model, EAGER_TK)
    torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)


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


def test_qwen3_fused_attention_keeps_transformers_code_for_cpu_tensors():
    model = small_model("qwen3")
    ids = torch.randint(0, 101, (2, 7), generator=torch.Generator().manual_seed(7))
    expected = model(ids).logits
    kernels = CountingKernels(EAGER_TK)
    inject(model, kernels)
    torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
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


def test_projections_that_cannot_merge_fall_to_the_unmerged_rules():
    model = small_model("llama")
    model.model.layers[0].self_attn.k_proj = torch.nn.Sequential(model.model.layers[0].self_attn.k_proj)  # a wrapper
    model.model.layers[1].mlp.up_proj.bias = torch.nn.Parameter(torch.zeros(160))
    report = inject(model, EAGER_TK)
    assert report.replaced == {"decoder_layer": 2, "merged_gate_up_mlp": 1, "mlp": 1, "rms_norm": 3,
                               "merged_qkv_rope": 1, "rope": 1}, report


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_injected_model_matches_eager_on_gpu(tk, name):
    model = small_model(name, torch.bfloat16, "cuda")
    ids = torch.randint(0, 101, (2, 33), device="cuda")
    expected = model(ids).logits.float()
    report = inject(model, tk)
    assert report.replaced == REPLACED[name], report
    out = model(ids).logits.float()
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
