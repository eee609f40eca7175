"""Decode without host overhead: the graph-captured decode step (cuda_graphs.CapturedDecoder) and
generate's compiled decode (reduce-overhead, fullgraph) with the injected Llama/Qwen3 models.

On CPU the decoder runs its static-buffer step without a graph (capture=False) and must produce
generate's greedy tokens, injected (with the eager stand-ins) or not; on the GPU the captured
replays must equal the uncaptured steps, and the compiled generate must record its graphs once.
The decode GEMMs (issue 44: ``decode_linear`` for a step's few rows, with 16-bit weights or
``fp8_weights_only``): chosen in Python when the step runs, so captured once and replayed."""

import inspect

import pytest
import torch

from eager_kernel import eager_kernel
from integration_helpers import CountingKernels
from test_integration_transformers import CONFIGS, EAGER_TK, restore_rotary_functions, small_model  # noqa: F401 (autouse)

transformers = pytest.importorskip("transformers")
from transformer_kernels_integrations import decode, fp8, transformers_models  # noqa: E402
from transformer_kernels_integrations.cuda_graphs import (  # noqa: E402
    CapturedDecoder,
    capture_decode,
    compile_config_for_decode,
)
from transformer_kernels_integrations.transformers_models import inject  # noqa: E402


def prompts(batch, length, seed=0, device="cpu", pad=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 101, (batch, length), generator=g).to(device)
    mask = torch.ones_like(ids)
    if pad:
        mask[0, :pad] = 0  # left padding in the first row, as a tokenizer pads for generation
    return ids, mask


def hf_greedy(model, ids, mask, new_tokens):
    return model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                          do_sample=False, pad_token_id=0)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("injected", [False, True], ids=["eager", "injected"])
@pytest.mark.parametrize("pad", [0, 3], ids=["no_pad", "left_pad"])
def test_uncaptured_decoder_gives_generates_tokens_on_cpu(monkeypatch, name, injected, pad):
    model = small_model(name)
    ids, mask = prompts(2, 9, pad=pad)
    expected = hf_greedy(model, ids, mask, 6)
    if injected:
        monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
        inject(model, EAGER_TK)
    decoder = CapturedDecoder(model, batch_size=2, max_cache_len=32, capture=False)
    assert torch.equal(decoder.generate(ids, 6, attention_mask=mask), expected)
    assert torch.equal(decoder.generate(ids, 6, attention_mask=mask), expected)  # the cache resets per prompt


def test_decoder_rejects_what_it_cannot_run():
    model = small_model("llama")
    with pytest.raises(ValueError, match="capture needs the model on a CUDA device"):
        CapturedDecoder(model, 1, 16)
    decoder = CapturedDecoder(model, 2, 16, capture=False)
    with pytest.raises(ValueError, match="for batch size 2, got 1 prompts"):
        decoder.prefill(torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="leaves no room"):
        decoder.prefill(torch.zeros(2, 16, dtype=torch.long))
    with pytest.raises(RuntimeError, match="call prefill"):
        decoder.step(torch.zeros(2, dtype=torch.long))
    mistral = transformers.MistralForCausalLM(transformers.MistralConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=101, sliding_window=8)).eval()
    with pytest.raises(ValueError, match="sliding-window"):
        CapturedDecoder(mistral, 1, 32, capture=False)


# ---- the decode GEMMs (decode_linear) in the decoder's steps ----

# mode -> (inject's keywords, the batch: the rows a step's GEMMs take decode_linear with)
DECODE_MODES = {"bf16": ({}, 1), "fp8_weights": ({"fp8": True, "fp8_weights_only": True}, 4)}


@pytest.fixture
def decode_gemms(monkeypatch):
    """The small Llama's 64-wide projections count as large for the decode and FP8 passes."""
    monkeypatch.setattr(decode, "BF16_MIN_OUT_FEATURES", 16)
    monkeypatch.setattr(fp8, "FP8_MIN_FEATURES", 16)


def static_cache_generate(model, ids, mask, new_tokens, max_cache_len):
    """generate's greedy tokens with a static cache of the decoder's length (the same attention shapes)."""
    cache = transformers.StaticCache(config=model.config, max_cache_len=max_cache_len)
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                          do_sample=False, pad_token_id=0, disable_compile=True, **{cache_arg: cache})


