"""NaN in the CUDA caching allocator's free memory, so that outputs the ops allocate show every
element they do not write (conftest.poison_outputs before each GPU test; the property tests
before each example)."""

import torch

# One large-pool block (requests > 1 MiB) and small-pool blocks (requests <= 1 MiB, carved from
# 2 MiB segments) by default.
POISON_LARGE_BYTES = 1 << 30
POISON_SMALL_BLOCKS = 128  # of 1 MiB: 64 segments, 128 MiB
POISON_BYTE = 0xFF  # every float dtype reads 0xFF.. as NaN (fp32 0xFFFFFFFF, fp16 / bf16 0xFFFF)


def poison_cuda_cache(large_bytes: int = POISON_LARGE_BYTES, small_blocks: int = POISON_SMALL_BLOCKS) -> int:
    """Fills the caching allocator's free memory with NaN: releases the cached free segments, then
    allocates `large_bytes` and `small_blocks` x 1 MiB, fills them with 0xFF and frees them. Later
    allocations (functional outputs in C++ included) reuse these blocks, so an element an op never
    writes reads NaN. Free blocks of segments that hold a live tensor cannot be released and keep
    their contents. Returns the count of segments cudaMalloc'd so far: a caller that sees it grow
    allocated past the poison, into fresh (unpoisoned) segments."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    blocks = [torch.empty(min(large_bytes, free // 4), dtype=torch.uint8, device="cuda")]
    blocks += [torch.empty(1 << 20, dtype=torch.uint8, device="cuda") for _ in range(small_blocks)]
    for b in blocks:
        b.fill_(POISON_BYTE)
    del blocks, b
    torch.cuda.synchronize()
    return torch.cuda.memory_stats().get("segment.all.allocated", 0)
