"""Micro-benchmark harness shared by every op's benchmark.

Each case times our op and its baselines (the model library's eager code, the native PyTorch
op where one exists, ``torch.compile`` of the eager code, Liger when installed) in the same run:
median of CUDA-event timings after warm-up with the L2 flushed (``triton.testing.do_bench``),
reported as GB/s and as a percentage of a device-to-device copy measured in the same run.
Host-bound shapes (decode rows) also get the per-call time from eager Python. Compute-bound cases
(attention) give their FLOPs instead: reported as TFLOP/s in a table of their own, with each
implementation's error against a float64 reference where the case measured it.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform
import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

WARMUP_MS = 25
REP_MS = 100
COPY_BYTES = 1 << 30  # 1 GiB each way: far beyond L2, so the copy runs at HBM speed


def wall_time_s(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of fn() in seconds, synchronized (whole-model calls, host time included)."""
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


# How L2 is flushed before each timed rep. "write": triton's do_bench (a 256 MB memset), the
# benchmark of record. "read": a 256 MB read, which leaves L2 clean; the memset leaves it full of
# dirty lines that the timed kernel pays to write back (NOTES.md §Method), and this mode shows
# how much of a kernel's time that is.
FLUSH_MODES = ("write", "read")
L2_FLUSH = "write"
FLUSH_BYTES = 256 << 20


def time_ms(fn: Callable[[], object]) -> float:
    """Median device time of fn() in ms: CUDA events, warm-up, L2 flushed before each rep."""
    if L2_FLUSH == "read":
        return _time_ms_read_flush(fn)
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median"))


def _time_ms_read_flush(fn: Callable[[], object]) -> float:
    """do_bench's procedure (estimate, warm-up for WARMUP_MS, REP_MS of reps, median) with L2
    flushed by summing a 256 MB buffer instead of zeroing it."""
    cache = torch.zeros(FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")

    def timed(reps: int) -> list[float]:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for start, end in zip(starts, ends):
            cache.sum()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in zip(starts, ends)]

    fn()
    torch.cuda.synchronize()
    estimate_ms = max(statistics.median(timed(5)), 1e-3)
    for _ in range(max(1, int(WARMUP_MS / estimate_ms))):
        fn()
    return statistics.median(timed(max(1, int(REP_MS / estimate_ms))))


