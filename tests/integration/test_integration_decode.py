"""The decode steps' GEMMs (issue 44): the injected Llama-family models run ``decode_linear`` where a call
has few rows (the decode pass for 16-bit weights, ``decode.py``; the FP8 pass's weight-only layers,
``inject(fp8=True, fp8_weights_only=True)``) and ``F.linear`` otherwise.

On the CPU the eager stand-ins run (tests/gemm/gemm_eager.py: decode_linear is the GEMM of the
dequantized operands in fp32, rounded once): which GEMM each call runs, at and past the thresholds;
the weight-only layers' outputs against float64 references (of the codes, and of the 16-bit weights
within e4m3's error); the 16-bit weights gone; the report; uninject; torch.compile(fullgraph). On the GPU
the same layer checks with the real kernel, and the memory the weight-only layers free. The captured
decode step: test_decode_graphs.py."""

import copy
import gc
import logging
import types

import pytest
import torch
import torch.nn.functional as F

from conftest import FULL_CHECKOUT
from eager_kernel import eager_kernel
from integration_helpers import CountingKernels

if not FULL_CHECKOUT:
    pytest.skip("reference/ is not in this source set", allow_module_level=True)

transformers = pytest.importorskip("transformers")
from test_integration_transformers import small_model  # noqa: E402
from transformer_kernels_integrations import KernelFallbackError, decode, fp8, merging, transformers_models  # noqa: E402
from transformer_kernels_integrations.transformers_models import inject, uninject  # noqa: E402

E4M3 = torch.float8_e4m3fn
PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj")
LLAMA_LAYERS = [f"model.layers.{i}.{p}" for i in range(2) for p in PROJECTIONS]
# the GEMMs of a decoder layer: merged (q/k/v, o, gate/up, down) or not (the seven projections)
GEMMS = {True: ["self_attn.qkv", "self_attn.o_proj", "mlp.gate_up", "mlp.down_proj"], False: list(PROJECTIONS)}


@pytest.fixture
def small_widths(monkeypatch):
    """The small models' 64-wide layers count as large for both passes (the thresholds' rows stay)."""
    monkeypatch.setattr(decode, "BF16_MIN_OUT_FEATURES", 16)
    monkeypatch.setattr(fp8, "FP8_MIN_FEATURES", 16)


@pytest.fixture
def on_cpu(monkeypatch, small_widths):
    """The stand-ins take CPU tensors: the transformers table's devices include the CPU."""
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))


def llama(dtype=torch.bfloat16, device="cpu", name="llama"):
    return small_model(name, dtype, device)


def qwen2(dtype=torch.bfloat16, device="cpu"):
    """A Qwen2: q/k/v with a bias."""
    torch.manual_seed(0)
    config = transformers.Qwen2Config(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=101)
    return transformers.Qwen2ForCausalLM(config).to(device, dtype).eval()


IDS = torch.randint(0, 101, (2, 9), generator=torch.Generator().manual_seed(3))


def rows_input(rows, width, dtype=torch.bfloat16, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, width, generator=g).to(device, dtype)


# ---- 16-bit weights: the decode pass ----

@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_the_decode_pass_reports_its_gemms(on_cpu, merge):
    model = llama()
    report = inject(model, eager_kernel(), merge_projections=merge)
    gemms = [f"model.layers.{i}.{g}" for i in range(2) for g in GEMMS[merge]]
    assert sorted(report.decode_linear_gemms) == sorted(gemms), report.decode_linear_gemms
    assert report.replaced["decode_linear"] == len(gemms) and report.ops["decode_linear"] == ("decode_linear",)
    assert (f"decode_linear: {len(gemms)} GEMMs with 16-bit weights run decode_linear at <= 1 row(s) (at least 16 "
            "outputs), F.linear otherwise") in str(report).splitlines()
    assert "decode_linear" not in report.fallbacks  # F.linear for more rows is the designed path