@pytest.mark.parametrize("mode", sorted(DECODE_MODES))
def test_uncaptured_decoder_steps_run_decode_linear_on_cpu(monkeypatch, decode_gemms, mode):
    """bf16, injected with the stand-ins: every step's 8 GEMMs (4 a layer) run decode_linear, the
    prefill's none; the tokens are generate's on the same injected model."""
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    keywords, batch = DECODE_MODES[mode]
    model = small_model("llama", torch.bfloat16)
    kernels = CountingKernels(eager_kernel())
    report = inject(model, kernels, **keywords)
    assert report.replaced["fp8_weight_only" if keywords else "decode_linear"] == (14 if keywords else 8)
    ids, mask = prompts(batch, 9, pad=2 if batch > 1 else 0)
    expected = static_cache_generate(model, ids, mask, 6, 32)
    decoder = CapturedDecoder(model, batch_size=batch, max_cache_len=32, capture=False)
    kernels.calls.clear()
    decoder.prefill(ids, mask)
    assert "decode_linear" not in kernels.calls
    assert torch.equal(decoder.generate(ids, 6, attention_mask=mask), expected)
    assert kernels.calls["decode_linear"] == 8 * 5, kernels.calls  # 5 steps after each prefill


# ---- on the GPU ----

def gpu_model(name, tk, dtype=torch.bfloat16):
    model = small_model(name, dtype, "cuda")
    if tk is not None:
        assert inject(model, tk).replaced
    return model


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("injected", [False, True], ids=["eager", "injected"])
def test_captured_steps_equal_uncaptured_steps(tk, name, injected):
    """Replays of the captured step give the bits of the same step run eagerly; captured once."""
    model = gpu_model(name, tk if injected else None)
    ids, mask = prompts(4, 11, device="cuda", pad=2)
    reference = CapturedDecoder(model, 4, 64, capture=False)
    decoder = capture_decode(model, 4, 64)
    ref_logits, logits = reference.prefill(ids, mask), decoder.prefill(ids, mask)
    assert torch.equal(ref_logits, logits)
    graph = None
    for _ in range(12):
        token = ref_logits.argmax(-1)
        ref_logits, logits = reference.step(token), decoder.step(token)
        assert torch.equal(logits, ref_logits)
        graph = graph or decoder.graph
        assert decoder.graph is graph  # one capture, replayed per token
    assert torch.equal(decoder.generate(ids, 8, mask), reference.generate(ids, 8, mask))


@pytest.mark.gpu
def test_decoders_of_several_batch_sizes_share_a_pool(tk):
    model = gpu_model("llama", tk)
    pool = torch.cuda.graph_pool_handle()
    decoders = {b: capture_decode(model, b, 48, pool=pool) for b in (1, 2, 4)}
    for b, decoder in decoders.items():
        ids, _ = prompts(b, 7, seed=b, device="cuda")
        expected = CapturedDecoder(model, b, 48, capture=False).generate(ids, 5)
        assert torch.equal(decoder.generate(ids, 5), expected)