def call_latency_us(fn: Callable[[], object], calls: int = 2000, repeats: int = 5) -> float:
    """Per-call wall time of fn() issued back to back from Python, in µs (median of repeats).

    For tiny problems this is what a model's eager forward pays: the host issuing the call,
    not the GPU running it, is the bound."""
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def copy_gbps(bytes_each_way: int = COPY_BYTES) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second), in GB/s."""
    src = torch.empty(bytes_each_way, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    return 2 * bytes_each_way / (ms * 1e-3) / 1e9


# Cases moving at least this much also get a copy of their own size timed: a launch's ramp-up and
# tail are a fixed cost that a 64-256 MB op pays and the 2 GiB reference copy hides, so
# "% of a same-size copy" separates a kernel's own losses from its size's.
SIZE_COPY_MIN_BYTES = 1 << 20


def profile_step(step: Callable[[], object]):
    """Runs step() once under torch.profiler (after the caller's warm-up): its wall time in ms, the
    CUDA kernels it ran (profiler events) and the profiler (for its host-side averages)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3
    return wall_ms, [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA], prof


def kernel_time_us(event) -> float:
    """A profiled kernel's device time (torch renamed cuda_time_total to device_time_total)."""
    return getattr(event, "device_time_total", 0) or event.cuda_time_total


def step_profile(step: Callable[[], object], per: int = 1) -> dict:
    """One profiled call of step(): wall and GPU-busy time, the GPU's idle time between kernels, and
    kernel launches, each per `per` units (tokens, steps). Kernels replayed from a CUDA graph count
    as launches of the GPU, not of the host."""
    wall_ms, kernels, _ = profile_step(step)
    busy_ms = sum(kernel_time_us(e) for e in kernels) / 1e3
    return {"wall_ms": wall_ms / per, "gpu_busy_ms": busy_ms / per, "gpu_idle_ms": (wall_ms - busy_ms) / per,
            "kernels": len(kernels) / per}


def _git(*args: str) -> str:
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True)
        return done.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def kernel_build() -> dict:
    """Which build of the kernel ran: its op namespace (``_transformer_kernels_cuda_<tree>``, the
    first 7 hex digits of the git tree it was built from, ``_dirty`` when tracked files had
    uncommitted changes; tools/build_kernel.py), and the checkout's commit and state now."""
    namespace = None
    try:
        from transformer_kernels_integrations.loading import load_kernel

        namespace = load_kernel().add_op_namespace_prefix("x").split("::")[0]
    except Exception:  # no build loadable: the record says so (null)
        pass
    build_id = namespace.rsplit("_cuda_", 1)[-1] if namespace else None
    return {
        "op_namespace": namespace,
        "tree": build_id.removesuffix("_dirty") if build_id else None,
        "dirty": build_id.endswith("_dirty") if build_id else None,
        "commit": _git("rev-parse", "--short", "HEAD") or None,
        "checkout_tree": _git("rev-parse", "HEAD^{tree}")[:7] or None,
        "checkout_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }


def build_line(env: dict) -> str:
    """The markdown line naming the build a result came from."""
    if not env.get("op_namespace"):
        return "Kernel build: unknown (not loadable when the environment was recorded)."
    return (f"Kernel build `{env['op_namespace']}` (git tree {env['tree']}, "
            f"{'dirty: built with uncommitted changes' if env['dirty'] else 'clean'}; checkout {env['commit']}).")


def environment() -> dict:
    import triton

    props = torch.cuda.get_device_properties(0)
    return {
        **kernel_build(),
        "gpu": props.name,
        "sm_count": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "l2_flush": L2_FLUSH,
    }


def result_stem(kind: str, env: dict, suffix: str = "") -> str:
    """The file stem of a result of record: ``<kind>-<gpu>-<date><suffix>`` (gpu in lower case, dashed)."""
    gpu = re.sub(r"[^a-z0-9]+", "-", env["gpu"].lower()).strip("-")
    return f"{kind}-{gpu}-{_dt.date.today().isoformat()}{suffix}"


def write_result(out: Path, stem: str, record: dict, md: str) -> None:
    """Writes ``out/<stem>.json`` (the record) and ``out/<stem>.md``, and prints the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / f"{stem}.md").write_text(md)
    print(md)


def args_record(args) -> dict[str, str]:
    """A run's command-line arguments as strings, for its JSON record."""
    return {k: str(v) for k, v in vars(args).items()}


@dataclass
class Case:
    """One op on one shape and dtype, with every implementation to time on the same inputs."""

    op: str
    shape: str                       # e.g. "16384x4096"
    dtype: str                       # e.g. "bfloat16"
    bytes_moved: int                 # each input read once, each output written once
    impls: dict[str, Callable[[], object]]
    latency: bool = False            # also measure the per-call time from eager Python
    note: str = ""
    flops: int = 0                   # compute-bound: the FLOPs of one call (TFLOP/s, not GB/s, reported)
    errors: dict[str, dict[str, float]] = field(default_factory=dict)  # impl -> {"cosine", "rel_l2"} vs float64


@dataclass
class Result:
    op: str
    shape: str
    dtype: str
    impl: str
    ms: float
    gbps: float
    pct_copy: float
    bytes_moved: int
    call_us: float | None = None
    note: str = ""
    flops: int = 0
    tflops: float | None = None
    errors: dict[str, float] | None = None


@dataclass
class Report:
    env: dict
    copy_gbps: float
    results: list[Result] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    size_copy_gbps: dict[int, float] = field(default_factory=dict)  # bytes moved -> same-size copy GB/s

    def run(self, case: Case) -> None:
        if not case.flops and case.bytes_moved >= SIZE_COPY_MIN_BYTES and case.bytes_moved not in self.size_copy_gbps:
            self.size_copy_gbps[case.bytes_moved] = copy_gbps(case.bytes_moved // 2)
        for impl, fn in case.impls.items():
            try:
                ms = time_ms(fn)
                call = call_latency_us(fn) if case.latency else None
            except Exception as e:  # a baseline that cannot run this case is reported, not fatal
                self.skipped.append(f"{case.op} {case.shape} {case.dtype} {impl}: {type(e).__name__}: {e}"[:300])
                continue
            gbps = case.bytes_moved / (ms * 1e-3) / 1e9
            tflops = case.flops / (ms * 1e-3) / 1e12 if case.flops else None
            self.results.append(Result(case.op, case.shape, case.dtype, impl, ms, gbps,
                                       100 * gbps / self.copy_gbps, case.bytes_moved, call, case.note,
                                       case.flops, tflops, case.errors.get(impl)))

    def save(self, out_dir: Path, stem: str) -> tuple[Path, Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        js = out_dir / f"{stem}.json"
        md = out_dir / f"{stem}.md"
        js.write_text(json.dumps({"env": self.env, "copy_gbps": self.copy_gbps,
                                  "size_copy_gbps": {str(k): v for k, v in self.size_copy_gbps.items()},
                                  "results": [asdict(r) for r in self.results],
                                  "skipped": self.skipped}, indent=1) + "\n")
        md.write_text(self.markdown())
        return js, md

    def markdown(self) -> str:
        e = self.env
        flush_note = ("L2 flushed by reading a 256 MB buffer, which leaves it clean" if e.get("l2_flush") == "read"
                      else "L2 flushed by zeroing a 256 MB buffer, as triton's do_bench does")
        lines = [f"# Micro-benchmarks: {e['gpu']}", "",
                 f"torch {e['torch']}, CUDA {e['cuda']}, Triton {e['triton']}, {e['date']}. "
                 f"Median of CUDA-event timings ({flush_note}). GB/s counts each input read once and each "
                 f"output written once. Device-to-device copy in the same run: **{self.copy_gbps:.0f} GB/s** "
                 f"(1 GiB each way; the % columns). The last columns time a copy of each case's own bytes "
                 f"(half read, half written) and give ours as a % of it: what the size itself costs.",
                 "", build_line(e), ""]
        by_case: dict[tuple, dict[str, Result]] = {}
        memory_bound = [r for r in self.results if not r.flops]
        for r in memory_bound:
            by_case.setdefault((r.op, r.shape, r.dtype), {})[r.impl] = r
        impls = list(dict.fromkeys(r.impl for r in memory_bound))
        baselines = [i for i in impls if i != "ours"]
        header = (["op", "shape", "dtype", "MB"] + [f"{i} GB/s (% copy)" for i in impls] +
                  ["ours vs best baseline", "same-size copy GB/s", "ours % of same-size copy"])
        if memory_bound:
            lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for (op, shape, dtype), row in by_case.items():
            cells = [op, shape, dtype, f"{next(iter(row.values())).bytes_moved / 1e6:.1f}"]
            for i in impls:
                cells.append(f"{row[i].gbps:.0f} ({row[i].pct_copy:.0f}%)" if i in row else "—")
            best = min((row[b].ms for b in baselines if b in row), default=None)
            cells.append(f"{best / row['ours'].ms:.2f}×" if best and "ours" in row else "—")
            size_copy = self.size_copy_gbps.get(next(iter(row.values())).bytes_moved)
            cells.append(f"{size_copy:.0f}" if size_copy else "—")
            cells.append(f"{100 * row['ours'].gbps / size_copy:.0f}%" if size_copy and "ours" in row else "—")
            lines.append("| " + " | ".join(cells) + " |")
        lines += self._compute_bound_table()
        lat = [r for r in self.results if r.call_us is not None]
        if lat:
            lines += ["", "Per-call time from eager Python (host-bound shapes), µs:", "",
                      "| op | shape | dtype | impl | µs per call | device µs |", "|---|---|---|---|---|---|"]
            lines += [f"| {r.op} | {r.shape} | {r.dtype} | {r.impl} | {r.call_us:.1f} | {r.ms * 1e3:.1f} |" for r in lat]
        if self.skipped:
            lines += ["", "Not run:", ""] + [f"- {s}" for s in self.skipped]
        return "\n".join(lines) + "\n"

    def _compute_bound_table(self) -> list[str]:
        """The compute-bound cases (FLOPs given): one row per implementation, its time, TFLOP/s, ours'
        speed-up over it, and its error against float64 where the case measured it."""
        rows = [r for r in self.results if r.flops]
        if not rows:
            return []
        ours = {(r.op, r.shape, r.dtype): r for r in rows if r.impl == "ours"}
        lines = ["", "Compute-bound cases: TFLOP/s counts the FLOPs each case states (attention: 4·B·H·Sq·Sk·D); "
                 "the error is against float64 on the same inputs (cosine, relative L2).", "",
                 "| op | shape | dtype | impl | ms | TFLOP/s | ours' speed-up | cosine | rel L2 |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            mine = ours.get((r.op, r.shape, r.dtype))
            speedup = f"{r.ms / mine.ms:.2f}×" if mine is not None and r.impl != "ours" else "—"
            cos = f"{r.errors['cosine']:.6f}" if r.errors else "—"
            rel = f"{r.errors['rel_l2']:.4f}" if r.errors else "—"
            lines.append(f"| {r.op} | {r.shape} | {r.dtype} | {r.impl} | {r.ms:.3f} | {r.tflops:.0f} | {speedup} | "
                         f"{cos} | {rel} |")
        return lines