def test_by_default_the_gemms_of_llama_3_1_8b_s_shapes_take_it_and_narrow_ones_not():
    """The default thresholds on Llama-3.1-8B's shapes (a model on the meta device: its projections
    cannot merge there): q (4096 outputs), o, gate, up and down qualify; k and v (1024) do not."""
    config = transformers.LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=2,
                                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    report = inject(model, eager_kernel())
    expected = [f"model.layers.{i}.{p}" for i in range(2) for p in PROJECTIONS if p not in ("self_attn.k_proj",
                                                                                             "self_attn.v_proj")]
    assert report.decode_linear_gemms == expected
    assert decode.BF16_MAX_ROWS == 1 and decode.BF16_MIN_OUT_FEATURES == 4096 and decode.FP8_MAX_ROWS == 8


@pytest.mark.parametrize("max_rows", [1, 4])
@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_decode_linear_runs_at_or_below_the_threshold_and_f_linear_above(on_cpu, monkeypatch, merge, max_rows):
    """Each GEMM of the decoder layers: decode_linear for 1 to BF16_MAX_ROWS rows (the one place the
    threshold is read, at each call), F.linear for more; the outputs are F.linear's within bf16
    rounding (the stand-in rounds once)."""
    monkeypatch.setattr(decode, "BF16_MAX_ROWS", max_rows)
    model = llama()
    kernels = CountingKernels(eager_kernel())
    inject(model, kernels, merge_projections=merge)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    gemms = [(merging.merged_of(attn, "qkv") if merge else attn.q_proj), attn.o_proj,
             (merging.merged_of(mlp, "gate_up") if merge else mlp.up_proj), mlp.down_proj]
    for gemm in gemms:
        weight, bias = gemm.weight, gemm.bias
        for rows in (1, max_rows, max_rows + 1, 9):
            x = rows_input(rows, weight.shape[1])
            kernels.calls.clear()
            with torch.no_grad():
                out = gemm(x)
            assert kernels.calls.get("decode_linear", 0) == (rows <= max_rows), (gemm, rows, kernels.calls)
            torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=2**-7, atol=1e-3)


def test_a_decode_step_runs_every_gemm_through_decode_linear_and_a_prefill_none(on_cpu):
    model = llama()
    expected = llama()
    kernels = CountingKernels(eager_kernel())
    inject(model, kernels)
    with torch.no_grad():
        kernels.calls.clear()
        prefill = model(IDS[:1]).logits
        assert "decode_linear" not in kernels.calls, kernels.calls
        step = model(IDS[:1, :1]).logits  # one token: the shape of a batch-1 decode step
        assert kernels.calls["decode_linear"] == 8, kernels.calls  # 4 GEMMs a layer, 2 layers
        torch.testing.assert_close(step, expected(IDS[:1, :1]).logits, rtol=0.02, atol=0.02)
        assert torch.equal(prefill, expected(IDS[:1]).logits)  # prefill: F.linear, eager's bits


def test_where_gradients_are_wanted_or_tensors_are_elsewhere_f_linear_runs_without_a_fallback(
        on_cpu, monkeypatch, caplog):
    """decode_linear has no backward: under grad the GEMMs run F.linear, as off the kernel devices; not a
    fallback (nothing logged, strict=True does not raise)."""
    model = llama()
    kernels = CountingKernels(eager_kernel())
    report = inject(model, kernels, strict=True)
    o_proj = model.model.layers[0].self_attn.o_proj
    x = rows_input(1, 64)
    with caplog.at_level(logging.WARNING, logger="transformer_kernels_integrations"):
        assert torch.equal(o_proj(x), F.linear(x, o_proj.weight))  # grad mode, weights that require grad
        monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cuda",))
        with torch.no_grad():
            assert torch.equal(o_proj(x), F.linear(x, o_proj.weight))
    assert "decode_linear" not in kernels.calls and not caplog.records and not report.fallbacks_taken


