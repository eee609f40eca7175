"""Every op is CUDA-graph safe: captured in a torch.cuda.CUDAGraph, replayed on new inputs copied
into the static buffers, it gives eager's bits; a first call made during capture (no warm-up) is
legal; under torch.compile(mode="reduce-overhead") no op makes inductor skip CUDA graphs.

Each registered op (functional, out= and in-place forms) runs at a main shape of the models it
serves and, where an op has more than one launch path (whole-row or split norms, the shared-table
and one-row q/k norm + RoPE, the cuBLASLt epilogue or the separate GEMM), at a shape of each.

What reading the launchers and bindings found (the rules this file checks on the GPU):
- every output and workspace comes from at::empty (the caching allocator; the split-row norm
  statistics too), every launch and cublasLtMatmul goes to at::cuda::getCurrentCUDAStream();
- no host synchronization and no host read of device memory: launch choices use sizes, strides,
  pointer alignment, cached device properties and cudaFuncGetAttributes (max_block_threads, once
  per kernel in a static; a host query, not a stream operation); rope_cached_'s positions are
  read on the device only;
- cudaGetLastError after launches, cuBLASLt's descriptor and heuristic calls: host-only;
- a path chosen at capture (vector width, split rows, epilogue or separate GEMM) is baked into the
  graph with the addresses it was chosen for, which replays keep."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import ROOT
from families import gathered
from op_catalog import QUERY_OPS
from reliability_inputs import BF16, neox_table, rand

gpu = pytest.mark.gpu

# name -> (inputs(): the tensors a replay reads (refilled per replay), call(tk, inputs) -> outputs):
# each family's CUDA_GRAPH_CASES (tests/<family>/<family>_reliability.py), named "op" or "op/label".
# In-place ops work on clones made inside the call, so a replay never reads its own output.
CASES = gathered("reliability", "CUDA_GRAPH_CASES")


def refill(static, fresh):
    """Copies fresh values into the static inputs in place (views of one buffer: the buffer)."""
    for name, t in static.items():
        if t._base is None:
            t.copy_(fresh[name])
    for name, t in static.items():  # views whose base is not among the inputs
        if t._base is not None and not any(t._base is s for s in static.values()):
            t.copy_(fresh[name])


def capture(tk, call, static, warmup=True):
    if warmup:  # what torch's docs ask before capture; the cold test below goes without
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            call(tk, static)
        torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = call(tk, static)
    return graph, outputs


@gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_captured_replay_matches_eager_bit_for_bit(tk, name):
    make, call = CASES[name]
    torch.manual_seed(0)
    static = make()
    graph, outputs = capture(tk, call, static)
    for seed in (1, 2):
        torch.manual_seed(seed)
        fresh = make()
        refill(static, fresh)
        for o in outputs:
            o.fill_(float("nan"))
        graph.replay()
        expected = call(tk, fresh)
        assert len(expected) == len(outputs)
        for got, want in zip(outputs, expected):
            assert torch.equal(got, want), f"{name}: replay {seed} differs from eager"
    del graph


def test_every_registered_op_has_a_capture_case():
    registered = set(re.findall(r'ops\.def\("(\w+)\(', (ROOT / "torch-ext" / "torch_binding.cpp").read_text()))
    assert len(registered) > 50, registered
    covered = {name.split("/")[0] for name in CASES}
    # host-side queries (the catalog's QUERY_OPS): nothing to capture
    assert registered - set(QUERY_OPS) - covered == set(), "ops without a CUDA-graph case"


COLD_CAPTURE = textwrap.dedent("""
    import sys, torch
    sys.path[:0] = [{here!r}, {tests!r}, {root!r}, {integration!r}]
    from transformer_kernels_integrations.loading import load_kernel, use_local_build
    use_local_build()
    import test_cuda_graphs as t
    tk = load_kernel()
    # torch's own cuBLAS/cuBLASLt handles and workspaces, on the stream torch.cuda.graph captures on
    # (torch's warm-up, not ours: none of our ops has run in this process)
    torch.cuda.graph(torch.cuda.CUDAGraph())  # creates torch.cuda.graph.default_capture_stream
    with torch.cuda.stream(torch.cuda.graph.default_capture_stream):
        bf = dict(device="cuda", dtype=torch.bfloat16)
        torch.nn.functional.linear(torch.ones(64, 64, **bf), torch.ones(64, 64, **bf), torch.ones(64, **bf))
        torch.nn.functional.linear(torch.ones(2, 3, 64, **bf), torch.ones(64, 64, **bf))
    torch.cuda.synchronize()
    for name in sorted(t.CASES):
        make, call = t.CASES[name]
        torch.manual_seed(0)
        static = make()
        graph, outputs = t.capture(tk, call, static, warmup=False)
        graph.replay()
        expected = call(tk, static)
        assert all(torch.equal(a, b) for a, b in zip(outputs, expected)), name
    print("cold captures ok:", len(t.CASES))
