"""Training through the integrations: inject() on a model in training mode takes only the ops that
have a backward, and a causal LM called with labels computes its loss with the fused linear
cross-entropy. On CPU the patched forwards run with the eager references standing in for the
CUDA-only ops (the fused linear cross-entropy runs its own CPU path): the loss and every gradient
must be the original model's. The GPU runs (tiny models trained for a few hundred steps against
eager) are in tests/integration/test_training_models.py."""

import copy
from types import SimpleNamespace

import pytest
import torch

from helpers import EAGER_LAYERS, randomize_norm_weights
from integration_helpers import CudaOnlyKernels
from reference.activations import eager_act_mul
from reference.rope import hf_apply_rotary_pos_emb

transformers = pytest.importorskip("transformers")
from transformer_kernels_integrations import transformers_models  # noqa: E402

LLAMA = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=101)


def stand_in(tk, has_backward=None):
    """The kernel API on CPU: eager references for the CUDA-only ops (test_integration_transformers'
    EAGER_TK), the build's own fused linear cross-entropy (it has a CPU path) and has_backward (the
    build's, or the one given)."""
    from test_integration_transformers import EAGER_TK

    return SimpleNamespace(**vars(EAGER_TK), has_backward=has_backward or tk.has_backward,
                           fused_linear_cross_entropy=tk.fused_linear_cross_entropy)


def small_llama(seed=0, **overrides):
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**LLAMA, **overrides}))
    randomize_norm_weights(model)
    return model.train()


def batch(seed=3, B=3, S=17, vocab=101):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (B, S), generator=g)
    labels = ids.clone()
    labels[0, :5] = -100  # a prompt that is not trained on
    return ids, labels


def test_training_report_takes_only_ops_with_a_backward(tk):
    """In training, the inference table's rules whose ops have a backward, and the loss rule; a rule
    whose op has none is left with the reason (here a build where the norms' have none)."""
    inference = transformers_models.inject(small_llama().eval(), tk)
    assert "causal_lm_loss" not in inference.replaced
    report = transformers_models.inject(small_llama(), tk)
    assert all(tk.has_backward(op) for rule in transformers_models.TABLE.all_rules for op in rule.needs_backward)
    assert report.replaced == {**inference.replaced, "causal_lm_loss": 1} and not report.left, report
    no_norm_backward = stand_in(tk, has_backward=lambda op: tk.has_backward(op) and "rms_norm" not in op)
    report = transformers_models.inject(small_llama(), no_norm_backward)
    assert "decoder_layer" not in report.replaced and "rms_norm" not in report.replaced, report
    assert {"causal_lm_loss", "merged_qkv_rope", "merged_gate_up_mlp"} <= set(report.replaced), report
    assert report.left and all(why == "training: rms_norm has no backward yet" or
                               why == "training: fused_add_rms_norm has no backward yet"
                               for why in report.left.values()), report


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("num_items", [False, True], ids=["mean", "num_items_in_batch"])
def test_training_wiring_loss_and_gradients_match_eager_on_cpu(tk, monkeypatch, num_items):
    eager = small_llama()
    ours = copy.deepcopy(eager)
    ids, labels = batch()
    kwargs = dict(num_items_in_batch=torch.tensor(40)) if num_items else {}
    out = eager(ids, labels=labels, **kwargs)
    out.loss.backward()
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    report = transformers_models.inject(ours, stand_in(tk))
    assert report.replaced["causal_lm_loss"] == 1 and report.replaced["decoder_layer"] == 2
    mine = ours(ids, labels=labels, **kwargs)
    assert mine.logits is None  # never materialized
    torch.testing.assert_close(mine.loss, out.loss, rtol=1e-6, atol=1e-6)
    mine.loss.backward()
    expected, got = grads(eager), grads(ours)
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)
    # eval mode, or no labels: transformers' own forward with its logits
    ours.eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, labels=labels).logits, eager.eval()(ids, labels=labels).logits)


def test_a_cpu_model_runs_transformers_code_in_every_patched_forward(tk):
    """KERNEL_DEVICES is the GPU's: a CPU model injected with a kernel that refuses CPU tensors (as
    the CUDA build does) trains exactly as eager, merged projections or not: every patched forward
    (decoder layers, norms, attention and its rotation, MLP, the loss) runs transformers' code,
    counted, and none calls the kernel."""
    ids, labels = batch()
    for merge in (True, False):
        eager = small_llama()
        ours = copy.deepcopy(eager)
        eager(ids, labels=labels).loss.backward()
        report = transformers_models.inject(ours, CudaOnlyKernels(stand_in(tk)), merge_projections=merge)
        out = ours(ids, labels=labels)
        torch.testing.assert_close(out.loss, eager(ids, labels=labels).loss, rtol=0, atol=0)
        out.loss.backward()
        for name, g in grads(eager).items():
            torch.testing.assert_close(grads(ours)[name], g, rtol=0, atol=0, msg=name)
        assert set(report.replaced) <= set(report.fallbacks_taken), report  # (merged: and the swapped rope)


