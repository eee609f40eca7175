"""inject(model, fp8=True): which linear layers run in FP8 (the report), the wiring on the CPU with the
eager stand-ins (the package's Python code over reference ops: the FP8 linear is the float64-exact
GEMM of the dequantized operands, rounded once), uninject giving back the bf16 model bit for bit, a
weight updated in place quantized again, the fallbacks, and the refusals. On the GPU the real kernels
run (tests/gemm, tests/norm, tests/quant, and the end-to-end benchmarks for the quality)."""

import copy
import enum
import logging
import types

import pytest
import torch
import torch.nn.functional as F

from conftest import FULL_CHECKOUT
from eager_kernel import eager_kernel
from integration_helpers import CountingKernels, assert_restored, snapshot

if not FULL_CHECKOUT:
    pytest.skip("reference/ is not in this source set", allow_module_level=True)

from reference.fp8 import quantize_fp8_rowwise  # noqa: E402

transformers = pytest.importorskip("transformers")
from test_integration_transformers import small_model  # noqa: E402
from transformer_kernels_integrations import KernelFallbackError, decode, diffusers_models, fp8, inject, merging  # noqa: E402
from transformer_kernels_integrations import transformers_models, uninject  # noqa: E402

LLAMA_FP8 = [f"model.layers.{i}.{p}" for i in range(2) for p in (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]


@pytest.fixture
def cpu_fp8(monkeypatch):
    """The stand-ins take CPU tensors (the tables' devices: the FP8 layers have no gate of their own);
    the small models' 64-wide layers count as large."""
    monkeypatch.setattr(fp8, "FP8_MIN_FEATURES", 16)
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    monkeypatch.setattr(diffusers_models, "KERNEL_DEVICES", ("cuda", "cpu"))


def reference_fp8_forward(self, x):
    """An FP8 nn.Linear as torchao's row-wise recipe defines it: x and the weight quantized per row,
    the product of the dequantized operands in fp32, plus the bias, rounded once."""
    xq, xs = quantize_fp8_rowwise(x)
    wq, ws = quantize_fp8_rowwise(self.weight)
    out = F.linear(xq.float() * xs, wq.float() * ws, None if self.bias is None else self.bias.float())
    return out.to(x.dtype)


def with_reference_fp8(model, paths):
    """A copy of the uninjected model whose `paths` linear layers run reference_fp8_forward."""
    ref = copy.deepcopy(model)
    modules = dict(ref.named_modules())
    for path in paths:
        modules[path].forward = types.MethodType(reference_fp8_forward, modules[path])
    return ref


def llama(dtype=torch.bfloat16):
    return small_model("llama", dtype)


IDS = torch.randint(0, 101, (2, 9), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_llama_layers_run_the_fp8_gemm(cpu_fp8, merge):
    """Every projection of the decoder layers runs the FP8 GEMM (the merged q/k/v and gate/up as one
    each) on codes its producer emitted (the norms' for q/k/v and gate/up, act_mul_fp8's for the down
    projection; o_proj's input quantized alone); the logits are the reference FP8 model's exactly; the
    embeddings and lm_head stay bf16."""
    model = llama()
    ref = with_reference_fp8(model, LLAMA_FP8)
    kernels = CountingKernels(eager_kernel())
    report = inject(model, kernels, fp8=True, merge_projections=merge)
    assert report.fp8_layers == LLAMA_FP8, report.fp8_layers
    assert report.replaced["fp8_linear"] == len(LLAMA_FP8)
    modules = dict(model.named_modules())
    assert report.fp8_weight_bytes == sum(modules[p].out_features * (modules[p].in_features + 4) for p in LLAMA_FP8)
    assert "fp8: 14 linear layers in FP8" in str(report) and report.ops["fp8_linear"] == fp8.OPS
    kernels.calls.clear()
    with torch.no_grad():
        ours, want = model(IDS).logits, ref(IDS).logits
    gemms = 4 if merge else 7  # per layer: q/k/v (1 or 3), o, gate/up (1 or 2), down
    assert kernels.calls.get("linear_fp8") == 2 * gemms, kernels.calls
    assert kernels.calls.get("act_mul_fp8") == 2, kernels.calls  # the down projections' inputs
    # the attention's and the MLP's inputs from the norms, quantized there; only o_proj's input alone
    assert kernels.calls.get("rms_norm_fp8") == 2 and kernels.calls.get("fused_add_rms_norm_fp8") == 2, kernels.calls
    assert kernels.calls.get("quantize_fp8") == 2 and "fused_add_rms_norm" not in kernels.calls, kernels.calls
    differ = (ours != want).sum().item()
    assert differ == 0, f"{differ} of {ours.numel()} logits differ from the reference FP8 model"
    with torch.no_grad():
        bf16 = llama()(IDS).logits
    assert not torch.equal(ours, bf16)  # FP8 ran: its rounding shows
    assert (ours.float() - bf16.float()).norm() / bf16.float().norm() < 0.1


def test_uninject_gives_back_the_bf16_model_bit_for_bit(cpu_fp8):
    model = llama()
    before = snapshot(model)
    with torch.no_grad():
        expected = model(IDS).logits
    inject(model, eager_kernel(), fp8=True)
    with torch.no_grad():
        model(IDS)
    uninject(model)
    assert_restored(model, before)
    assert all("_tk_fp8" not in vars(m) for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, expected)


def test_excluded_layers_and_merges_stay_bf16(cpu_fp8):
    """fp8_exclude patterns keep layers in bf16; a merge with one projection excluded keeps all of
    its projections in bf16 (one GEMM)."""
    model = llama()
    report = inject(model, eager_kernel(), fp8=True, fp8_exclude=["*.mlp.*"])
    assert report.fp8_layers == [p for p in LLAMA_FP8 if ".mlp." not in p]
    uninject(model)
    report = inject(model, eager_kernel(), fp8=True, fp8_exclude=["*.q_proj"])
    assert report.fp8_layers == [p for p in LLAMA_FP8 if ".self_attn." not in p or p.endswith("o_proj")]


def test_an_fp32_model_keeps_its_layers(cpu_fp8):
    """FP8 layers serve 16-bit models: an fp32 model's linear layers are not quantized (they would only
    ever fall back), and its output is the fp32 model's."""
    model = llama(torch.float32)
    with torch.no_grad():
        expected = model(IDS).logits
    report = inject(model, eager_kernel(), fp8=True)
    assert report.fp8_layers == [] and "fp8_linear" not in report.replaced, report
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, expected)


def test_a_weight_updated_in_place_is_quantized_again(cpu_fp8):
    model = llama()
    ref = with_reference_fp8(model, LLAMA_FP8)
    inject(model, eager_kernel(), fp8=True)
    with torch.no_grad():
        model(IDS)
        for m in (model, ref):  # one child of the merged q/k/v, and a plain projection
            m.model.layers[0].self_attn.k_proj.weight.mul_(-0.5)
            m.model.layers[1].mlp.down_proj.weight.add_(0.01)
        assert torch.equal(model(IDS).logits, ref(IDS).logits)


def test_where_fp8_cannot_run_the_bf16_layer_runs_and_says_so(cpu_fp8, caplog):
    """Gradients wanted: the bf16 projections (the logits are the bf16 model's), a logged fallback
    counted in the report; strict=True raises."""
    model = llama()
    expected = llama()(IDS).logits
    report = inject(model, eager_kernel(), fp8=True, training=False)
    with caplog.at_level(logging.WARNING, logger="transformer_kernels_integrations"):
        logits = model(IDS).logits  # grad mode, parameters that require grad
    assert torch.equal(logits, expected)
    assert report.fallbacks_taken.get("fp8_linear", 0) >= len(LLAMA_FP8), report.fallbacks_taken
    assert any("fp8_linear runs the bf16 projection: gradients are wanted" in r.getMessage() for r in caplog.records)
    uninject(model)
    inject(model, eager_kernel(), fp8=True, training=False, strict=True)
    with pytest.raises(KernelFallbackError):
        model(IDS)


def test_bad_arguments_and_gpus_without_fp8_are_refused(cpu_fp8, monkeypatch):
    model = llama()
    tk = eager_kernel()
    with pytest.raises(ValueError, match="fp8=True is for inference"):
        inject(model, tk, fp8=True, training=True)
    with pytest.raises(ValueError, match="fp8_exclude is given but fp8 is off"):
        inject(model, tk, fp8_exclude=["*.mlp.*"])
    with pytest.raises(TypeError, match="fp8 takes True or False"):
        inject(model, tk, fp8="yes")
    with pytest.raises(TypeError, match="fp8_exclude takes a sequence"):
        inject(model, tk, fp8=True, fp8_exclude="*.mlp.*")
    no_fp8 = types.SimpleNamespace(**{k: getattr(tk, k) for k in dir(tk) if k not in fp8.OPS and not k.startswith("_")})
    with pytest.raises(ValueError, match="fp8=True needs the kernel's quantize_fp8"):
        inject(model, no_fp8, fp8=True)
    assert not hasattr(model, "_transformer_kernels_undo")  # nothing was patched by a refused call
    # an A100 (8.0): refused, naming the GPU and its capability
    on_gpu = types.SimpleNamespace(parameters=lambda: iter([types.SimpleNamespace(device=torch.device("cuda", 0))]))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(ValueError, match=r"compute capability 8\.9 or later.*A100-SXM4-80GB is 8\.0"):
        fp8.check_device([on_gpu])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    fp8.check_device([on_gpu])


def test_diffusers_blocks_run_fp8_and_keep_the_modulation_in_bf16(cpu_fp8):
    """LTX-Video: the attention projections (merged q/k/v, the cross-attention's q and merged k/v, the
    outputs) and both FFN projections (the first with the GELU in the FP8 GEMM's epilogue) in FP8;
    the timestep/caption MLPs and the patchify projections outside the blocks stay bf16."""
    from test_integration_diffusers import ltx_inputs, small_ltx

    model = small_ltx(torch.bfloat16)
    with torch.no_grad():
        bf16 = model(**ltx_inputs(torch.bfloat16))[0]
    kernels = CountingKernels(eager_kernel())
    report = inject(model, kernels, fp8=True)
    per_block = ["attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0", "attn2.to_q", "attn2.to_k",
                 "attn2.to_v", "attn2.to_out.0", "ff.net.0.proj", "ff.net.2"]
    assert report.fp8_layers == [f"transformer_blocks.{i}.{p}" for i in range(2) for p in per_block], report.fp8_layers
    kernels.calls.clear()
    with torch.no_grad():
        ours = model(**ltx_inputs(torch.bfloat16))[0]
    # per block: q/k/v merged, out; cross q, k/v merged, out; the FFN's two
    assert kernels.calls.get("linear_fp8") == 2 * 7, kernels.calls
    # the self-attention's and the FFN's inputs quantized by the modulated norms that produce them; the
    # rest (outputs' inputs, the cross-attention's q and k/v, the FFN's down projection) alone
    assert kernels.calls.get("norm_modulate_fp8") == 2 and kernels.calls.get("gated_add_norm_modulate_fp8") == 2
    assert kernels.calls.get("quantize_fp8") == 2 * 5, kernels.calls
    assert not torch.equal(ours, bf16)
    assert (ours.float() - bf16.float()).norm() / bf16.float().norm() < 0.1


def test_ltx_output_is_the_reference_fp8_model_s(cpu_fp8):
    """With the GELU after the projection (linear_gelu=False: the epilogue's single rounding aside),
    the injected LTX-Video transformer's output is exactly that of diffusers' own model whose block
    linear layers run the reference FP8 linear: the producers' codes are quantize_fp8's of the 16-bit
    values, bit for bit."""
    from test_integration_diffusers import ltx_inputs, small_ltx

    model = small_ltx(torch.bfloat16)
    report = inject(model, eager_kernel(), fp8=True, linear_gelu=False)
    ref = with_reference_fp8(small_ltx(torch.bfloat16), report.fp8_layers)
    with torch.no_grad():
        ours, want = model(**ltx_inputs(torch.bfloat16))[0], ref(**ltx_inputs(torch.bfloat16))[0]
    differ = (ours != want).sum().item()
    assert differ == 0, f"{differ} of {ours.numel()} elements differ from the reference FP8 model"


# ---- FP8 as a pass of the tables; the quant contract decided once at inject ----

def test_fp8_is_a_pass_of_both_tables():
    """The engine sees FP8 only as the pass its tables carry: fp8, fp8_exclude and fp8_weights_only are
    its keywords (the transformers table carries the decode pass after it)."""
    assert diffusers_models.TABLE.passes == (fp8.PASS,)
    assert transformers_models.TABLE.passes == (fp8.PASS, decode.PASS)
    assert fp8.PASS.keywords == ("fp8", "fp8_exclude", "fp8_weights_only") and fp8.PASS.ops == fp8.OPS
    assert "fp8" not in transformers_models.SWITCHES  # a pass, off by default: not a rule switch


def counting_walks(monkeypatch):
    """Counts the calls of the functions that find the GEMMs reading a producer's output."""
    walks = {"n": 0}
    for name in ("input_gemms", "feed_forward_input_gemms"):
        def counted(*args, _f=getattr(fp8, name), **kwargs):
            walks["n"] += 1
            return _f(*args, **kwargs)
        monkeypatch.setattr(fp8, name, counted)
    return walks


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_llama_producers_are_planned_once_at_inject(cpu_fp8, monkeypatch, merge):
    """Which norms emit FP8 is decided when the pass applies (their consumers found once), stored on
    the block; forward calls walk no consumers; a merge refreshed (.to()) plans its block again."""
    walks = counting_walks(monkeypatch)
    model = llama()
    ref = with_reference_fp8(model, LLAMA_FP8)
    kernels = CountingKernels(eager_kernel())
    inject(model, kernels, fp8=True, merge_projections=merge)
    assert walks["n"] > 0
    layer = model.model.layers[0]
    plan = layer.__dict__[fp8.PLAN]
    assert set(plan) == {"attn", "mlp"} and all(isinstance(site, fp8.Site) for site in plan.values())
    assert [type(g).__name__ for g in plan["attn"].gemms] == (["MergedLinear"] if merge else ["Linear"] * 3)
    walks["n"] = 0
    with torch.no_grad():
        model(IDS)
        model(IDS)
    assert walks["n"] == 0, f"{walks['n']} consumer walks in two forward calls"
    assert kernels.calls.get("rms_norm_fp8") == 4 and kernels.calls.get("fused_add_rms_norm_fp8") == 4
    model.to(torch.bfloat16)  # the merges refresh: their blocks are planned again
    assert (walks["n"] > 0) == merge
    walks["n"] = 0
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, ref(IDS).logits)
    assert walks["n"] == 0
    uninject(model)
    assert all(k not in vars(m) for m in model.modules() for k in ("_tk_fp8", "_tk_fp8_consumers", "_tk_fp8_inputs"))


