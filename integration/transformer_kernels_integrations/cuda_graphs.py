"""Decode without host overhead: a transformers causal LM's one-token step as a CUDA graph.

Greedy decoding of a batch is one model call per token whose shapes never change: with a static
KV cache (transformers' ``StaticCache``, whose position counter is a device tensor) every kernel,
address and launch of a step is the same, so the step can be captured once and replayed (gpt-fast,
vLLM and SGLang do this per batch size). A replay costs one launch on the host instead of the
~1000 kernel launches of a Llama-8B step, and the GPU runs them back to back.

Two ways, for models injected with our kernels or not:

- ``CapturedDecoder`` / ``capture_decode(model, batch_size, max_cache_len)``: no compiler. The
  prompt runs eagerly (``prefill``), each ``step(next_ids)`` replays the captured graph::

      decoder = capture_decode(model, batch_size=1, max_cache_len=1024)
      tokens = decoder.generate(input_ids, max_new_tokens=256)        # greedy
      # or by hand: logits = decoder.prefill(input_ids); then decoder.step(next_ids) per token

  One decoder per batch size (each holds its own static cache of ``max_cache_len`` tokens);
  decoders may share a graph memory pool (``pool=``). The step's outputs are graph-owned: each
  ``step`` returns the logits buffer the next replay overwrites (clone to keep them).

- ``torch.compile`` through ``generate``: ``compile_config_for_decode()`` gives the
  ``CompileConfig`` (``mode="reduce-overhead"``, ``fullgraph=True``) for
  ``model.generate(..., cache_implementation="static", compile_config=...)``: transformers compiles
  the decode step and CUDA-graph trees record it once (our ops are opaque custom ops with fake
  impls, CUDA-graph safe: tests/reliability/test_cuda_graphs.py).

What the capture needs from the model: a static cache without sliding-window layers (their
position counter is a Python int, baked into a graph), no host synchronization in its forward
(transformers skips its data-dependent mask shortcuts while a stream is capturing), and the same
parameters at each replay (a graph reads the addresses it captured: recapture after moving the
model or replacing weights, ``decoder.recapture()``).
"""

from __future__ import annotations

import inspect

import torch

_CACHE_ARGS = ("cache", "past_key_values")


def _cache_arg(model) -> str:
    params = inspect.signature(model.forward).parameters
    for name in _CACHE_ARGS:
        if name in params:
            return name
    raise TypeError(f"{type(model).__name__}.forward takes none of {_CACHE_ARGS}: not a transformers causal LM")


def compile_config_for_decode(**overrides):
    """transformers' ``CompileConfig`` for generate's compiled decode step: CUDA graphs
    (``reduce-overhead``) over one graph without breaks (``fullgraph``)."""
    from transformers import CompileConfig

    return CompileConfig(**{"fullgraph": True, "mode": "reduce-overhead", **overrides})


