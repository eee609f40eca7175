"""Every op (tests/op_catalog.py), every dtype, every access path: the same bits on a rerun, empty
tensors, the current stream of the tensors' device (a launch on another stream reads unready data
and fails), tensors on a device other than the current one, and operands on two devices.

The catalog's coverage of the ops registered in torch-ext/torch_binding.cpp is checked on the CPU."""

import re
from pathlib import Path

import pytest
import torch

import op_catalog as oc
from eager_kernel import eager_kernel
from families import gathered
from helpers import DTYPES

ROOT = Path(__file__).resolve().parents[2]
ENTRY_CASES = [(name, case) for name in oc.ENTRIES for case in oc.cases_of(name)]
TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2,
                              reason=f"needs two GPUs: torch.cuda.device_count() is {torch.cuda.device_count()}")
# op -> what its "empty_width" case gives (tests/<family>/<family>_reliability.py; check_empty)
EMPTY_WIDTH_RESULTS = gathered("reliability", "EMPTY_WIDTH_RESULTS")
# torch.cuda._sleep cycles (~25-50 ms at 1-2 GHz): far longer than any catalog call takes.
SLEEP_CYCLES = 50_000_000


def registered_ops() -> list[str]:
    """The ops torch_binding.cpp defines (ops.def("name(...")."""
    text = (ROOT / "torch-ext" / "torch_binding.cpp").read_text()
    return sorted(set(re.findall(r'ops\.def\(\s*"([A-Za-z0-9_]+)\(', text)))


def test_catalog_covers_every_registered_op():
    """A new op gets an entry in its family's catalog cases (tests/<family>/<family>_cases.py): the
    sanitizer run, the rerun, stream and device tests then cover it."""
    missing = sorted(set(registered_ops()) - set(oc.COVERED_OPS))
    assert not missing, f"ops with no catalog entry in tests/<family>/<family>_cases.py (one per form): {missing}"
    assert registered_ops(), "no ops.def( found in torch_binding.cpp"


@pytest.mark.parametrize("name,case", ENTRY_CASES)
def test_catalog_builds_valid_arguments_on_cpu(name, case):
    """Every entry builds its arguments (shapes, layouts, dtypes) for every dtype, the same for the
    same seed; out= buffers start as NaN. The call runs through the op's schema on the CPU with the
    eager code in place of the kernel (tests/eager_kernel.py) and writes every output element."""
    for dtype in DTYPES:
        call = oc.build(name, dtype, case, device="cpu", seed=1)
        again = oc.build(name, dtype, case, device="cpu", seed=1)
        for a, b in zip(call.args, again.args):
            if isinstance(a, torch.Tensor):
                assert a.shape == b.shape and a.stride() == b.stride() and oc.same_bits(a, b)
        if not call.op.endswith("_"):  # out= buffers (in-place ops write their inputs)
            assert all(call.args[i].isnan().all() for i in call.writes)
        for i, out in enumerate(call(eager_kernel())):
            assert not out.isnan().any(), f"{name} {case} {dtype}: output {i} has NaN with the eager ops"
    floats = [a for a in call.args if isinstance(a, torch.Tensor) and a.is_floating_point()]
    if case == "unaligned":  # the first operand (or out= buffer) one element (a pair) past its alignment
        assert floats[0].storage_offset() in (1, 2)
    if case == "strided":  # the first operand (not an out= buffer) a strided view
        assert not next(a for a in floats if a.dim() >= 2 and not a.isnan().any()).is_contiguous()


def run_fresh(tk, name, dtype, case, seed, device="cuda"):
    return oc.build(name, dtype, case, device, seed)(tk)


def assert_same_bits(outs, expected, what):
    assert len(outs) == len(expected)
    for i, (a, b) in enumerate(zip(outs, expected)):
        assert oc.same_bits(a, b.to(a.device)), f"{what}: output {i} differs"


@pytest.mark.gpu
@pytest.mark.parametrize("name,case", ENTRY_CASES)
def test_rerun_gives_the_same_bits(tk, name, case, seed_from_node_id):
    """The same inputs (fresh buffers in the same layout) give the same bits; every output is written
    (out= buffers start as NaN, functional outputs are allocated from NaN: conftest.poison_outputs)."""
    for dtype in DTYPES:
        first = run_fresh(tk, name, dtype, case, seed_from_node_id)
        second = run_fresh(tk, name, dtype, case, seed_from_node_id)
        assert_same_bits(second, first, f"{name} {case} {dtype}")
        for i, out in enumerate(first):
            assert not out.isnan().any(), f"{name} {case} {dtype}: output {i} not all written (NaN left)"