def test_rows_not_one_aligned_stride_apart_run_f_linear(on_cpu):
    model = llama()
    kernels = CountingKernels(eager_kernel())
    inject(model, kernels)
    o_proj = model.model.layers[0].self_attn.o_proj
    x = rows_input(1, 72)[:, 1:65]  # 2 bytes past a 16-byte boundary
    with torch.no_grad():
        assert torch.equal(o_proj(x), F.linear(x, o_proj.weight))
        assert "decode_linear" not in kernels.calls, kernels.calls
        o_proj(x.clone())
    assert kernels.calls["decode_linear"] == 1


def test_decode_linear_false_turns_the_pass_off_and_uninject_undoes_it(on_cpu):
    model = llama()
    kernels = CountingKernels(eager_kernel())
    report = inject(model, kernels, decode_linear=False)
    assert "decode_linear" not in report.replaced and report.decode_linear_gemms == []
    with torch.no_grad():
        model(IDS[:1, :1])
    assert "decode_linear" not in kernels.calls
    uninject(model)
    inject(model, kernels)
    uninject(model)
    attn = model.model.layers[0].self_attn
    assert all("forward" not in vars(m) for m in model.modules())
    assert "_tk_merged" not in vars(attn)
    with pytest.raises(TypeError, match="inject: decode_linear takes True or False, got 'no'"):
        inject(model, kernels, decode_linear="no")


def test_a_kernel_build_without_decode_linear_injects_without_it(on_cpu, caplog):
    """An older build: the pass, on by default, is left out with a warning; asked for, it is refused."""
    tk = eager_kernel()
    old_build = types.SimpleNamespace(**{k: getattr(tk, k) for k in dir(tk) if k != "decode_linear"
                                         and not k.startswith("_")})
    model = llama()
    with caplog.at_level(logging.WARNING, logger="transformer_kernels_integrations"):
        report = inject(model, old_build)
    assert "decode_linear" not in report.replaced and report.replaced["decoder_layer"] == 2
    assert any("decode_linear is left out: this kernel build lacks decode_linear" in r.getMessage()
               for r in caplog.records)
    uninject(model)
    with pytest.raises(ValueError, match="inject: decode_linear=True needs the kernel's decode_linear"):
        inject(model, old_build, decode_linear=True)


def graph_recorder(graphs):
    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return backend


def traced_ops(graphs) -> str:
    return " ".join(str(node.target) for gm in graphs for node in gm.graph.nodes)


@pytest.mark.parametrize("weights_only", [False, True], ids=["bf16", "fp8_weights"])
def test_a_decode_step_traces_whole_with_decode_linear_in_the_graph(on_cpu, weights_only):
    """torch.compile(fullgraph=True) of a decode-shaped call (one token a row): the choice is made at
    trace time, decode_linear is in the graph (a custom op with a fake: no break), and the compiled
    logits are the eager ones."""
    model = llama()
    inject(model, eager_kernel(), **(dict(fp8=True, fp8_weights_only=True) if weights_only else {}))
    ids = IDS[:2 if weights_only else 1, :1]
    torch._dynamo.reset()
    graphs = []
    with torch.no_grad():
        expected = model(ids, use_cache=False).logits
        compiled = torch.compile(lambda i: model(i, use_cache=False).logits, backend=graph_recorder(graphs),
                                 fullgraph=True)(ids)
    assert torch.equal(compiled, expected)
    assert traced_ops(graphs).count("decode_linear") == 8, traced_ops(graphs)
    torch._dynamo.reset()


# ---- FP8 weights (weight-only) ----

def reference_dequantized(model, paths):
    """A copy of the (uninjected) model whose `paths` layers hold their weights as the weight-only
    layers dequantize them (quantize_fp8's codes times scales, rounded once to bf16)."""
    ref = copy.deepcopy(model)
    modules = dict(ref.named_modules())
    from reference.fp8 import quantize_fp8_rowwise

    with torch.no_grad():
        for path in paths:
            linear = modules[path]
            codes, scale = quantize_fp8_rowwise(linear.weight)
            linear.weight.copy_(fp8.dequantize(codes, scale, linear.weight.dtype))
    return ref