class CapturedDecoder:
    """A causal LM's one-token decode step captured in a CUDA graph for one batch size.

    Parameters
    ----------
    model : transformers ``PreTrainedModel`` (causal LM), on one CUDA device, in eval mode.
    batch_size : int
        The rows every prompt and step of this decoder has.
    max_cache_len : int
        Prompt plus generated tokens the static cache holds.
    capture : bool
        False runs the same static-buffer step eagerly (no graph; any device): the reference the
        captured decoder is tested against, and a fallback.
    warmup_steps : int
        Eager steps on a side stream before the capture (cuBLAS and our ops' one-time setup); the
        cache position they advance is restored.
    pool : optional graph memory pool (``torch.cuda.graph_pool_handle()``) shared with other decoders.
    """

    def __init__(self, model, batch_size: int, max_cache_len: int, *, capture: bool = True, warmup_steps: int = 2,
                 pool=None):
        from transformers import StaticCache

        self.model = model
        self.batch_size, self.max_cache_len = batch_size, max_cache_len
        self.capture_enabled, self.warmup_steps, self.pool = capture, warmup_steps, pool
        self.cache_arg = _cache_arg(model)
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.cache = StaticCache(config=config, max_cache_len=max_cache_len)
        sliding = [type(layer).__name__ for layer in self.cache.layers if getattr(layer, "is_sliding", False)]
        if sliding:
            raise ValueError(f"CapturedDecoder: the cache has sliding-window layers ({sliding[0]}), whose position "
                             "counter is a Python int a graph would bake in; use a config without sliding_window")
        param = next(model.parameters())
        device, dtype = param.device, param.dtype
        if capture and device.type != "cuda":
            raise ValueError(f"CapturedDecoder: capture needs the model on a CUDA device, got {device}")
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.cache.early_initialization(batch_size, config.num_key_value_heads, head_dim, dtype, device)
        # the step's static inputs: the next token, its position, and the padding mask over the cache
        self.input_ids = torch.zeros(batch_size, 1, dtype=torch.long, device=device)
        self.position_ids = torch.zeros(batch_size, 1, dtype=torch.long, device=device)
        self.attention_mask = torch.ones(batch_size, max_cache_len, dtype=torch.long, device=device)
        self.length = 0  # tokens in the cache
        self.graph = None
        self.logits = None

    # ---- the step ----

    def _forward(self):
        out = self.model(input_ids=self.input_ids, position_ids=self.position_ids, attention_mask=self.attention_mask,
                         use_cache=True, **{self.cache_arg: self.cache})
        return out.logits

    def _positions(self):
        return [layer.cumulative_length for layer in self.cache.layers]

    def _capture(self) -> None:
        saved = [p.clone() for p in self._positions()]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmup_steps):
                self._forward()
        torch.cuda.current_stream().wait_stream(side)
        for p, s in zip(self._positions(), saved):  # the warm-up wrote slots the next steps overwrite
            p.copy_(s)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=self.pool):
            self.logits = self._forward()

    def recapture(self) -> None:
        """Drops the graph; the next step captures again (after moving the model or replacing weights)."""
        self.graph, self.logits = None, None

    # ---- the API ----

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Runs the prompt ``[batch_size, S]`` eagerly into a fresh cache; returns the last position's
        logits ``[batch_size, vocab]``. ``attention_mask`` ``[batch_size, S]``: 0 for left padding."""
        b, s = input_ids.shape
        if b != self.batch_size:
            raise ValueError(f"CapturedDecoder: this decoder is for batch size {self.batch_size}, got {b} prompts")
        if s >= self.max_cache_len:
            raise ValueError(f"CapturedDecoder: a prompt of {s} tokens leaves no room in a cache of {self.max_cache_len}")
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(torch.long)
        self.cache.reset()
        self.attention_mask.fill_(1)
        self.attention_mask[:, :s] = mask
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)  # as generate numbers left-padded rows
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=True,
                         **{self.cache_arg: self.cache})
        self.position_ids.copy_(position_ids[:, -1:] + 1)
        self.length = s
        return out.logits[:, -1]

    @torch.no_grad()
    def step(self, next_ids: torch.Tensor) -> torch.Tensor:
        """Appends one token per row (``[batch_size]`` or ``[batch_size, 1]``); returns its logits
        ``[batch_size, vocab]``, a view of the graph's output buffer (overwritten by the next step)."""
        if self.length == 0:
            raise RuntimeError("CapturedDecoder: call prefill() before step()")
        if self.length >= self.max_cache_len:
            raise RuntimeError(f"CapturedDecoder: the cache of {self.max_cache_len} tokens is full")
        self.input_ids.copy_(next_ids.reshape(self.batch_size, 1))
        if not self.capture_enabled:
            logits = self._forward()
        else:
            if self.graph is None:
                self._capture()
            self.graph.replay()
            logits = self.logits
        self.position_ids.add_(1)
        self.length += 1
        return logits[:, -1]

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int,
                 attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Greedy decoding: the prompt and ``max_new_tokens`` new tokens, ``[batch_size, S + new]``."""
        tokens = [self.prefill(input_ids, attention_mask).argmax(-1)]
        for _ in range(max_new_tokens - 1):
            tokens.append(self.step(tokens[-1]).argmax(-1))
        return torch.cat([input_ids, torch.stack(tokens, dim=1)], dim=1)


def capture_decode(model, batch_size: int, max_cache_len: int, **kwargs) -> CapturedDecoder:
    """A ``CapturedDecoder`` for ``model`` (see the module docstring); captured at its first step."""
    return CapturedDecoder(model, batch_size, max_cache_len, **kwargs)
