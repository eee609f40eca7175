"""The fakes check like the kernels: each bad-input case raises the same exception type with the same
message on meta tensors (the fake impl, which runs the op's C++ checks on meta stand-ins:
torch-ext/<package>/_fake.py) as on CUDA tensors (the kernel's binding), so that torch.compile
refuses it at trace time rather than at run time. Cases the stand-ins cannot show (memory shared
between tensors, devices, pointer alignment) are the binding's alone (test_reliability_validation).

The cases are the families' (``BAD_INPUTS`` in tests/<family>/<family>_reliability.py). Each builds
its tensors on the device it is given; its 2^31 rows (named ``..._2_31_...``) come from expanded views
(no memory on either device)."""

import re

import pytest
import torch

import op_catalog as oc
from families import gathered

# name -> (call(tk, device), exception type, message regex): each family's BAD_INPUTS
# (tests/<family>/<family>_reliability.py)
CASES = gathered("reliability", "BAD_INPUTS")


def raised(call):
    """(type, message) of what call() raises; fails if it returns."""
    try:
        call()
    except Exception as e:  # noqa: BLE001 (the type is what is compared)
        return type(e), str(e).splitlines()[0]
    pytest.fail("no exception")


def normalized(message):
    """The message without device names and addresses (meta and cuda say them differently)."""
    return re.sub(r"\b(meta|cuda(:\d+)?|cpu)\b", "<device>", message)


@pytest.mark.parametrize("case", sorted(CASES))
def test_fake_raises_like_the_kernel_on_meta(tk, case):
    call, exc, message = CASES[case]
    kind, text = raised(lambda: call(tk, "meta"))
    assert kind is exc and re.search(message, text), f"{case} on meta: {kind.__name__}: {text}"


# The cases over 2^31 rows (expanded views: no memory behind them) would launch over the whole grid
# if a check were missing: on CUDA each runs in a child process (process_guard's `isolated`), so a
# device assert cannot poison the worker's other tests.
CUDA_CASES = [pytest.param(case, marks=pytest.mark.isolated) if "2_31" in case else case for case in sorted(CASES)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CUDA_CASES)
def test_meta_and_cuda_raise_the_same(tk, case):
    call, exc, message = CASES[case]
    on_meta, on_cuda = raised(lambda: call(tk, "meta")), raised(lambda: call(tk, "cuda"))
    torch.cuda.synchronize()
    assert on_cuda[0] is exc and re.search(message, on_cuda[1]), f"{case} on CUDA: {on_cuda}"
    assert on_meta[0] is on_cuda[0] and normalized(on_meta[1]) == normalized(on_cuda[1]), (on_meta, on_cuda)


def test_under_compile_the_trace_refuses(tk):
    """torch.compile traces with fake tensors: a bad input fails while tracing, with the kernel's message."""
    torch._dynamo.reset()

    def f(x, w):
        return tk.rms_norm(x, w, -1.0)

    x, w = torch.empty(4, 64, device="meta", dtype=torch.bfloat16), torch.empty(64, device="meta", dtype=torch.bfloat16)
    with pytest.raises(Exception, match="eps must be a finite number >= 0"):
        torch.compile(f, backend="eager", fullgraph=True)(x, w)


def test_valid_views_of_one_buffer_pass_the_fakes(tk):
    """Inputs that are views of one fused projection (q and k of Qwen3's QKV) are valid; the stand-ins
    have no addresses, so memory shared between tensors is left to the kernel at run time (the H200's
    opcheck of hf_qk_norm_rope_out failed with "q_out must not share memory with q" before)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        qkv = torch.empty(2, 8, 8 * 128, device="cuda", dtype=torch.bfloat16)
        q, k = qkv[..., :4 * 128].unflatten(-1, (4, 128)), qkv[..., 4 * 128:6 * 128].unflatten(-1, (2, 128))
        w, cos = torch.empty(128, device="cuda", dtype=torch.bfloat16), torch.empty(2, 8, 128, device="cuda",
                                                                                      dtype=torch.bfloat16)
        outs = (torch.empty_like(q, memory_format=torch.contiguous_format), torch.empty_like(k, memory_format=torch.contiguous_format))
        tk.ops.hf_qk_norm_rope_out(*outs, q, k, w, w, 1e-6, cos, cos)
        q_out, k_out = tk.hf_qk_norm_rope(q, k, w, w, 1e-6, cos, cos)
        assert q_out.shape == q.shape and k_out.shape == k.shape


@pytest.mark.parametrize("name", sorted(oc.ENTRIES))
def test_every_catalog_call_passes_its_fake(tk, name):
    """The catalog's valid calls (every case and dtype, on fake CUDA tensors: views of one buffer,
    offsets, strides, empty tensors) pass the fakes' checks: the stand-ins refuse nothing the kernel takes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    for case in oc.cases_of(name):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            with FakeTensorMode(allow_non_fake_inputs=True):
                call = oc.build(name, dtype, case, "cuda")
                getattr(tk.ops, call.op)(*call.args)