def weight_only_layers(model):
    return [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.dtype == E4M3]


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_weight_only_layers_are_reported(on_cpu, merge):
    model = llama()
    modules = dict(model.named_modules())
    bf16_bytes = sum(modules[p].weight.nbytes for p in LLAMA_LAYERS)
    report = inject(model, eager_kernel(), fp8=True, fp8_weights_only=True, merge_projections=merge)
    assert report.fp8_layers == LLAMA_LAYERS
    assert report.replaced["fp8_weight_only"] == len(LLAMA_LAYERS) and "fp8_linear" not in report.replaced
    assert report.ops["fp8_weight_only"] == ("quantize_fp8", "decode_linear")
    assert "decode_linear" not in report.replaced  # every GEMM of the layers is weight-only: the decode pass has none
    weight_bytes = sum(modules[p].out_features * (modules[p].in_features + 4) for p in LLAMA_LAYERS)
    assert report.extras["fp8"] == {"layers": LLAMA_LAYERS, "weight_bytes": weight_bytes, "weights_only": True,
                                    "bf16_bytes_freed": bf16_bytes}
    assert (f"fp8: 14 linear layers with FP8 weights (weight-only: decode_linear at <= 8 rows, the dequantized "
            f"weight and F.linear above), {weight_bytes / 2**20:.1f} MiB of e4m3 weights and scales in place of "
            f"{bf16_bytes / 2**20:.1f} MiB of 16-bit weights (freed; uninject restores them dequantized)"
            ) in str(report).splitlines()
    assert report.fallbacks["fp8_weight_only"].startswith("more rows than a decode step's")


def storages_bytes(model) -> int:
    """The bytes of every distinct storage the model's parameters, buffers and merges hold."""
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [t for m in model.modules() for merged in vars(m).get("_tk_merged", {}).values()
                for t in (merged.weight, merged.bias) if t is not None]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_the_16_bit_weights_are_gone(on_cpu, merge):
    """Each weight-only layer's weight is a Parameter of e4m3 codes (no gradient) with a float32 scale
    per output channel; the model's parameters, buffers and merges hold those bytes and not the
    16-bit ones (the original Parameter objects, kept for uninject, are empty)."""
    model = llama()
    modules = dict(model.named_modules())
    originals = {p: modules[p].weight for p in LLAMA_LAYERS}
    shapes = {p: w.shape for p, w in originals.items()}
    params_before, held_before = sum(p.nbytes for p in model.parameters()), storages_bytes(model)
    bf16 = sum(w.nbytes for w in originals.values())
    inject(model, eager_kernel(), fp8=True, fp8_weights_only=True, merge_projections=merge)
    scales = sum(modules[p].out_features * 4 for p in LLAMA_LAYERS)
    for path in LLAMA_LAYERS:
        linear = modules[path]
        assert linear.weight.dtype == E4M3 and not linear.weight.requires_grad, path
        assert linear.weight_scale.dtype == torch.float32 and linear.weight_scale.shape == (linear.out_features, 1)
        assert linear.weight.shape == shapes[path] and linear.weight is not originals[path]
        assert originals[path].numel() == 0 and originals[path].untyped_storage().nbytes() == 0
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in llama().parameters())
    assert sum(p.nbytes for p in model.parameters()) == params_before - bf16 // 2
    assert storages_bytes(model) == held_before - bf16 // 2 + scales
    if merge:
        merged = merging.merged_of(model.model.layers[0].self_attn, "qkv")
        assert merged.weight.dtype == E4M3 and merged.weight.untyped_storage().data_ptr() == \
            model.model.layers[0].self_attn.k_proj.weight.untyped_storage().data_ptr()  # the children are views
    state = model.state_dict()
    assert state["model.layers.0.mlp.down_proj.weight"].dtype == E4M3
    assert "model.layers.0.mlp.down_proj.weight_scale" in state