def check_empty(tk, name, device):
    """No tokens (and rows of no elements) give empty outputs, and the gradients of parameters (and a
    summed loss) are sums over nothing: zeros of the parameter's shape. Rows of no elements of an
    FP8 quantization give the floor's scales (1e-12 / 448); where an op's rows of no elements give
    something else (a linear's output: gelu_tanh(bias), the bias, 0; a cross-entropy's logits 0:
    log(vocabulary) per token not ignored), its family says what (EMPTY_WIDTH_RESULTS)."""
    cases = [c for c in ("empty", "empty_width") if c in oc.cases_of(name)]
    for dtype in DTYPES:
        for case in cases:
            call = oc.build(name, dtype, case, device, 0)
            outs = call(tk)
            what = f"{name} {case} {dtype}"
            assert outs, what
            rest = list(outs)
            if case == "empty_width" and call.op in EMPTY_WIDTH_RESULTS:
                rest = EMPTY_WIDTH_RESULTS[call.op](call, rest, what)
                if rest is None:
                    continue
            fp8 = [i for i, o in enumerate(outs) if o.dtype == torch.float8_e4m3fn]
            if fp8 and case == "empty_width":  # each row of no elements: the floor's scale beside its codes
                codes, scale = outs[fp8[0]], outs[fp8[0] + 1]
                assert codes.numel() == 0 and scale.shape == (*codes.shape[:-1], 1) and scale.numel(), what
                assert bool((scale.cpu() == torch.tensor(1e-12, dtype=torch.float32) / 448).all()), what
                assert all(o.numel() == 0 for i, o in enumerate(outs) if i not in (fp8[0], fp8[0] + 1)), what
                continue
            assert any(o.numel() == 0 for o in outs), f"{what}: the token-shaped output is not empty"
            for i, o in enumerate(rest):
                assert o.numel() == 0 or bool((o == 0).all()), f"{what}: output {i} is neither empty nor zeros"


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(oc.ENTRIES))
def test_empty_tensors(tk, name):
    """No tokens (and, for row ops, rows of no elements) for every op: no launch, no error, empty
    outputs (check_empty)."""
    check_empty(tk, name, "cuda")
    torch.cuda.synchronize()


@pytest.mark.parametrize("name", list(oc.ENTRIES))
def test_empty_tensors_expectations_on_cpu(name):
    """The same expectations met by the eager code in place of the kernel (tests/eager_kernel.py)."""
    check_empty(eager_kernel(), name, "cpu")


def unready(call, stream):
    """The call's inputs NaN (positions out of range) on the current stream now, their values written
    back on `stream` only after a sleep: a launch on any other stream reads the placeholders."""
    values = {i: call.args[i].clone() for i in call.tensor_positions()}
    for i in values:
        a = call.args[i]
        a.fill_(oc.MAX_POSITION + 1 if not a.is_floating_point() else float("nan"))
    torch.cuda.synchronize(call.args[call.tensor_positions()[0]].device)
    stream.wait_stream(torch.cuda.current_stream(stream.device))

    def restore():
        torch.cuda._sleep(SLEEP_CYCLES)
        for i, v in values.items():
            call.args[i].copy_(v)

    return restore


def run_on_side_stream(tk, call, device):
    side = torch.cuda.Stream(device=device)
    restore = unready(call, side)
    with torch.cuda.stream(side):
        restore()
        outs = call(tk)
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    return outs


STREAM_CASES = ["small", "split"]


@pytest.mark.gpu
@pytest.mark.parametrize("case", STREAM_CASES)
@pytest.mark.parametrize("name", list(oc.ENTRIES))
def test_launches_on_the_current_stream(tk, name, case):
    """On a side stream whose inputs are written only after a sleep: the op must wait for them, i.e.
    launch on that stream (all its launches, and its workspace's). A launch on the default stream
    runs at once on NaN inputs; one on a pool stream as well."""
    if case not in oc.cases_of(name):
        case = "small"
    expected = run_fresh(tk, name, torch.bfloat16, case, 7)
    outs = run_on_side_stream(tk, oc.build(name, torch.bfloat16, case, "cuda", 7), torch.device("cuda"))
    assert_same_bits(outs, expected, f"{name} {case} on a side stream")


@pytest.mark.gpu
@TWO_GPUS
@pytest.mark.parametrize("name", list(oc.ENTRIES))
def test_runs_on_the_tensors_device(tk, name):
    """Tensors on cuda:1 with cuda:0 current, and with cuda:1 current: the op runs on cuda:1 (the same
    bits as on cuda:0, outputs on cuda:1) and leaves the current device as it was."""
    expected = run_fresh(tk, name, torch.bfloat16, "small", 11, "cuda:0")
    torch.cuda.set_device(0)
    outs = run_fresh(tk, name, torch.bfloat16, "small", 11, "cuda:1")
    assert torch.cuda.current_device() == 0
    assert all(o.device == torch.device("cuda:1") for o in outs)
    assert_same_bits(outs, expected, f"{name} on cuda:1 from cuda:0")
    with torch.cuda.device(1):
        outs = run_fresh(tk, name, torch.bfloat16, "small", 11, "cuda:1")
        assert torch.cuda.current_device() == 1
    assert_same_bits(outs, expected, f"{name} on cuda:1 as the current device")
    torch.cuda.synchronize(1)