def test_ltx_producers_are_planned_once_at_inject(cpu_fp8, monkeypatch):
    from test_integration_diffusers import ltx_inputs, small_ltx

    walks = counting_walks(monkeypatch)
    model = small_ltx(torch.bfloat16)
    kernels = CountingKernels(eager_kernel())
    inject(model, kernels, fp8=True)
    plan = model.transformer_blocks[0].__dict__[fp8.PLAN]
    assert set(plan) == {"attn1", "ff"} and None not in plan.values()
    walks["n"] = 0
    with torch.no_grad():
        model(**ltx_inputs(torch.bfloat16))
    assert walks["n"] == 0
    assert kernels.calls.get("norm_modulate_fp8") == 2 and kernels.calls.get("gated_add_norm_modulate_fp8") == 2


def test_without_fp8_the_producers_plan_nothing(cpu_fp8):
    model = llama()
    kernels = CountingKernels(eager_kernel())
    report = inject(model, kernels)
    assert model.model.layers[0].__dict__[fp8.PLAN] == {}
    with torch.no_grad():
        model(IDS)
    assert not any(name.endswith("_fp8") for name in kernels.calls), kernels.calls
    assert report.extras == {"fp8": {"layers": [], "weight_bytes": 0}, "decode_linear": {"gemms": []}}
    assert report.fp8_layers == []
    assert "fp8" not in str(report)