def test_a_cpu_tensor_beside_a_meta_one_is_refused_not_faked(tk):
    """rms_norm(x on the CPU, weight on meta) reaches the fake (meta dispatches first), which used to
    return an uninitialised CPU tensor; torch's own ops raise there, and so do ours, naming the
    argument and both devices, whichever of the two is on the CPU."""
    with pytest.raises(ValueError, match=r"rms_norm: weight must be on the same device as x \(cpu\), got meta"):
        tk.rms_norm(torch.randn(4, 64), torch.empty(64, device="meta"), eps=1e-5)
    with pytest.raises(ValueError, match=r"rms_norm: weight must be on the same device as x \(meta\), got cpu"):
        tk.rms_norm(torch.empty(4, 64, device="meta"), torch.randn(64), eps=1e-5)
    with pytest.raises(ValueError, match=r"linear_fp8: x_scale must be on the same device as x \(cpu\), got meta"):
        tk.linear_fp8(torch.empty(4, 64, dtype=torch.float8_e4m3fn), torch.empty(4, 1, device="meta"),
                      torch.empty(32, 64, device="meta", dtype=torch.float8_e4m3fn), torch.empty(32, 1, device="meta"))


def test_a_trace_gives_inductor_a_direct_fallback_for_every_op(tk):
    """Inductor lowers an op it has no lowering for through an 'implicit fallback' whose log line
    formats the op's input IR eagerly, a string exponential in the depth of the graph behind it:
    torch.compile of a whole injected LTX-Video transformer (28 blocks of our ops) never finished its
    first call on an H100 (2026-12-06: the main thread in ir.py's __str__, recursively). The first
    fake call on fake tensors registers every op of the build with inductor, with the layout
    constraint the implicit path would give it, so that path is never taken. (The compile itself is
    the GPU test's: tests/integration/test_integration_diffusers.py.)"""
    lowering = pytest.importorskip("torch._inductor.lowering")
    from torch._library.utils import get_layout_constraint_tag
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        tk.rms_norm(torch.empty(7, 128, dtype=torch.float16), None, 1e-5)
    prefix = tk.add_op_namespace_prefix("")
    ours = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith(prefix)]
    assert len(ours) > 50, ours
    for qualified in ours:
        name, _, overload = qualified[len(prefix):].partition(".")
        op = getattr(getattr(tk.ops, name), overload or "default")
        assert op in lowering.lowerings, f"{qualified}: inductor would take its implicit fallback"
        expected = lowering.tag_to_layout_constraint(get_layout_constraint_tag(op, with_default=True))
        assert lowering.maybe_layout_constraints(op) is expected, qualified


DEEP_CHAIN = """
import sys, time, torch, kernels
tk = kernels.get_kernel(sys.argv[1], version=int(sys.argv[2]))
def chain(h, w, g):
    for _ in range(32):  # each step reads h twice: the implicit fallback's string doubles a step
        h = tk.ops.gated_add(h, tk.ops.rms_norm(h, w, 1e-6, "hf"), g)
    return h
x, w, g = (torch.randn(*s, device="cuda", dtype=torch.bfloat16) for s in ((8, 256), (256,), (256,)))
start = time.perf_counter()
out = torch.compile(chain, fullgraph=True)(x, w, g)
torch.cuda.synchronize()
assert torch.equal(out, chain(x, w, g)), "compiled chain differs from eager"
print(f"compiled in {time.perf_counter() - start:.1f} s")
"""


@pytest.mark.gpu
def test_compiling_a_deep_graph_of_our_ops_ends(tk):
    """The hang itself, in a child process with a time limit: a chain of 32 (rms_norm, gated_add)
    steps, each reading the previous output twice, compiles with inductor in seconds (the implicit
    fallback's string of it would have 2^32 terms) and gives eager's bits."""
    import subprocess
    import sys

    from conftest import REPO_ID, VERSION

    run = subprocess.run([sys.executable, "-c", DEEP_CHAIN, REPO_ID, str(VERSION)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and "compiled in" in run.stdout, run.stdout + run.stderr[-3000:]
