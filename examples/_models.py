"""Random-weight models for the examples' --random-weights runs (nothing downloaded): LTX-Video's
2B transformer with a denoising step's inputs, and a Llama-3.1-8B-shaped LLM."""

import statistics
import time

import torch

# LTX-Video's VAE compresses 8x in time and 32x in space into 128 channels; its T5 gives 4096 channels.
LTX_VAE_TEMPORAL, LTX_VAE_SPATIAL, LTX_LATENT_CHANNELS = 8, 32, 128
LTX_TEXT_TOKENS, LTX_TEXT_CHANNELS = 128, 4096

LLAMA_31_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                   num_key_value_heads=8, rms_norm_eps=1e-5, vocab_size=128256, max_position_embeddings=8192)


def ltx_2b_transformer() -> torch.nn.Module:
    """LTXVideoTransformer3DModel with its default (2B) config, bf16 on the GPU."""
    from diffusers import LTXVideoTransformer3DModel

    torch.manual_seed(0)
    with torch.device("cuda"):  # initialising 2B parameters on the CPU takes longer than the run
        model = LTXVideoTransformer3DModel()
    return model.to(torch.bfloat16).eval()


def ltx_step_inputs(num_frames: int, height: int, width: int, batch_size: int = 1) -> dict:
    """One denoising step's inputs (classifier-free guidance doubles the batch) for a video of that size."""
    frames = (num_frames - 1) // LTX_VAE_TEMPORAL + 1
    h, w = height // LTX_VAE_SPATIAL, width // LTX_VAE_SPATIAL
    batch = 2 * batch_size
    g = torch.Generator(device="cuda").manual_seed(0)
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    return dict(hidden_states=torch.randn(batch, frames * h * w, LTX_LATENT_CHANNELS, generator=g, **bf16),
                encoder_hidden_states=torch.randn(batch, LTX_TEXT_TOKENS, LTX_TEXT_CHANNELS, generator=g, **bf16),
                encoder_attention_mask=torch.ones(batch, LTX_TEXT_TOKENS, **bf16),
                timestep=torch.full((batch,), 500.0, device="cuda"), num_frames=frames, height=h, width=w,
                rope_interpolation_scale=(LTX_VAE_TEMPORAL / 25, LTX_VAE_SPATIAL, LTX_VAE_SPATIAL), return_dict=False)


def llama_8b(num_hidden_layers: int = LLAMA_31_8B["num_hidden_layers"]) -> torch.nn.Module:
    """LlamaForCausalLM with Llama-3.1-8B's config and random weights, bf16 on the GPU."""
    import transformers

    config = transformers.LlamaConfig(**{**LLAMA_31_8B, "num_hidden_layers": num_hidden_layers})
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(config)
    return model.to(torch.bfloat16).eval()


def wall_time_ms(fn, repeats: int = 3) -> float:
    """Median wall time of fn() in ms after one warm-up call, synchronized."""
    fn()
    samples = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3