def test_a_later_injection_is_not_served_by_an_earlier_one_s_kernel(tk, monkeypatch):
    """The H200 run's failure of this file's CPU tests: a GPU test had left a Llama injected with
    the CUDA build, whose process-wide apply_rotary_pos_emb swap then ran for the models these tests
    inject with the CPU stand-ins (KERNEL_DEVICES widened): the CUDA kernel, on CPU tensors. The swap
    runs the latest injection's replacement, not the first's."""
    left_injected = small_llama()
    transformers_models.inject(left_injected, CudaOnlyKernels(stand_in(tk)))  # never uninjected
    eager = small_llama()
    ours = copy.deepcopy(eager)
    ids, labels = batch()
    expected = eager(ids, labels=labels).loss  # the swap falls back for CPU tensors: transformers' RoPE
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    transformers_models.inject(ours, stand_in(tk))
    torch.testing.assert_close(ours(ids, labels=labels).loss, expected, rtol=1e-6, atol=1e-6)
    transformers_models.uninject(ours)  # the earlier injection's replacement runs again
    from transformers.models.llama import modeling_llama

    q, cos = torch.randn(1, 4, 3, 16), torch.randn(1, 3, 16)
    with pytest.raises(ValueError, match="apply_rotary_pos_emb: tensors must be CUDA tensors"):
        modeling_llama.apply_rotary_pos_emb(q, q, cos, cos)


def test_training_steps_track_eager_on_cpu(tk, monkeypatch):
    """30 AdamW steps of a tiny Llama, fp32: the injected model's losses are eager's."""
    eager = small_llama(seed=1)
    ours = copy.deepcopy(eager)
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    transformers_models.inject(ours, stand_in(tk))
    opts = [torch.optim.AdamW(m.parameters(), lr=3e-3) for m in (eager, ours)]
    ids, labels = batch(seed=5, B=4, S=24)
    curves = [[], []]
    for _ in range(30):
        for model, opt, curve in zip((eager, ours), opts, curves):
            opt.zero_grad()
            loss = model(ids, labels=labels).loss
            loss.backward()
            opt.step()
            curve.append(loss.item())
    assert curves[0][-1] < 0.5 * curves[0][0], "the memorization task did not train"
    torch.testing.assert_close(torch.tensor(curves[1]), torch.tensor(curves[0]), rtol=1e-4, atol=1e-4)


def test_tied_embeddings_and_softcap_config(tk, monkeypatch):
    """A tied lm_head gets its gradient through both uses; a final_logit_softcapping config is applied."""
    eager = small_llama(seed=2, tie_word_embeddings=True)
    eager.config.final_logit_softcapping = None
    ours = copy.deepcopy(eager)
    ids, labels = batch(seed=7)
    eager(ids, labels=labels).loss.backward()
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    transformers_models.inject(ours, stand_in(tk))
    ours(ids, labels=labels).loss.backward()
    torch.testing.assert_close(grads(ours)["model.embed_tokens.weight"], grads(eager)["model.embed_tokens.weight"],
                               rtol=1e-5, atol=1e-6)
    ours.config.final_logit_softcapping = 2.0
    capped = ours(ids, labels=labels).loss
    hidden = ours.model(ids).last_hidden_state
    logits = torch.tanh(ours.lm_head(hidden) / 2.0) * 2.0
    shift = torch.nn.functional.pad(labels, (0, 1), value=-100)[..., 1:]
    ref = torch.nn.functional.cross_entropy(logits.view(-1, 101), shift.reshape(-1))
    torch.testing.assert_close(capped, ref, rtol=1e-5, atol=1e-6)


def test_builds_without_backward_inject_nothing_in_training(tk):
    old_build = SimpleNamespace(**{k: getattr(tk, k) for k in ("layers", "act_mul", "apply_rotary_pos_emb",
                                                               "fused_add_rms_norm", "silu_and_mul")})
    report = transformers_models.inject(small_llama(), old_build)
    assert not report.replaced and all("no backward" in why for why in report.left.values())


def test_layer_flags_follow_the_ops(tk):
    """A Hub layer declares has_backward exactly when every op it calls has one (kernelize's
    Mode.TRAINING then picks it)."""
    layer_ops = {"RMSNorm": ["rms_norm"], "LayerNorm": ["layer_norm"], "Silu": ["activation"],
                 "Gelu": ["activation"], "GeluTanh": ["activation"], "SiluAndMul": ["act_and_mul"],
                 "GeluAndMul": ["act_and_mul"], "GeluTanhAndMul": ["act_and_mul"], "RotaryPosEmb": ["hf_rope"],
                 "GroupNorm": ["group_norm"]}
    assert set(layer_ops) == set(tk.layers.__all__)
    for name, ops in layer_ops.items():
        assert getattr(tk.layers, name).has_backward == all(tk.has_backward(op) for op in ops), name


