"""transformers integration: inject() on Llama and Qwen3 models built from small configs.

On CPU the injected model runs with the eager reference code in place of the kernels and must give
exactly the original logits (the wiring); on the GPU the real kernels run."""

from types import SimpleNamespace

import pytest
import torch

from helpers import EAGER_LAYERS, randomize_norm_weights
from reference.activations import eager_act_mul
from reference.norms import hf_fused_add_rms_norm

transformers = pytest.importorskip("transformers")
from integrations.transformers_models import inject  # noqa: E402

EAGER_TK = SimpleNamespace(
    layers=EAGER_LAYERS,
    fused_add_rms_norm=lambda x, residual, w=None, eps=1e-6: hf_fused_add_rms_norm(x, residual, w, eps),
    act_mul=lambda gate, up, activation="silu": eager_act_mul(gate, up, activation),
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


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_report(tk, name):
    model = small_model(name)
    report = inject(model, tk)
    norms = 2 + 1 + (4 if name == "qwen3" else 0)  # input norms, the final norm, Qwen3's q/k norms
    assert report.replaced == {"decoder_layer": 2, "mlp": 2, "rms_norm": norms, "rope": 2}, report


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_wiring_matches_eager_model_exactly_on_cpu(name):
    model = small_model(name)
    ids = torch.randint(0, 101, (2, 13), generator=torch.Generator().manual_seed(3))
    expected = model(ids).logits
    inject(model, EAGER_TK)
    torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_injected_model_matches_eager_on_gpu(tk, name):
    model = small_model(name, torch.bfloat16, "cuda")
    ids = torch.randint(0, 101, (2, 33), device="cuda")
    expected = model(ids).logits.float()
    report = inject(model, tk)
    assert report.replaced["rope"] == 2
    out = model(ids).logits.float()
    assert ((out - expected).norm() / expected.norm()).item() < 1e-2
    generated = model.generate(ids[:, :5], max_new_tokens=4, do_sample=False)  # decode with a KV cache
    assert generated.shape == (2, 9)


def test_hub_layers_validate_against_transformers_layers(tk):
    """kernelize's own validation of each mapped layer against the class (or function) it replaces."""
    from kernels.layer.layer import _create_func_module, _validate_layer
    from transformers import activations
    from transformers.models.llama import modeling_llama

    from integrations.transformers_models import HUB_LAYERS, kernel_mapping

    hosts = {"RMSNorm": modeling_llama.LlamaRMSNorm, "SiLU": getattr(activations, "SiLUActivation", None),
             "GeluTanh": getattr(activations, "GELUTanh", None),
             "rotary_pos_emb": _create_func_module(modeling_llama.apply_rotary_pos_emb)}
    for hub_name, layer in HUB_LAYERS.items():
        if hosts[hub_name] is not None:  # older transformers lack some of the classes
            _validate_layer(check_cls=hosts[hub_name], cls=getattr(tk.layers, layer), repo=hub_name)
    assert set(kernel_mapping()) == set(HUB_LAYERS)
