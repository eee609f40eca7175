"""What holds the fused linear cross-entropy's memory at its forward and backward peaks (issue:
the H200's backward peak was both gradients twice). Runs the peak-memory test's case with the
caching allocator's history recorded and prints, for each phase, the live blocks at its peak
(size and the Python frames that allocated them), and every allocation of 16 MB or more in order.

    python workshop/flce_memory.py [--out DIR]     (DIR: the snapshot pickle, for memory_viz)
"""

import argparse
import pickle
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT)]

from conftest import load_kernel  # noqa: E402
from test_fused_linear_cross_entropy import inputs  # noqa: E402

BIG = 16 << 20


def frames_of(entry, keep=6):
    frames = [f for f in entry.get("frames", []) if f["filename"].endswith(".py")]
    return " <- ".join(f"{Path(f['filename']).name}:{f['line']} {f['name']}" for f in frames[:keep])


def live_at_peak(trace, start, stop):
    """Replays trace[start:stop]: the blocks live at the phase's peak (allocated during the phase)."""
    live, peak_live, total, peak = {}, {}, 0, -1
    for entry in trace[start:stop]:
        if entry["action"] == "alloc":
            live[entry["addr"]] = entry
            total += entry["size"]
            if total > peak:
                peak, peak_live = total, dict(live)
        elif entry["action"] in ("free_requested", "free_completed") and entry["addr"] in live:
            if entry["action"] == "free_requested":
                total -= live.pop(entry["addr"])["size"]
    return peak, peak_live


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    tk = load_kernel()
    N, H, V = 16384, 2048, 128256
    hidden, weight, target, _ = inputs(N, H, V, torch.bfloat16, ignore_share=0.0)
    grads = (N * H + V * H) * 2
    print(f"gradients {grads / 1e9:.3f} GB; fp32 logits would be {N * V * 4 / 1e9:.2f} GB")
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=200000, stacks="python")
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = tk.fused_linear_cross_entropy(hidden, weight, target)
    torch.cuda.synchronize()
    forward_peak = torch.cuda.max_memory_allocated() - base
    marker = len(torch.cuda.memory._snapshot()["device_traces"][0])
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    torch.cuda.synchronize()
    backward_peak = torch.cuda.max_memory_allocated() - base
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    print(f"forward peak extra {forward_peak / 1e9:.3f} GB, backward peak extra {backward_peak / 1e9:.3f} GB")
    print(f"after backward: allocated extra {(torch.cuda.memory_allocated() - base) / 1e9:.3f} GB; "
          f"hidden.grad {hidden.grad.data_ptr():#x} weight.grad {weight.grad.data_ptr():#x}")
    trace = snap["device_traces"][0]
    for phase, start, stop in (("forward", 0, marker), ("backward", marker, len(trace))):
        peak, live = live_at_peak(trace, start, stop)
        print(f"\n== {phase}: {stop - start} events; blocks allocated in it and live at its peak "
              f"({peak / 1e9:.3f} GB):")
        for entry in sorted(live.values(), key=lambda e: -e["size"])[:12]:
            print(f"  {entry['size'] / 1e6:10.1f} MB at {entry['addr']:#x}  {frames_of(entry)}")
        print(f"-- {phase}: allocations and frees of {BIG >> 20} MB or more, in order:")
        for entry in trace[start:stop]:
            if entry["size"] >= BIG and entry["action"] in ("alloc", "free_requested"):
                print(f"  {entry['action']:15s} {entry['size'] / 1e6:10.1f} MB at {entry['addr']:#x}  "
                      f"{frames_of(entry, 4)}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "flce-memory-snapshot.pickle", "wb") as f:
            pickle.dump(snap, f)


if __name__ == "__main__":
    main()