# ---- diffusers ----

def diffusers_stand_in(tk):
    from test_integration_diffusers import EAGER_TK

    return SimpleNamespace(**vars(EAGER_TK), has_backward=tk.has_backward)


def test_diffusers_training_report_and_gradients_on_cpu(tk):
    """A small LTX-Video transformer in training mode: the rules with a backward are applied (the
    attention's rotation from coordinates, its q/k norms where they have a backward, the GELU FFN,
    the blocks' modulations), and the loss's gradients are the original model's exactly. The
    stand-ins are eager code: linear_gelu's epilogue is turned off (it rounds once, not twice)."""
    pytest.importorskip("diffusers")
    from test_integration_diffusers import ltx_inputs, small_ltx

    from transformer_kernels_integrations import diffusers_models

    eager = small_ltx().train()
    ours = copy.deepcopy(eager)
    inputs = ltx_inputs()
    target = torch.randn(2, 72, 8, generator=torch.Generator().manual_seed(4))
    torch.nn.functional.mse_loss(eager(**inputs)[0], target).backward()
    report = diffusers_models.inject(ours, diffusers_stand_in(tk), linear_gelu=False)
    for rule in diffusers_models.RULES:
        if rule.kind in report.replaced:
            assert all(tk.has_backward(op) for op in rule.needs_backward), rule.kind
    assert {"gelu", "ltx_attention", "ltx_rope_coords", "ltx_block"} <= set(report.replaced), report
    for why in report.left.values():
        assert why.startswith("training: "), why
    torch.nn.functional.mse_loss(ours(**inputs)[0], target).backward()
    expected, got = grads(eager), grads(ours)
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0, msg=name)


def test_diffusers_inference_injection_unchanged_by_training_rules(tk):
    pytest.importorskip("diffusers")
    from test_integration_diffusers import small_ltx

    from transformer_kernels_integrations import diffusers_models

    eval_report = diffusers_models.inject(small_ltx(), tk)  # small_ltx is in eval mode
    assert "ltx_block" in eval_report.replaced
    train_report = diffusers_models.inject(small_ltx().train(), tk)
    assert train_report.replaced == eval_report.replaced  # every op of the table has a backward now



def test_kernelize_training_mode_takes_layers_with_a_backward(tk, monkeypatch):
    """kernelize(mode=Mode.TRAINING): a layer with a backward (SiLU) is installed, one without falls
    back to the module's own forward (or is refused without a fallback)."""
    from kernels import LayerRepository, Mode, kernelize, use_kernel_forward_from_hub, use_kernel_mapping

    from conftest import REPO_ID

    if not torch.cuda.is_available():  # kernelize(device="cuda") reads the capability; stand in for it
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args, **kwargs: (9, 0))

    @use_kernel_forward_from_hub("SiLU")
    class SiLU(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.silu(x)

    @use_kernel_forward_from_hub("RMSNorm")
    class RMSNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(8))
            self.variance_epsilon = 1e-6

        def forward(self, hidden_states):
            return hidden_states * self.weight

    mapping = {name: {"cuda": LayerRepository(repo_id=REPO_ID, layer_name=layer, revision="v1")}
               for name, layer in (("SiLU", "Silu"), ("RMSNorm", "RMSNorm"))}
    silu, norm = SiLU(), RMSNorm()
    with use_kernel_mapping(mapping, inherit_mapping=False):
        kernelize(silu, mode=Mode.TRAINING, device="cuda")
        kernelize(norm, mode=Mode.TRAINING, device="cuda")
    assert silu.forward.__func__.__module__ == tk.layers.__name__
    assert (norm.forward.__func__.__module__ == tk.layers.__name__) == tk.layers.RMSNorm.has_backward


def test_training_forward_compiles_fullgraph_on_cpu(tk, monkeypatch):
    """The patched causal LM forward with the fused linear cross-entropy traces forward and backward
    with no graph break (aot_eager: the reference stand-ins and the CPU path run the graph)."""
    model = small_llama(seed=4)
    ids, labels = batch(seed=9)
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    transformers_models.inject(model, stand_in(tk))
    expected = model(ids, labels=labels).loss
    (expected_grad,) = torch.autograd.grad(expected, model.lm_head.weight)
    torch._dynamo.reset()
    compiled = torch.compile(lambda ids, labels: model(input_ids=ids, labels=labels).loss, fullgraph=True,
                             backend="aot_eager")
    loss = compiled(ids, labels)
    (grad,) = torch.autograd.grad(loss, model.lm_head.weight)
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-6)


