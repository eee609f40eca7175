"""scripts/sanitize.sh's attribution of compute-sanitizer errors to kernels (tests/sanitize/summarize.py),
on logs in compute-sanitizer's formats with planted errors: one in a kernel of ours is counted as
ours and fails the verdict; library kernels' errors are listed by name and do not."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sanitize"))

import summarize  # noqa: E402

OURS = "void transformer_kernels::rms_norm_kernel<__nv_bfloat16, 8>"
MEMCHECK_OURS = f"""========= COMPUTE-SANITIZER
driver: 3 calls (1 entries, 1 dtypes, cases small); op namespace _transformer_kernels_cuda_abc1234
========= Invalid __global__ write of size 2 bytes
=========     at {OURS}(const __nv_bfloat16 *, __nv_bfloat16 *, int)+0x1f0 in /work/csrc/norm/norm_kernel.cuh:201
=========     by thread (5,0,0) in block (0,0,0)
=========     Address 0x7f0000001000 is out of bounds
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: [0x2f1a3] in libcuda.so.1
=========
========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call to cudaDeviceSynchronize.
=========     Saved host backtrace up to driver entry point at error
=========         Host Frame: [0x2f1a3] in libcuda.so.1
=========
driver: 3 calls in 2 s, 0 failures
========= ERROR SUMMARY: 2 errors
"""
INITCHECK_LIBRARY = """========= COMPUTE-SANITIZER
driver: 3 calls (1 entries, 1 dtypes, cases small); op namespace _transformer_kernels_cuda_abc1234
========= Uninitialized __global__ memory read of size 4 bytes
=========     at nvjet_sm90_tst_128x128_64x4_2x1_v_bz_splitK_TNT+0x2a0
=========     by thread (0,0,0) in block (3,0,0)
=========
========= Uninitialized __global__ memory read of size 4 bytes
=========     at nvjet_sm90_tst_128x128_64x4_2x1_v_bz_splitK_TNT+0x2b0
=========     by thread (1,0,0) in block (3,0,0)
=========
driver: 3 calls in 2 s, 0 failures
========= ERROR SUMMARY: 2 errors
"""
RACECHECK_OURS = f"""driver: 3 calls (1 entries, 1 dtypes, cases small); op namespace _transformer_kernels_cuda_abc1234
========= Error: Race reported between Write access at {OURS}(const __nv_bfloat16 *, __nv_bfloat16 *, int)+0x300 in /work/csrc/common/reduce.cuh:40
=========     and Read access at {OURS}(const __nv_bfloat16 *, __nv_bfloat16 *, int)+0x340 in /work/csrc/common/reduce.cuh:44 [64 hazards]
=========
driver: 3 calls in 2 s, 0 failures
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""


def test_an_error_in_our_kernel_is_ours_and_fails():
    entry = summarize.summarize_tool(MEMCHECK_OURS)
    # the host API error that follows has no kernel: it is left unattributed, which also fails the verdict
    assert entry["errors_by_kernel"] == {OURS: 1}
    assert entry["errors"] == 2 and entry["errors_in_our_kernels"] == 1
    assert not summarize.tool_is_clean(entry)


def test_library_errors_are_listed_and_pass():
    entry = summarize.summarize_tool(INITCHECK_LIBRARY)
    assert entry["errors_by_kernel"] == {"nvjet_sm90_tst_128x128_64x4_2x1_v_bz_splitK_TNT": 2}
    assert entry["errors_in_our_kernels"] == 0 and summarize.tool_is_clean(entry)


def test_a_race_in_our_kernel_is_ours():
    entry = summarize.summarize_tool(RACECHECK_OURS)
    assert entry["errors"] == 1 and entry["errors_by_kernel"] == {OURS: 1}
    assert not summarize.tool_is_clean(entry)


def test_an_unfinished_or_failing_driver_is_not_clean():
    assert not summarize.tool_is_clean(summarize.summarize_tool(INITCHECK_LIBRARY, rc="124"))
    failing = INITCHECK_LIBRARY.replace("0 failures", "2 failures")
    assert not summarize.tool_is_clean(summarize.summarize_tool(failing))
    assert not summarize.tool_is_clean(summarize.summarize_tool("no driver output at all"))


def test_planted_self_check():
    ours, lib = summarize.PLANTED_OURS, summarize.PLANTED_LIBRARY
    one = lambda name: (f"========= Invalid __global__ write of size 4 bytes\n=========     at {name}(float *, int)+0x70\n"
                        f"=========     by thread (0,0,0) in block (0,0,0)\n=========\n"
                        "========= Program hit cudaErrorLaunchFailure (error 719) on CUDA API call to cudaDeviceSynchronize.\n"
                        "=========     Saved host backtrace up to driver entry point at error\n"
                        "=========         Host Frame: main [0x8d3a] in planted\n=========\n"
                        "========= ERROR SUMMARY: 2 errors\n")
    none = "========= ERROR SUMMARY: 0 errors\n"
    assert summarize.check_planted(one(ours), none, one(lib)) == []
    # a filter that lets nothing through, or lets the library kernel through, is caught
    assert summarize.check_planted(none, none, one(lib))
    assert summarize.check_planted(one(ours), one(lib), one(lib))


