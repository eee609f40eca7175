"""LTX-Video's rotary coordinates and the tables diffusers builds from them, for the rope tests and
the rotation backward tests."""

import pytest
import torch

from reference.rope import ltx_angles_from_coords


def ltx_coords_and_tables(B, F, H, W, C, source):
    """(grid, freqs) from integrations' ltx_rope_coords, and the fp32 cos/sin tables diffusers' own
    LTXVideoRotaryPosEmbed (LTX-Video 2B's settings) builds from the same arguments on the GPU.
    Sources: latent sizes with the interpolation scale (LTX 0.9.0), pixel coordinates [B, 3, S]
    (0.9.5+), and coordinates 40x past the video's extent, so that |angle| > 105615 takes cosf's
    slow (Payne-Hanek) reduction."""
    pytest.importorskip("diffusers")
    from diffusers.models.transformers.transformer_ltx import LTXVideoRotaryPosEmbed

    from transformer_kernels_integrations.diffusers_models import ltx_rope_coords

    rope = LTXVideoRotaryPosEmbed(C, base_num_frames=20, base_height=2048, base_width=2048, patch_size=1,
                                  patch_size_t=1, theta=10000.0)
    hidden_states = torch.empty(B, F * H * W, C, device="cuda")
    if source == "scaled_grid":
        kwargs = dict(num_frames=F, height=H, width=W, rope_interpolation_scale=(8 / 25, 32, 32))
    else:
        extent = torch.tensor([49.0, 512.0, 768.0], device="cuda")[:, None] * (40 if source == "large_angles" else 1)
        kwargs = dict(video_coords=torch.rand(B, 3, F * H * W, device="cuda") * extent)
    cos, sin = rope(hidden_states, **kwargs)
    grid, freqs = ltx_rope_coords(rope, hidden_states, **kwargs)
    if source == "large_angles" and C >= 12:  # below 12 channels the one frequency is pi / 2
        assert (ltx_angles_from_coords(grid, freqs).abs() > 105615).any()
    return grid, freqs, cos, sin