# ---- the switch, uninject, and strict=True in training ----

def test_fused_linear_cross_entropy_switch_and_uninject(tk, monkeypatch):
    """``fused_linear_cross_entropy=False`` leaves the causal LM's loss to transformers (reported as
    switched off, the logits returned); uninject restores the forward the loss rule replaced."""
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    ids, labels = batch()
    model = small_llama()
    report = transformers_models.inject(model, stand_in(tk), fused_linear_cross_entropy=False)
    assert report.training and "causal_lm_loss" not in report.replaced, report
    assert report.switches["fused_linear_cross_entropy"] is False and "switched off: fused_linear_cross_entropy" in str(report)
    assert "causal_lm_loss: fused_linear_cross_entropy=False" in report.skipped["LlamaForCausalLM"], report
    assert model(ids, labels=labels).logits is not None
    transformers_models.uninject(model)
    report = transformers_models.inject(model, stand_in(tk))
    assert report.replaced["causal_lm_loss"] == 1 and "training: only the rules whose ops have a backward" in str(report)
    assert "forward" in vars(model) and model(ids, labels=labels).logits is None
    transformers_models.uninject(model)
    assert "forward" not in vars(model) and model(ids, labels=labels).logits is not None


def test_training_falls_back_to_separate_projections_and_counts_it(tk, monkeypatch):
    """Without strict, training keeps the merged rules: under grad they run the separate projections,
    a fallback counted in the report; the gradients are eager's all the same."""
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    eager = small_llama(seed=6)
    ours = copy.deepcopy(eager)
    ids, labels = batch(seed=11)
    eager(ids, labels=labels).loss.backward()
    report = transformers_models.inject(ours, stand_in(tk))
    assert {"merged_qkv_rope", "merged_gate_up_mlp"} <= set(report.replaced)
    ours(ids, labels=labels).loss.backward()
    assert report.fallbacks_taken == {"merged_qkv_rope": 2, "merged_gate_up_mlp": 2}, report
    expected, got = grads(eager), grads(ours)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)


def test_training_with_strict_takes_the_unmerged_rules_and_does_not_raise(tk, monkeypatch):
    """strict=True in training: the merged-projection rules are skipped (their GEMM never runs under
    grad, so each step would raise), the unmerged rules take those modules, a training step raises
    nothing and falls back nowhere, and the loss and gradients are eager's. A model injected for
    inference and then trained under strict still raises (test_integration_transformers)."""
    from transformer_kernels_integrations.patching import KernelFallbackError

    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    eager = small_llama(seed=8)
    ours = copy.deepcopy(eager)
    ids, labels = batch(seed=13)
    out = eager(ids, labels=labels)
    out.loss.backward()
    report = transformers_models.inject(ours, stand_in(tk), strict=True)
    assert report.replaced == {"causal_lm_loss": 1, "decoder_layer": 2, "mlp": 2, "rope": 2, "rms_norm": 3}, report
    assert not report.skipped, report
    loss = ours(ids, labels=labels).loss
    loss.backward()
    assert not report.fallbacks_taken, report
    torch.testing.assert_close(loss, out.loss, rtol=1e-6, atol=1e-6)
    expected, got = grads(eager), grads(ours)
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)
    # strict still raises where the kernel path is left: CPU tensors without the stand-in device
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cuda",))
    with pytest.raises(KernelFallbackError, match="runs the library's own code: tensors on cpu"):
        ours(ids, labels=labels)


@pytest.mark.usefixtures("stand_ins_take_cpu_tensors")
def test_diffusers_training_with_strict_skips_the_merges(tk):
    pytest.importorskip("diffusers")
    from test_integration_diffusers import ltx_inputs, small_ltx

    from transformer_kernels_integrations import diffusers_models

    eager = small_ltx().train()
    ours = copy.deepcopy(eager)
    inputs = ltx_inputs()
    target = torch.randn(2, 72, 8, generator=torch.Generator().manual_seed(5))
    torch.nn.functional.mse_loss(eager(**inputs)[0], target).backward()
    lenient = diffusers_models.inject(copy.deepcopy(eager), diffusers_stand_in(tk), linear_gelu=False)
    assert "ltx_merged_projections" in lenient.replaced, lenient
    report = diffusers_models.inject(ours, diffusers_stand_in(tk), strict=True, linear_gelu=False)
    assert report.training and "ltx_merged_projections" not in report.replaced, report
    assert {k: v for k, v in report.replaced.items()} == {k: v for k, v in lenient.replaced.items()
                                                           if k != "ltx_merged_projections"}
    torch.nn.functional.mse_loss(ours(**inputs)[0], target).backward()  # no KernelFallbackError
    assert not report.fallbacks_taken, report
    expected, got = grads(eager), grads(ours)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0, msg=name)