def bound_of_dequantized(x, codes, scale, bias, rows_rounded: bool):
    """(float64 reference of x @ (codes * scale).T + bias, an elementwise bound of our error): the
    output rounded to bf16 (2**-8 of it), and where the weight is rounded to bf16 first (the F.linear
    path) 2**-8 of sum |x| |w|."""
    w = codes.double() * scale.double().reshape(-1, 1)
    ref = x.double() @ w.T + (0 if bias is None else bias.double())
    bound = ref.abs() * 2**-8 + (x.double().abs() @ w.abs().T) * 2**-16 + 1e-6  # + fp32 accumulation
    if rows_rounded:
        bound = bound + (x.double().abs() @ w.abs().T) * 2**-8
    return ref, bound


def bound_of_e4m3(x, weight, scale):
    """An elementwise bound of |x @ (c*s).T - x @ W.T| for e4m3 codes of W per row: each weight
    within 2**-4 of itself (normal e4m3 values) or half the smallest subnormal times its scale."""
    w = weight.double()
    per_weight = torch.maximum(w.abs() * 2**-4, scale.double().reshape(-1, 1) * 2**-10)
    return x.double().abs() @ per_weight.T


def check_weight_only_gemms(model, kernels, device):
    """Each weight-only GEMM of layer 0 (merged or not), at 1, 8 (decode_linear) and 9, 33 rows
    (dequantized + F.linear): within bf16 rounding of the float64 product of its codes and scales,
    and within e4m3's error of the 16-bit weights' product."""
    layer = model.model.layers[0]
    gemms = []
    for parent, key, names in ((layer.self_attn, "qkv", ("q_proj", "k_proj", "v_proj")),
                               (layer.mlp, "gate_up", ("gate_proj", "up_proj"))):
        merged = merging.merged_of(parent, key)
        children = [getattr(parent, n) for n in names]
        if merged is not None:
            scale = torch.cat([c.weight_scale for c in children])
            bias = merged.bias
            gemms.append((merged, merged.weight, scale, bias, [c._tk_original for c in children]))
        gemms += [(c, c.weight, c.weight_scale, c.bias, [c._tk_original]) for c in children]
    for linear in (layer.self_attn.o_proj, layer.mlp.down_proj):
        gemms.append((linear, linear.weight, linear.weight_scale, linear.bias, [linear._tk_original]))
    for gemm, codes, scale, bias, originals in gemms:
        original = torch.cat(originals).to(device)
        for rows in (1, 8, 9, 33):
            x = rows_input(rows, codes.shape[1], device=device, seed=rows)
            kernels.calls.clear()
            with torch.no_grad():
                out = gemm(x)
            assert kernels.calls.get("decode_linear", 0) == (rows <= 8), (rows, kernels.calls)
            ref, bound = bound_of_dequantized(x, codes, scale, bias, rows_rounded=rows > 8)
            err = (out.double() - ref).abs()
            assert (err <= bound).all(), f"{rows} rows: {(err - bound).max().item()} past the bound"
            ref16 = x.double() @ original.double().T + (0 if bias is None else bias.double())
            assert ((out.double() - ref16).abs() <= bound + bound_of_e4m3(x, original, scale)).all()