def graphs_recorded(call) -> int:
    """CUDA graphs that CUDA-graph trees record while call() runs."""
    from torch._inductor import cudagraph_trees

    manager = cudagraph_trees.get_manager(torch.cuda.current_device())
    before = manager.new_graph_id().id  # new_graph_id takes an id itself
    call()
    return manager.new_graph_id().id - before - 1


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_compiled_generate_records_no_graph_per_token_nor_more_than_stock(tk, name):
    """generate with the reduce-overhead, fullgraph compile config, stock and injected: tokens equal
    the eager generate's (fp32: no rounding-driven argmax flips), no CUDA-graph skips, and no
    re-recording per token. With a cache kept across calls (passed in, reset per prompt) a later
    generate records nothing, of 12 tokens or of 4. With generate's own static cache it may record
    one graph per call: transformers 5 builds a new ``StaticCache`` in every generate (its tensors,
    marked static addresses, land where the caching allocator puts them, and CUDA-graph trees
    re-record a step whose static inputs moved); ours records no more than stock does."""
    from torch._dynamo.utils import counters

    recorded = {}
    for who in ("stock", "ours"):
        model = gpu_model(name, tk if who == "ours" else None, torch.float32)
        ids, mask = prompts(2, 9, device="cuda")

        def generate(tokens, **kwargs):
            return model.generate(ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
                                  do_sample=False, pad_token_id=0, **kwargs)

        expected = generate(12, cache_implementation="static", disable_compile=True)
        torch._dynamo.reset()
        counters.clear()
        outputs = []
        compiled = dict(compile_config=compile_config_for_decode())
        cache = transformers.StaticCache(config=model.config, max_cache_len=ids.shape[1] + 12)

        cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

        def kept_cache(tokens):
            cache.reset()
            return generate(tokens, **{cache_arg: cache}, **compiled)

        with torch._inductor.config.patch({"triton.cudagraph_or_error": True}):
            outputs.append(generate(12, cache_implementation="static", **compiled))  # compiles, records
            own = [graphs_recorded(lambda n=n: outputs.append(generate(n, cache_implementation="static", **compiled)))
                   for n in (12, 4)]
            outputs.append(kept_cache(12))  # a new cache object: may recompile and record
            kept = [graphs_recorded(lambda n=n: outputs.append(kept_cache(n))) for n in (12, 4)]
        assert counters["inductor"]["cudagraph_skips"] == 0, (who, dict(counters["inductor"]))
        for out in outputs:
            assert torch.equal(out, expected[:, :out.shape[1]]), who
        assert kept == [0, 0], f"{who}: graphs recorded by generate calls on a kept cache (12, 4 tokens): {kept}"
        assert all(n <= 1 for n in own), f"{who}: graphs recorded by generate calls of 12 and 4 tokens: {own}"
        recorded[who] = own
        del model, cache, outputs
        torch._dynamo.reset()
    assert all(o <= max(s, 1) for o, s in zip(recorded["ours"], recorded["stock"])), recorded


@pytest.mark.gpu
@pytest.mark.parametrize("mode", sorted(DECODE_MODES))
def test_captured_steps_run_decode_linear_and_equal_uncaptured_steps(tk, decode_gemms, mode):
    """The decode GEMMs chosen at capture: the captured step's decode_linear calls happen once (the
    warm-up and the capture), its replays equal the uncaptured steps bit for bit; with FP8 weights the
    logits stay near the bf16 model's (relative error and cosine of the prefill's)."""
    keywords, batch = DECODE_MODES[mode]
    bf16 = small_model("llama", torch.bfloat16, "cuda")
    model = small_model("llama", torch.bfloat16, "cuda")
    kernels = CountingKernels(tk)
    inject(model, kernels, **keywords)
    ids, mask = prompts(batch, 11, device="cuda", pad=2 if batch > 1 else 0)
    reference = CapturedDecoder(model, batch, 64, capture=False)
    decoder = capture_decode(model, batch, 64)
    ref_logits, logits = reference.prefill(ids, mask), decoder.prefill(ids, mask)
    assert torch.equal(ref_logits, logits)
    with torch.no_grad():  # the positions the decoder's prefill gives left-padded rows
        want = bf16(ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits[:, -1].float()
    rel = ((logits.float() - want).norm() / want.norm()).item()
    cos = torch.nn.functional.cosine_similarity(logits.float().flatten(), want.flatten(), dim=0).item()
    assert rel < (0.02 if mode == "bf16" else 0.1) and cos > 0.995, (rel, cos)
    kernels.calls.clear()
    for _ in range(12):
        token = ref_logits.argmax(-1)
        ref_logits, logits = reference.step(token), decoder.step(token)
        assert torch.equal(logits, ref_logits)
    # 8 GEMMs a step: 12 uncaptured steps, and the captured decoder's 2 warm-up steps and its capture
    assert kernels.calls["decode_linear"] == 8 * (12 + decoder.warmup_steps + 1), kernels.calls


@pytest.mark.gpu
def test_a_compiled_decode_step_with_fp8_weights_equals_eager(tk, decode_gemms):
    """Inductor, fullgraph: the weight-only decode step (decode_linear on e4m3 codes) compiles whole
    and gives the eager step's logits."""
    model = small_model("llama", torch.bfloat16, "cuda")
    inject(model, tk, fp8=True, fp8_weights_only=True)
    ids = torch.randint(0, 101, (4, 1), device="cuda")
    torch._dynamo.reset()
    with torch.no_grad():
        expected = model(ids, use_cache=False).logits
        compiled = torch.compile(lambda i: model(i, use_cache=False).logits, fullgraph=True)(ids)
    torch.testing.assert_close(compiled, expected, rtol=0.02, atol=0.02)
    torch._dynamo.reset()