@pytest.mark.gpu
@TWO_GPUS
@pytest.mark.parametrize("name", list(oc.ENTRIES))
def test_launches_on_the_current_stream_of_the_tensors_device(tk, name):
    """cuda:0 current, the tensors on cuda:1 whose current stream is a side stream with unready
    inputs: the op must take cuda:1's current stream (not cuda:0's, not cuda:1's default)."""
    expected = run_fresh(tk, name, torch.bfloat16, "small", 13, "cuda:0")
    call = oc.build(name, torch.bfloat16, "small", "cuda:1", 13)
    side = torch.cuda.Stream(device=1)
    restore = unready(call, side)
    default1 = torch.cuda.current_stream(1)
    try:
        torch.cuda.set_stream(side)  # cuda:1's current stream (set_stream also makes cuda:1 current)
        restore()
        torch.cuda.set_device(0)
        outs = call(tk)
        assert torch.cuda.current_device() == 0
    finally:
        torch.cuda.set_stream(default1)
        torch.cuda.set_device(0)
    default1.wait_stream(side)
    torch.cuda.synchronize(1)
    assert_same_bits(outs, expected, f"{name} on cuda:1's side stream")


# (where the entry's tensors are, where one of them is moved): meta stand-ins beside a CPU tensor run
# the fakes; a CUDA call beside a CPU, meta or second-GPU tensor runs the kernels' binding.
DEVICE_MOVES = [pytest.param("meta", "cpu", id="meta-cpu"),
                pytest.param("cuda:0", "cpu", id="cuda-cpu", marks=pytest.mark.gpu),
                pytest.param("cuda:0", "meta", id="cuda-meta", marks=pytest.mark.gpu),
                pytest.param("cuda:0", "cuda:1", id="cuda-cuda1", marks=[pytest.mark.gpu, TWO_GPUS])]


def schema_names(tk, op: str) -> list[str]:
    return [a.name for a in getattr(tk.ops, op).default._schema.arguments]


def moved_one_at_a_time(tk, name: str, home: str, other: str):
    """(call, argument name, args) for each tensor argument of the entry's first case moved to `other`,
    the rest on `home` (meta: stand-ins of a CPU call's tensors, strides kept)."""
    call = oc.build(name, torch.bfloat16, oc.cases_of(name)[0], "cpu" if home == "meta" else home, 17)
    names = schema_names(tk, call.op)
    on_home = [a.to(home) if isinstance(a, torch.Tensor) else a for a in call.args]
    for i in call.tensor_positions():
        args = list(on_home)
        args[i] = call.args[i].to(other)
        yield call, names[i], tuple(args)


def assert_names_device(err: ValueError, arg: str, device: str, what: str):
    message = str(err)
    assert re.search(rf"\b{re.escape(arg)}\b", message) and device in message, (
        f"{what}: the error should name the argument moved ({arg}) and its device ({device}): {message}")


@pytest.mark.parametrize("home,other", DEVICE_MOVES)
@pytest.mark.parametrize("name", list(oc.ENTRIES))
def test_a_tensor_on_another_device_raises(tk, name, home, other):
    """Each tensor argument in turn on another device than the rest: a ValueError naming that argument
    and its device (and, for the others, x's device: "w must be on the same device as x (cuda:0), got
    cpu"), never a launch reading another device's memory or a fake result of uninitialised memory."""
    if len(oc.build(name, torch.bfloat16, oc.cases_of(name)[0], "cpu", 17).tensor_positions()) < 2 and other == "meta":
        pytest.skip(f"{name} takes one tensor: on meta it is a valid call of the fake")
    for call, arg, args in moved_one_at_a_time(tk, name, home, other):
        with pytest.raises(ValueError, match="must be on the same device as|must be a CUDA tensor") as err:
            call(tk, args)
        assert_names_device(err.value, arg, other, f"{name} with {arg} on {other}, the rest on {home}")
    if home.startswith("cuda"):
        torch.cuda.synchronize(0)


_CUDA_KEY = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)


@pytest.mark.parametrize("name", list(oc.ENTRIES))
def test_the_bindings_check_every_tensors_device(tk, name):
    """The C++ binding itself (called below the fakes, on meta stand-ins with one tensor on the CPU)
    checks every tensor argument's device: the fake's check is no substitute for the kernel's, which
    a CUDA call beside a CPU tensor reaches directly."""
    if not torch._C._dispatch_has_kernel_for_dispatch_key(tk.add_op_namespace_prefix(oc.ENTRIES[name][1]), "CUDA"):
        pytest.skip("a build without CUDA kernels")
    for call, arg, args in moved_one_at_a_time(tk, name, "meta", "cpu"):
        op = getattr(tk.ops, call.op).default
        with pytest.raises(ValueError, match="must be on the same device as|must be a CUDA tensor") as err:
            with torch._C._AutoDispatchBelowADInplaceOrView():
                op.redispatch(_CUDA_KEY, *args)
        assert_names_device(err.value, arg, "cpu", f"{name}'s binding with {arg} on the CPU, the rest on meta")