def keep_originals(model):
    """Each projection's 16-bit weight, kept (a copy) on the module as _tk_original for the checks."""
    for m in model.modules():
        if type(m) is torch.nn.Linear:
            m.__dict__["_tk_original"] = m.weight.detach().clone()


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
@pytest.mark.parametrize("build", [llama, qwen2], ids=["llama", "qwen2_bias"])
def test_weight_only_outputs_against_float64(on_cpu, merge, build):
    model = build()
    keep_originals(model)
    kernels = CountingKernels(eager_kernel())
    inject(model, kernels, fp8=True, fp8_weights_only=True, merge_projections=merge)
    check_weight_only_gemms(model, kernels, "cpu")


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_weight_only_model_is_the_dequantized_model(on_cpu, merge):
    """The prefill (F.linear on the dequantized weight) gives the logits of transformers' model holding
    the dequantized weights, bit for bit; decode steps (decode_linear, one rounding) within bf16
    rounding of them; the norms emit no FP8 (inputs stay 16-bit) and nothing is quantized per call."""
    model = llama()
    ref = reference_dequantized(model, LLAMA_LAYERS)
    kernels = CountingKernels(eager_kernel())
    inject(model, kernels, fp8=True, fp8_weights_only=True, merge_projections=merge)
    kernels.calls.clear()
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, ref(IDS).logits)
        assert "decode_linear" not in kernels.calls
        step = model(IDS[:, :1]).logits  # two rows: a batch-2 decode step
        torch.testing.assert_close(step, ref(IDS[:, :1]).logits, rtol=0.02, atol=0.02)
    assert kernels.calls["decode_linear"] == 2 * (4 if merge else 7), kernels.calls
    assert not {"quantize_fp8", "linear_fp8", "rms_norm_fp8", "fused_add_rms_norm_fp8", "act_mul_fp8"} & set(
        kernels.calls), kernels.calls
    assert model.model.layers[0].__dict__[fp8.PLAN] == {}  # no producer planned


def test_uninject_restores_the_parameters_dequantized(on_cpu):
    model = llama()
    modules = dict(model.named_modules())
    originals = {p: modules[p].weight for p in LLAMA_LAYERS}
    ref = reference_dequantized(model, LLAMA_LAYERS)
    inject(model, eager_kernel(), fp8=True, fp8_weights_only=True)
    uninject(model)
    ref_modules = dict(ref.named_modules())
    for path in LLAMA_LAYERS:
        weight = modules[path].weight
        assert weight is originals[path] and weight.dtype == torch.bfloat16 and weight.requires_grad
        assert torch.equal(weight, ref_modules[path].weight), path
        assert "weight_scale" not in modules[path]._buffers and "_apply" not in vars(modules[path])
    assert all("_tk_fp8" not in vars(m) for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, ref(IDS).logits)


def test_a_dtype_conversion_keeps_the_codes(on_cpu):
    model = llama()
    inject(model, eager_kernel(), fp8=True, fp8_weights_only=True)
    with torch.no_grad():
        before, step = model(IDS).logits, model(IDS[:, :1]).logits
        model.to(torch.bfloat16)
        down = model.model.layers[1].mlp.down_proj
        assert down.weight.dtype == E4M3 and down.weight_scale.dtype == torch.float32
        assert torch.equal(model(IDS).logits, before) and torch.equal(model(IDS[:, :1]).logits, step)


def test_weight_only_falls_back_to_the_dequantized_weight_and_says_so(on_cpu, caplog):
    """A decode-sized call that wants gradients runs the dequantized weight (decode_linear has no
    backward): a logged fallback of kind fp8_weight_only, x's gradient flows; strict=True raises.
    Prefill-sized calls take that path by design: nothing logged."""
    model = llama()
    report = inject(model, eager_kernel(), fp8=True, fp8_weights_only=True, training=False)
    o_proj = model.model.layers[0].self_attn.o_proj
    with caplog.at_level(logging.WARNING, logger="transformer_kernels_integrations"):
        o_proj(rows_input(9, 64))
        assert not caplog.records and not report.fallbacks_taken
        x = rows_input(2, 64).requires_grad_()
        out = o_proj(x)
        out.float().sum().backward()
    assert x.grad is not None and torch.equal(out, fp8.dequantized_linear(x.detach(), o_proj.weight,
                                                                          o_proj.weight_scale, None))
    assert report.fallbacks_taken == {"fp8_weight_only": 1}
    assert any("fp8_weight_only runs the dequantized weight with F.linear: gradients are wanted" in r.getMessage()
               for r in caplog.records)
    uninject(model)
    inject(model, eager_kernel(), fp8=True, fp8_weights_only=True, training=False, strict=True)
    with pytest.raises(KernelFallbackError):
        model.model.layers[0].self_attn.o_proj(rows_input(2, 64).requires_grad_())


