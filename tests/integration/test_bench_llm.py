"""benchmarks/bench_llm.py's modes run on the CPU with the eager stand-ins and a small Llama config (the
code a GPU call runs, without the GPU): each mode at batch 1 and 8 gives its decode timing, floor
bytes and, with our kernels, the logits' quality against the bf16 model; the markdown has a row for
each. The numbers themselves come from the GPU."""

import pytest
import torch

from conftest import FULL_CHECKOUT, ROOT
from eager_kernel import eager_kernel

if not FULL_CHECKOUT:
    pytest.skip("benchmarks/ is not in this source set", allow_module_level=True)

transformers = pytest.importorskip("transformers")
from test_integration_transformers import restore_rotary_functions  # noqa: E402, F401 (autouse)
from transformer_kernels_integrations import cuda_graphs, decode, fp8, transformers_models  # noqa: E402

SMALL = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=101, max_position_embeddings=256)


@pytest.fixture
def bench(monkeypatch):
    import sys

    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import bench_llm

    monkeypatch.setattr(bench_llm, "DEVICE", "cpu")
    monkeypatch.setattr(bench_llm, "LLAMA_31_8B", SMALL)
    monkeypatch.setattr(bench_llm, "load_kernel", eager_kernel)
    monkeypatch.setattr(bench_llm, "copy_gbps", lambda bytes_each_way=0: 1000.0)
    monkeypatch.setattr(bench_llm, "wall_time_s", lambda fn, repeats: (fn(), 0.01 * repeats)[1])
    monkeypatch.setattr(cuda_graphs, "capture_decode", lambda model, batch, length, **kw: cuda_graphs.CapturedDecoder(
        model, batch, length, capture=False))
    monkeypatch.setattr(transformers_models, "KERNEL_DEVICES", ("cpu",))
    monkeypatch.setattr(decode, "BF16_MIN_OUT_FEATURES", 16)
    monkeypatch.setattr(fp8, "FP8_MIN_FEATURES", 16)
    torch.set_default_dtype(torch.float32)
    yield bench_llm
    sys.modules.pop("benchmarks.bench_llm", None)


def test_the_decode_modes_run_and_report_floor_and_quality(bench):
    args = bench.parse_args(["--modes", "hf-eager,ours+graphs,ours-fp8w+graphs", "--batch-sizes", "1,8",
                             "--decode-tokens", "4", "--prefill-tokens", "16", "--repeats", "1", "--no-isolate"])
    results = [r for mode in args.modes for r in bench.run_mode(args, mode)]
    assert [(r["mode"], r["batch"]) for r in results] == [(m, b) for m in args.modes for b in (1, 8)]
    assert not [r["error"] for r in results if "error" in r]
    by = {(r["mode"], r["batch"]): r for r in results}
    bf16, fp8_weights = by[("ours+graphs", 1)], by[("ours-fp8w+graphs", 1)]
    assert "fp8_weight_only" in fp8_weights["injection"] and "decode_linear" in bf16["injection"]
    # the FP8 layers' weights read one byte each (and their scales), the KV bytes grow with the batch
    assert fp8_weights["decode_weight_bytes"] < 0.75 * bf16["decode_weight_bytes"]
    assert by[("ours+graphs", 8)]["decode_kv_bytes"] == 8 * bf16["decode_kv_bytes"] > 0
    assert "quality" not in by[("hf-eager", 1)] or by[("hf-eager", 1)]["quality"] is None
    q = fp8_weights["quality"]
    assert set(q) == {"prefill", "step", "step1"} and all(0 < v["rel_l2"] < 0.1 and v["cosine"] > 0.99
                                                         for v in q.values()), q
    assert all(v["rel_l2"] < 0.01 for v in bf16["quality"].values()), bf16["quality"]
    md = bench.markdown(args, {"gpu": "cpu", "torch": torch.__version__, "cuda": None, "date": "today"}, results,
                        1000.0)
    assert md.count("| ours-fp8w+graphs | ") == 2 + 3 and "| hf-eager | 8 | eager |" in md
    assert "failed" not in md
