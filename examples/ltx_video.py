#!/usr/bin/env python3
"""LTX-Video with transformer-kernels in one call: ``inject(pipe)``.

    python examples/ltx_video.py                          # the Hub pipeline (downloads weights)
    python examples/ltx_video.py --random-weights         # the 2B transformer from its config, no download

With weights it generates a short video and saves it as MP4; with --random-weights it runs the
transformer's denoising step on random latents, which is what the speed depends on.
"""

import torch

from _cli import parse, parser
from transformer_kernels_integrations import inject


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--random-weights", action="store_true", help="build the transformer from its config only")
    p.add_argument("--model", default="Lightricks/LTX-Video")
    p.add_argument("--prompt", default="A red fox running through fresh snow at sunrise")
    p.add_argument("--num-frames", type=int, default=49)
    p.add_argument("--height", type=int, default=512)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--steps", type=int, default=30)
    args = parse(p)

    if args.random_weights:
        from _models import ltx_2b_transformer, ltx_step_inputs, wall_time_ms

        model = ltx_2b_transformer()
        x = ltx_step_inputs(args.num_frames, args.height, args.width)
        with torch.no_grad():
            eager_ms = wall_time_ms(lambda: model(**x))
            print(inject(model))
            ours_ms = wall_time_ms(lambda: model(**x))
        print(f"denoising step: eager {eager_ms:.1f} ms, with transformer-kernels {ours_ms:.1f} ms "
              f"({eager_ms / ours_ms:.2f}x)")
        return

    from diffusers import LTXPipeline
    from diffusers.utils import export_to_video

    pipe = LTXPipeline.from_pretrained(args.model, torch_dtype=torch.bfloat16).to("cuda")
    print(inject(pipe))
    video = pipe(prompt=args.prompt, num_frames=args.num_frames, height=args.height, width=args.width,
                 num_inference_steps=args.steps).frames[0]
    export_to_video(video, "ltx_video.mp4", fps=24)
    print("wrote ltx_video.mp4")


if __name__ == "__main__":
    main()