def test_fp8_weights_only_is_checked_like_fp8(on_cpu):
    model = llama()
    with pytest.raises(ValueError, match="fp8=True is for inference"):
        inject(model, eager_kernel(), fp8=True, fp8_weights_only=True, training=True)
    with pytest.raises(TypeError, match="inject: fp8_weights_only takes True or False, got 1"):
        inject(model, eager_kernel(), fp8=True, fp8_weights_only=1)
    with pytest.raises(TypeError, match="inject: fp8 takes True or False, got 'weights_only'"):
        inject(model, eager_kernel(), fp8="weights_only")
    assert not hasattr(model, "_transformer_kernels_undo")
    report = inject(model, eager_kernel(), fp8=True, fp8_weights_only=False)  # the default: activations in FP8 too
    assert report.replaced["fp8_linear"] == 14 and "fp8_weight_only" not in report.replaced


# ---- on the GPU (the small models' widths count as large; the devices are the default, CUDA) ----

@pytest.mark.gpu
@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
@pytest.mark.parametrize("build", [llama, qwen2], ids=["llama", "qwen2_bias"])
def test_weight_only_outputs_against_float64_on_the_gpu(tk, small_widths, merge, build):
    model = build(device="cuda")
    keep_originals(model)
    kernels = CountingKernels(tk)
    inject(model, kernels, fp8=True, fp8_weights_only=True, merge_projections=merge)
    check_weight_only_gemms(model, kernels, "cuda")


@pytest.mark.gpu
def test_bf16_decode_gemms_against_float64_on_the_gpu(tk, small_widths):
    model = llama(device="cuda")
    kernels = CountingKernels(tk)
    inject(model, kernels)
    layer = model.model.layers[0]
    for gemm in (merging.merged_of(layer.self_attn, "qkv"), layer.self_attn.o_proj,
                 merging.merged_of(layer.mlp, "gate_up"), layer.mlp.down_proj):
        for rows in (1, 2):
            x = rows_input(rows, gemm.weight.shape[1], device="cuda", seed=rows)
            kernels.calls.clear()
            with torch.no_grad():
                out = gemm(x)
            assert kernels.calls.get("decode_linear", 0) == (rows == 1)
            ref = x.double() @ gemm.weight.double().T
            bound = ref.abs() * 2**-8 + (x.double().abs() @ gemm.weight.double().abs().T) * 2**-10 + 1e-6
            assert ((out.double() - ref).abs() <= bound).all()


@pytest.mark.gpu
@pytest.mark.no_poison
def test_weight_only_frees_the_16_bit_weights_on_the_gpu(tk, small_widths):
    """GPU memory after inject(fp8=True, fp8_weights_only=True): the 16-bit weights of the layers
    gone, their codes and scales in place (a model with 256-wide layers, so the bytes show)."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=1024, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=128)
    model = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    gc.collect()
    before = torch.cuda.memory_allocated()
    report = inject(model, tk, fp8=True, fp8_weights_only=True)
    gc.collect()
    after = torch.cuda.memory_allocated()
    freed, kept = report.extras["fp8"]["bf16_bytes_freed"], report.fp8_weight_bytes
    assert freed > 2 * 10**6 and abs((before - after) - (freed - kept)) <= 64 * 1024, (before, after, freed, kept)
    ids = torch.randint(0, 128, (2, 5), device="cuda")
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all() and torch.isfinite(model(ids[:, :1]).logits).all()
