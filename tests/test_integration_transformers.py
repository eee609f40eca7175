"""transformers integration: inject() on Llama and Qwen3 models built from small configs.

On CPU the injected model runs with the eager reference code in place of the kernels and must give
exactly the original logits (the wiring); on the GPU the real kernels run."""

import inspect
from types import SimpleNamespace

import pytest
import torch

from helpers import EAGER_LAYERS, randomize_norm_weights
from reference.activations import eager_act_mul
from reference.norms import hf_fused_add_rms_norm
from reference.rope import hf_apply_rotary_pos_emb, hf_qk_norm_rope

transformers = pytest.importorskip("transformers")
from transformer_kernels_integrations import transformers_models  # noqa: E402
from transformer_kernels_integrations.transformers_models import inject  # noqa: E402

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


# what inject() replaces in each small model: Qwen3's attention fuses its q/k norms with the rotation
REPLACED = {
    "llama": {"decoder_layer": 2, "mlp": 2, "rms_norm": 3, "rope": 2},  # input norms and the final norm
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
def test_report(tk, name):
    model = small_model(name)
    report = inject(model, tk)
    assert report.replaced == REPLACED[name] and not report.left, report


def test_qwen3_attention_the_fused_rule_skips_falls_to_rope(tk):
    model = small_model("qwen3")
    model.model.layers[0].self_attn.k_norm.variance_epsilon = 1e-5  # the op takes one eps for q and k
    report = inject(model, tk)
    # layer 0: apply_rotary_pos_emb swapped, its q/k norms left to the RMSNorm rule
    assert report.replaced == {"decoder_layer": 2, "mlp": 2, "rms_norm": 5, "qk_norm_rope": 1, "rope": 1}, report
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
    inject(model, kernels)
    torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
    assert "hf_qk_norm_rope" not in kernels.calls


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