def test_the_report_keeps_fp8_s_record_in_extras(cpu_fp8):
    model = llama()
    report = inject(model, eager_kernel(), fp8=True)
    modules = dict(model.named_modules())
    weight_bytes = sum(modules[p].out_features * (modules[p].in_features + 4) for p in LLAMA_FP8)
    assert report.extras["fp8"] == {"layers": LLAMA_FP8, "weight_bytes": weight_bytes}
    assert report.fp8_layers is report.extras["fp8"]["layers"] and report.fp8_weight_bytes == weight_bytes
    assert (f"fp8: 14 linear layers in FP8, {weight_bytes / 2**20:.1f} MiB of e4m3 weights and scales beside the "
            "bf16 weights (kept for uninject)") in str(report).splitlines()
    assert report.fallbacks["fp8_linear"].startswith("tensors off the GPU, autocast")
    with pytest.raises(AttributeError):
        report.fp8_nothing
    assert copy.deepcopy(report).extras == report.extras


class OtherKey(enum.Enum):
    """A key no GEMM of ours accepts (a coming precision's, say)."""

    ROW_E5M2 = ("float8_e5m2", "row")
    __str__ = fp8.QuantKey.__str__


def other_key_rows(x):
    """x as QuantizedRows of a key no GEMM of ours takes (e5m2 codes, a scale per row)."""
    scale = x.float().abs().amax(-1, keepdim=True) / 57344.0
    codes = (x.float() / scale).to(torch.float8_e5m2)
    return fp8.QuantizedRows(codes, scale, x.dtype, OtherKey.ROW_E5M2)


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_a_gemm_given_a_key_it_does_not_accept_runs_bf16_on_the_dequantized_input(cpu_fp8, caplog, merge):
    model = llama()
    inject(model, eager_kernel(), fp8=True, merge_projections=merge)
    attn = model.model.layers[0].self_attn
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    rows = other_key_rows(x)
    with caplog.at_level(logging.WARNING, logger="transformer_kernels_integrations"), torch.no_grad():
        if merge:
            out = merging.merged_of(attn, "qkv")(rows)
            want = F.linear(rows.dequantized(), merging.merged_of(attn, "qkv").weight)
        else:
            out = attn.q_proj(rows)
            want = F.linear(rows.dequantized(), attn.q_proj.weight)
    assert torch.equal(out, want)
    assert any("fp8_linear runs the bf16" in r.getMessage() and "quantized as float8_e5m2 per row, its FP8 GEMM "
               "takes float8_e4m3fn per row" in r.getMessage() for r in caplog.records), caplog.text
    with pytest.raises(ValueError, match="quantized as float8_e5m2 per row, this GEMM takes float8_e4m3fn per row"):
        fp8.linear(eager_kernel(), fp8.of(attn.q_proj) or fp8.of(attn.o_proj), rows, None)
    uninject(model)
    inject(model, eager_kernel(), fp8=True, merge_projections=merge, strict=True)
    with pytest.raises(KernelFallbackError), torch.no_grad():
        model.model.layers[0].self_attn.o_proj(other_key_rows(torch.zeros(2, 64, dtype=torch.bfloat16)))


