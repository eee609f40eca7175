#!/usr/bin/env python3
"""A transformers LLM (Llama, Mistral, Qwen2, Qwen3) with transformer-kernels in one call: ``inject(model)``.

    python examples/llm.py --model meta-llama/Llama-3.1-8B-Instruct   # downloads weights
    python examples/llm.py --random-weights                            # Llama-3.1-8B shape, no download

Greedy-decodes a few tokens before and after injecting and prints the speed of each.
"""

import time

import torch

from _cli import parse, parser
from transformer_kernels_integrations import inject


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--model", default="meta-llama/Llama-3.1-8B-Instruct")
    p.add_argument("--random-weights", action="store_true", help="Llama-3.1-8B's config with random weights")
    p.add_argument("--prompt", default="The fastest way to normalize a vector on a GPU is")
    p.add_argument("--new-tokens", type=int, default=64)
    args = parse(p)

    if args.random_weights:
        from _models import LLAMA_31_8B, llama_8b

        model, tokenizer = llama_8b(), None
        ids = torch.randint(0, LLAMA_31_8B["vocab_size"], (1, 16), device="cuda")
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).to("cuda").eval()
        ids = tokenizer(args.prompt, return_tensors="pt").input_ids.to("cuda")

    gen = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
               cache_implementation="static", disable_compile=True)

    def generate():
        model.generate(ids, **gen)  # warm-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(ids, **gen)
        torch.cuda.synchronize()
        return out, (time.perf_counter() - t0) / args.new_tokens * 1e3

    with torch.no_grad():
        _, eager_ms = generate()
        print(inject(model))
        out, ours_ms = generate()
    if tokenizer is not None:
        print(tokenizer.decode(out[0], skip_special_tokens=True))
    print(f"{eager_ms:.2f} ms/token eager, {ours_ms:.2f} ms/token with transformer-kernels "
          f"({eager_ms / ours_ms:.2f}x)")


if __name__ == "__main__":
    main()