""")


@gpu
def test_first_call_inside_capture_is_legal():
    """Each op's first call in a fresh process happens during capture: its one-time host queries
    (cudaFuncGetAttributes behind the block-size limits, cached in statics; cuBLASLt's heuristic)
    and the lazy loading of its kernels are legal there, and the replay gives eager's bits."""
    script = COLD_CAPTURE.format(here=str(Path(__file__).resolve().parent), tests=str(ROOT / "tests"), root=str(ROOT),
                                 integration=str(ROOT / "integration"))
    env = dict(os.environ, CUDA_MODULE_LOADING="LAZY")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "cold captures ok" in proc.stdout


# ---- torch.compile(mode="reduce-overhead"): no op is a reason to skip CUDA graphs ----

def _compiled_model_step(tk):
    """A small decoder-like step using every op family, as a compiled user would call them."""
    h, d, hq, hk = 512, 64, 8, 2

    def step(x, residual, w, qkv_w, cos, sin, gate_up_w, ffn_w, ffn_b, scale, shift):
        normed, residual = tk.fused_add_rms_norm(x, residual, w, 1e-6)
        qkv = normed @ qkv_w.t()
        b, s = x.shape[:2]
        q = qkv[..., : hq * d].view(b, s, hq, d).transpose(1, 2)
        k = qkv[..., hq * d: (hq + hk) * d].view(b, s, hk, d).transpose(1, 2)
        q, k = tk.apply_rotary_pos_emb(q, k, cos, sin)
        qk = tk.hf_qk_norm_rope(q.transpose(1, 2), k.transpose(1, 2), w[:d], w[:d], 1e-6, cos, sin)
        mlp = tk.silu_and_mul(normed @ gate_up_w.t())
        ffn = tk.linear_gelu(normed, ffn_w, ffn_b)
        mod = tk.norm_modulate(normed, scale, shift, norm="layer")
        mod2, gated = tk.gated_add_norm_modulate(normed, mod, scale, scale, shift)
        # in-place forms on intermediates (a mutated graph input would be the caller's reason to skip)
        x2, r2 = tk.fused_add_rms_norm_(x.clone(), residual.clone(), w, 1e-6)
        q2, k2 = tk.apply_rotary_pos_emb_(q.clone(), k.clone(), cos, sin)
        return (tk.rms_norm(mlp, None), q, k, *qk, tk.gelu(ffn, "tanh"), tk.gated_add(gated, mod2, scale), residual,
                x2, r2, q2, k2)

    x = rand(2, 1, h)
    args = (x, rand(2, 1, h), rand(h, scale=0.2), rand((hq + 2 * hk) * d, h, scale=0.05),
            neox_table(2, 1, d, BF16), neox_table(2, 1, d, BF16), rand(2 * 1024, h, scale=0.05),
            rand(2048, h, scale=0.05), rand(2048, scale=0.1), rand(2, 1, h, scale=0.2), rand(2, 1, h, scale=0.2))
    return step, args


@gpu
def test_reduce_overhead_records_cuda_graphs_without_skips(tk):
    from torch._dynamo.utils import counters

    step, args = _compiled_model_step(tk)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    with torch._inductor.config.patch({"triton.cudagraph_or_error": True}):  # a skip raises, with its reason
        for _ in range(4):
            torch.compiler.cudagraph_mark_step_begin()
            outputs = compiled(*args)
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
    eager = step(*args)
    for got, want in zip(outputs, eager):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)  # inductor fuses the aten ops in between