def test_internal_sanitizer_error_is_unattributed():
    log = ("========= Internal Sanitizer Error: The Sanitizer failed to handle a hardware exception.\n=========\n"
           "  EXCEPTION: linear_gelu small torch.float16: AcceleratorError\n"
           f"========= Invalid __global__ read of size 2 bytes\n=========     at {OURS}(int)+0x10\n"
           "========= ERROR SUMMARY: 2 errors\n")
    assert summarize.errors_by_kernel(log) == {OURS: 1}


def test_probe_report_splits_by_step():
    log = ("probe a: first\n"
           "========= Uninitialized __global__ memory read of size 16 bytes\n"
           "=========     at void at::native::copy_kernel<float>(int)+0x10\n=========\n"
           "probe b: second\n========= ERROR SUMMARY: 1 error\n")
    assert summarize.probe_report(log).splitlines() == [
        "before the first step: no errors", "probe a: first: {'void at::native::copy_kernel<float>': 1}",
        "probe b: second: no errors"]


GELU = "void transformer_kernels::kernel_entry<transformer_kernels::ElementwiseParams<__half>>"


def host_copy_error(address: int, size: int) -> str:
    return (f"========= Host API memory access error at host access to {address:#x} of size {size:,} bytes\n"
            f"=========     Uninitialized access to {address:#x} on access by cudaMemcpy source\n"
            "=========     Saved host backtrace up to driver entry point at error\n"
            "=========         Host Frame: cudaMemcpyAsync [0x70eec] in libcudart.so.13\n=========\n")


def read_error(kernel: str, address: int) -> str:
    return (f"========= Uninitialized __global__ memory read of size 16 bytes\n=========     at {kernel}(T1)+0x2610\n"
            f"=========     by thread (0,0,0) in block (0,0,0)\n=========     Address {address:#x}\n"
            "=========     Saved host backtrace up to driver entry point at kernel launch time\n"
            "=========         Host Frame: cudaLaunchKernel [0x745b7] in libcudart.so.13\n=========\n")


def probe_log(read_address: int, copy_reported: bool = True) -> str:
    base = 0x7f0000000000
    return ("probe torch.float16: F.linear, then torch's copy of its output\n"
            + (host_copy_error(base, 1920) if copy_reported else "")
            + "probe torch.float16: our gelu reading F.linear's output itself, into a fresh output\n"
            + read_error(GELU, base) + read_error(GELU, read_address) + "probe end\n")


def test_a_host_copy_of_uninitialized_memory_is_attributed_to_the_api():
    log = host_copy_error(0x7f0000000000, 1920) + "========= ERROR SUMMARY: 1 error\n"
    assert summarize.errors_by_kernel(log) == {"host API: cudaMemcpy source": 1}
    assert summarize.tool_is_clean(summarize.summarize_tool(log + "driver: 1 calls in 1 s, 0 failures\n"))


def test_gemm_stores_untracked_needs_the_copy_reported_and_every_read_inside_the_output():
    base = 0x7f0000000000
    assert summarize.gemm_stores_untracked(probe_log(base + 1904))
    assert not summarize.gemm_stores_untracked(probe_log(base + 1920)), "a read past the GEMM's output"
    assert not summarize.gemm_stores_untracked(probe_log(base + 16, copy_reported=False)), \
        "initcheck saw the GEMM's stores: the reads are real"
    assert not summarize.gemm_stores_untracked("probe end\n")


def test_only_linear_gelu_calls_reads_of_gemm_output_are_counted_apart():
    log = ("driver: 2 calls (2 entries, 1 dtypes, cases strided); op namespace _transformer_kernels_cuda_abc1234\n"
           "[1/2] linear_gelu[no_bias] strided float16\n" + read_error(GELU, 0x7f0000000000)
           + "[2/2] gelu strided float16\n" + read_error(GELU, 0x7f0000001000)
           + "driver: 2 calls in 1 s, 0 failures\n========= ERROR SUMMARY: 2 errors\n")
    apart = summarize.summarize_tool(log, gemm_stores_unseen=True)
    assert apart["gemm_output_reads_unseen"] == 1 and apart["errors_in_our_kernels"] == 1
    assert not summarize.tool_is_clean(apart), "the gelu call's uninitialized read is ours"
    plain = summarize.summarize_tool(log)
    assert plain["gemm_output_reads_unseen"] == 0 and plain["errors_in_our_kernels"] == 2