def test_a_producer_emits_fp8_only_for_consumers_that_accept_its_key(cpu_fp8):
    """A consumer that declares another key (the next precision) makes its producer emit 16 bits: the
    plan, made again when its merge refreshes, says so; the others stay in FP8."""
    model = llama()
    kernels = CountingKernels(eager_kernel())
    inject(model, kernels, fp8=True)
    merged = merging.merged_of(model.model.layers[0].self_attn, "qkv")
    merged.low_precision.fp8.accepts = OtherKey.ROW_E5M2
    merged.refresh()
    assert model.model.layers[0].__dict__[fp8.PLAN]["attn"] is None
    kernels.calls.clear()
    with torch.no_grad():
        model(IDS)
    assert kernels.calls.get("rms_norm_fp8") == 1 and kernels.calls.get("fused_add_rms_norm_fp8") == 2


def test_fp8_layers_follow_the_table_s_devices(cpu_fp8, monkeypatch, caplog):
    """One device gate: the FP8 layers read their table's (transformers_models.KERNEL_DEVICES here)."""
    model = llama()
    expected = llama()(IDS).logits
    report = inject(model, eager_kernel(), fp8=True)
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cuda",))
    with caplog.at_level(logging.WARNING, logger="transformer_kernels_integrations"), torch.no_grad():
        assert torch.equal(model(IDS).logits, expected)
    assert report.fallbacks_taken.get("fp8_linear", 0) >= len(LLAMA_FP8)
    assert any("fp8_linear runs the bf16 projection: tensors on cpu, not the GPU" in r.getMessage()
               for r in caplog.records)


