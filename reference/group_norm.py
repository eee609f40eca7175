"""GroupNorm references: float64 math and the eager code of diffusers' ResNet blocks."""

from typing import Optional

import torch
import torch.nn.functional as F


def channel_view(t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A per-channel [C] (or per-sample-channel [N, C]) tensor viewed to broadcast over x [N, C, *spatial]."""
    return t.reshape(*t.shape[:2] if t.dim() > 1 else (1, t.shape[0]), *([1] * (x.dim() - 2)))


def add_time_embedding(x: torch.Tensor, bias_nc: Optional[torch.Tensor]) -> torch.Tensor:
    """ResnetBlock2D's ``hidden_states + temb[:, :, None, None]`` in x's dtype (None: x itself)."""
    return x if bias_nc is None else x + channel_view(bias_nc, x)


def group_norm_float64(x, num_groups, weight=None, bias=None, eps=1e-5, bias_nc=None) -> torch.Tensor:
    """GroupNorm (biased variance) of h = round(x + bias_nc), in float64, eps as given."""
    h = add_time_embedding(x, bias_nc).double()
    n, c = h.shape[:2]
    g = h.reshape(n, num_groups, -1)
    mean = g.mean(-1, keepdim=True)
    var = (g - mean).pow(2).mean(-1, keepdim=True)
    y = ((g - mean) / torch.sqrt(var + eps)).reshape(h.shape)
    if weight is not None:
        y = y * channel_view(weight.double(), h)
    if bias is not None:
        y = y + channel_view(bias.double(), h)
    return y


def eager_group_norm(x, num_groups, weight=None, bias=None, eps=1e-5, activation=None, bias_nc=None):
    """The eager code the op replaces: ``F.group_norm`` (then ``F.silu``), after the time-embedding add."""
    y = F.group_norm(add_time_embedding(x, bias_nc), num_groups, weight, bias, eps)
    return F.silu(y) if activation == "silu" else y


# ATen's RowwiseMomentsCUDAKernel: one block per group, each thread a Welford loop over every
# blockDim-th element (512 threads, or a warp for groups of fewer than 512 elements).
_ATEN_THREADS, _ATEN_SMALL_GROUP_THREADS = 512, 32


def ambiguous_statistics(x, num_groups, eps=1e-5, bias_nc=None) -> torch.Tensor:
    """[N, G] mask of the groups of x whose statistics may round to either of two values of x's dtype.

    ATen's CUDA kernel (torch up to 2.12) stores a group's fp32 mean and rstd in x's dtype and
    normalizes with those, and so do the kernels. The two sum in different orders, so their fp32
    mean (or rstd) can round to neighbouring 16-bit values where the exact value lies within fp32
    summation error of the midpoint between them; the whole group's output then differs by about
    one ulp of the statistic. A group is flagged when rounding the float64 statistic minus and plus
    a bound on that error gives two values. No group is for fp32 (the statistics stay fp32)."""
    h = add_time_embedding(x, bias_nc)
    n = h.shape[0]
    if h.dtype == torch.float32 or h.numel() == 0:
        return torch.zeros(n, num_groups, dtype=torch.bool, device=h.device)
    g = h.double().reshape(n, num_groups, -1)
    count = g.shape[-1]
    mean = g.mean(-1)
    var = (g - mean[..., None]).pow(2).mean(-1)
    eps_cast = float(torch.tensor(eps, dtype=h.dtype))
    rstd = (var + eps_cast).rsqrt()
    threads = _ATEN_THREADS if count >= _ATEN_THREADS else _ATEN_SMALL_GROUP_THREADS
    per_thread = -(-count // threads)
    # fp32 summation error, relative to the mean magnitude: a random walk over each thread's loop
    # (sqrt of its length) and a few roundings per combining level, times 4. An fp32 emulation of
    # ATen's Welford loop and tree (SD shapes, bf16/fp16) stays below 1/12 of this bound.
    slack = 2.0**-24 * 4 * (per_thread**0.5 + 4)
    tol_mean = slack * g.abs().mean(-1)
    # var: each deviation from the running mean carries the error of |mean| + std, times std, summed;
    # rstd's relative error is half of var + eps's, and rsqrtf adds up to 2 ulp
    std = var.sqrt()
    var_error = slack * 2 * std * (mean.abs() + std)
    tol_rstd = rstd * (var_error / (2 * (var + eps_cast)) + 2.0**-24 * 4)

    def straddles(v, tol):
        return (v - tol).to(h.dtype) != (v + tol).to(h.dtype)

    return straddles(mean, tol_mean) | straddles(rstd, tol_rstd)


def aten_rounds_statistics() -> bool:
    """Whether the installed torch's CUDA F.group_norm rounds each group's mean and rstd to x's dtype
    (torch <= 2.12; 2.13 on keep them fp32), as the kernel built against it does (group_norm.cu)."""
    major, minor = (int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
    return (major, minor) <= (2, 12)


def statistics_rounding_magnitude(x, num_groups, weight=None, eps=1e-5, bias_nc=None) -> torch.Tensor:
    """Per element, |mean| * rstd * |w| in float64: what rounding a group's mean to x's 16-bit dtype
    shifts an output by, in units of that dtype's unit roundoff. It dwarfs the output where a
    group's spread is tiny next to its mean (groups of a few elements). Zero where the statistics
    stay fp32 (fp32 x, or a torch that keeps them fp32)."""
    h = add_time_embedding(x, bias_nc)
    if h.dtype == torch.float32 or not aten_rounds_statistics() or h.numel() == 0:
        return torch.zeros(h.shape, dtype=torch.float64, device=h.device)
    n = h.shape[0]
    g = h.double().reshape(n, num_groups, -1)
    mean = g.mean(-1, keepdim=True)
    rstd = ((g - mean).pow(2).mean(-1, keepdim=True) + eps).rsqrt()
    m = (mean.abs() * rstd).expand_as(g).reshape(h.shape)
    return m if weight is None else m * channel_view(weight.double().abs(), h)


def group_mask(mask: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """An [N, G] mask spread over x's [N, C, *spatial] elements (each group's channels)."""
    n, groups = mask.shape
    c = x.shape[1]
    return mask.reshape(n, groups, 1).expand(n, groups, c // groups).reshape(n, c, *([1] * (x.dim() - 2))).expand(x.shape)
