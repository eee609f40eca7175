"""Which op first makes a NaN/Inf out of finite inputs in a training step (forward and backward):
the tiny Flux LoRA step of tests/test_training_models.py (its H200 run gave a NaN adapter gradient
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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", default="flux", choices=["ltx", "flux"])
    parser.add_argument("--no-poison", action="store_true")
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
        with FirstNonFinite() as mode:
            loss = loss_of(model, batches[0])
            print(f"{name}: loss {loss.item():.6g}")
            loss.backward()
        bad = [n for n, p in model.named_parameters() if p.grad is not None and not p.grad.isfinite().all()]
        print(f"{name}: {mode.found} op(s) made non-finite values; parameters with non-finite grads: {len(bad)} "
              f"{bad[:3]}")


if __name__ == "__main__":
    main()