@pytest.mark.parametrize("entry", ["top", "transformers", "diffusers"])
def test_fp8_keywords_are_checked_by_every_inject(cpu_fp8, entry):
    """The pass's keywords are refused as before, naming the argument, by each inject."""
    call = {"top": inject, "transformers": transformers_models.inject, "diffusers": diffusers_models.inject}[entry]
    model, tk = llama(), eager_kernel()
    with pytest.raises(ValueError, match=r"inject: fp8_exclude is given but fp8 is off \(fp8=True turns the FP8 "):
        call(model, tk, fp8_exclude=["*.mlp.*"])
    with pytest.raises(TypeError, match="inject: fp8 takes True or False, got 'yes'"):
        call(model, tk, fp8="yes")
    with pytest.raises(TypeError, match="inject: fp8 takes True or False, got 1"):
        call(model, tk, fp8=1)
    with pytest.raises(TypeError, match="inject: fp8_exclude takes a sequence of module-path patterns, got the str"):
        call(model, tk, fp8=True, fp8_exclude="*.mlp.*")
    with pytest.raises(TypeError, match="inject: fp8_exclude takes a sequence of module-path patterns, got int 5"):
        call(model, tk, fp8=True, fp8_exclude=5)
    with pytest.raises(TypeError, match=r"inject: fp8_exclude takes module-path patterns \(strings\), got int 3"):
        call(model, tk, fp8=True, fp8_exclude=["*.mlp.*", 3])
    with pytest.raises(TypeError, match=r"unknown switch\(es\) \['fp8_include'\]; the switches are .*the passes "
                                        r"\(off unless given True\) fp8 \(the FP8 layers; options fp8_exclude, "
                                        r"fp8_weights_only\)" + ("" if entry == "diffusers" else
                                                                  r"; \(on unless given False\) decode_linear")):
        call(model, tk, fp8=True, fp8_include=["*"])
    with pytest.raises(TypeError, match="inject: fp8_weights_only takes True or False, got 'weights'"):
        call(model, tk, fp8=True, fp8_weights_only="weights")
    with pytest.raises(ValueError, match=r"inject: fp8_weights_only is given but fp8 is off \(fp8=True turns "):
        call(model, tk, fp8_weights_only=True)
    assert not hasattr(model, "_transformer_kernels_undo")
    report = call(model, tk, fp8=True, fp8_exclude=iter(["*.mlp.*"]))  # any iterable of patterns
    assert report.fp8_layers == [p for p in LLAMA_FP8 if ".mlp." not in p]


def test_the_fp8_llama_traces_whole(cpu_fp8):
    """The plan, the keys and the runtime checks trace without graph breaks (dynamo alone: the
    stand-ins' rounding stays eager's), and the compiled logits are the eager FP8 model's."""
    model = llama()
    inject(model, eager_kernel(), fp8=True)
    torch._dynamo.reset()
    with torch.no_grad():
        expected = model(IDS).logits
        compiled = torch.compile(lambda ids: model(ids).logits, backend="eager", fullgraph=True)(IDS)
    assert torch.equal(compiled, expected)
