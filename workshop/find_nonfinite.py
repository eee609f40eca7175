"""Which op first makes a NaN/Inf out of finite inputs in a training step (forward and backward):
the tiny Flux LoRA step of tests/integration/test_training_models.py (its H200 run gave a NaN adapter gradient
through our ops and a finite one through eager), with the allocator poisoned as the suite does
and without.

    python workshop/find_nonfinite.py [ltx|flux] [--no-poison]
"""

import argparse
import copy
import sys
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT), str(ROOT / "integration")]

from conftest import load_kernel  # noqa: E402
from cuda_poison import poison_cuda_cache  # noqa: E402


def floats(tree):
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()
            and t.device.type == "cuda"]


def describe(t):
    return f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} strides {t.stride()}"


class FirstNonFinite(TorchDispatchMode):
    """Prints every op call whose inputs are all finite and whose outputs are not (the first few)."""

    def __init__(self, limit=8):
        super().__init__()
        self.limit, self.found = limit, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.found < self.limit:
            ins = floats((args, kwargs))
            outs = floats(out)
            if outs and all(t.isfinite().all() for t in ins) and not all(t.isfinite().all() for t in outs):
                self.found += 1
                print(f"NON-FINITE from finite inputs: {func}")
                for i, t in enumerate(ins):
                    print(f"   in  {i}: {describe(t)}")
                for i, t in enumerate(outs):
                    bad = (~t.isfinite()).nonzero()
                    print(f"   out {i}: {describe(t)}: {len(bad)} non-finite, first at {bad[:4].tolist()}")
        return out


class InspectAttention(TorchDispatchMode):
    """For each SDPA forward/backward op call: its inputs' pointers (mod 256), offsets, strides and
    magnitudes; the backward's q, k, v against the forward's (unchanged since?) and the backward
    re-run on fresh copies of its inputs (same strides) and on contiguous copies."""

    def __init__(self):
        super().__init__()
        self.saved = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        out = func(*args, **(kwargs or {}))
        if "scaled_dot_product" not in name:
            return out
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        print(f"{name}")
        for i, t in enumerate(tensors):
            print(f"   arg {i}: {describe(t)} ptr%256={t.data_ptr() % 256} offset={t.storage_offset()} "
                  f"max|.|={t.float().abs().max().item():.4g} finite={bool(t.isfinite().all())}")
        if "backward" not in name:
            self.saved.append([t.clone() for t in tensors[:3]])
            return out
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        print(f"   outputs finite: {[bool(o.isfinite().all()) for o in outs]}")
        fwd = self.saved.pop(0) if self.saved else None
        if fwd is not None:
            print(f"   q, k, v equal to the forward's: {[torch.equal(a, b) for a, b in zip(tensors[:3], fwd)]}")
        fresh = [torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device).copy_(a)
                 if isinstance(a, torch.Tensor) else a for a in args]
        again = [o for o in tree_flatten(func(*fresh, **(kwargs or {})))[0] if isinstance(o, torch.Tensor)]
        print(f"   re-run on fresh same-stride copies, outputs finite: {[bool(o.isfinite().all()) for o in again]}")
        contiguous = [a.contiguous() if isinstance(a, torch.Tensor) else a for a in args]
        try:
            again = [o for o in tree_flatten(func(*contiguous, **(kwargs or {})))[0] if isinstance(o, torch.Tensor)]
            print(f"   re-run on contiguous copies, outputs finite: {[bool(o.isfinite().all()) for o in again]}")
        except Exception as e:  # noqa: BLE001 (a diagnostic: report and go on)
            print(f"   re-run on contiguous copies raised {type(e).__name__}: {str(e)[:200]}")
        return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="flux", choices=["ltx", "flux"])
    parser.add_argument("--no-poison", action="store_true")
    parser.add_argument("--attention", action="store_true", help="inspect the SDPA calls (InspectAttention)")
    args = parser.parse_args()
    import peft
    import test_training_models as ttm
    from transformer_kernels_integrations.diffusers_models import inject

    tk = load_kernel()
    torch.manual_seed(0)
    if args.model == "ltx":
        base, batches, loss_of = ttm.tiny_ltx(), ttm.ltx_batches(), ttm.ltx_loss
    else:
        base, batches, loss_of = ttm.tiny_flux_and_batches()
    config = peft.LoraConfig(r=8, lora_alpha=8, target_modules=["to_q", "to_k", "to_v", "to_out.0"],
                             init_lora_weights="gaussian")
    eager = peft.get_peft_model(base, config)
    ours = copy.deepcopy(eager)
    print(inject(ours, tk, training=True))
    for name, model in (("eager", eager), ("ours", ours)):
        if not args.no_poison:
            poison_cuda_cache()
        with (InspectAttention() if args.attention else FirstNonFinite()) as mode:
            loss = loss_of(model, batches[0])
            print(f"{name}: loss {loss.item():.6g}")
            loss.backward()
        bad = [n for n, p in model.named_parameters() if p.grad is not None and not p.grad.isfinite().all()]
        print(f"{name}: {getattr(mode, 'found', '-')} op(s) made non-finite values; parameters with non-finite "
              f"grads: {len(bad)} {bad[:3]}")


if __name__ == "__main__":
    main()
