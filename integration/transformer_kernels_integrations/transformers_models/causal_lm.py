"""Training: a ``*ForCausalLM`` called with ``labels`` in training mode computes its loss with the fused
linear cross-entropy (``causal_lm_loss``, switch ``fused_linear_cross_entropy``): ``lm_head`` and the
loss chunk by chunk, the logits never materialized, as Liger's ``fused_linear_cross_entropy=True``;
it then returns no logits.
"""

from __future__ import annotations

import inspect
from types import ModuleType

import torch

from ..patching import Rule, suffixed
from . import on_kernel_device


def _causal_lm_loss(tk: ModuleType, module: torch.nn.Module, hidden: torch.Tensor, labels: torch.Tensor,
                    num_items_in_batch=None, ignore_index: int = -100, shift_labels=None, **_model_kwargs
                    ) -> torch.Tensor:
    """transformers' ``ForCausalLMLoss`` on ``lm_head(hidden)`` without the logits: the same label
    shift (pad with ignore_index, drop the first), the same reduction (sum over
    ``num_items_in_batch`` when given, else the mean over targets not ignored), and Gemma 2's
    ``final_logit_softcapping`` when the config has one."""
    if shift_labels is None:
        shift_labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    reduction = "sum" if num_items_in_batch is not None else "mean"
    lm_head = module.lm_head
    loss = tk.fused_linear_cross_entropy(hidden, lm_head.weight, shift_labels.to(hidden.device), lm_head.bias,
                                         ignore_index=ignore_index, reduction=reduction,
                                         softcap=getattr(module.config, "final_logit_softcapping", None))
    if num_items_in_batch is not None:
        loss = loss / (num_items_in_batch.to(loss.device) if torch.is_tensor(num_items_in_batch) else num_items_in_batch)
    return loss


def _patch_causal_lm(module: torch.nn.Module, inj) -> None:
    from transformers.modeling_outputs import CausalLMOutputWithPast

    tk, kind = inj.tk, "causal_lm_loss"

    original = type(module).forward
    # The forward's positional parameters, so that positional arguments can be named (no
    # inspect.Signature.bind per call: torch.compile traces this forward).
    positional = [p.name for p in inspect.signature(original).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][1:]
    carried = [name for name in CausalLMOutputWithPast.__dataclass_fields__ if name not in ("loss", "logits")]

    def forward(self, *args, **kwargs):
        if len(args) > len(positional):
            return original(self, *args, **kwargs)
        kwargs = {**dict(zip(positional, args)), **kwargs}
        labels, keep = kwargs.get("labels"), kwargs.get("logits_to_keep", 0)
        if labels is None or not self.training or not torch.is_grad_enabled():
            return original(self, **kwargs)  # no training loss asked for: transformers' forward, its logits
        if kwargs.get("return_dict") is False or not (keep is None or (isinstance(keep, int) and keep == 0)):
            inj.fallback(kind, "return_dict=False or logits_to_keep given (the caller wants logits)",
                         instead="transformers' forward (lm_head, then its loss)")
            return original(self, **kwargs)
        kwargs.pop("labels")
        kwargs.pop("logits_to_keep", None)
        outputs = self.model(**kwargs)  # the loss's kwargs go to the base model too, as transformers does
        hidden = outputs.last_hidden_state
        if not on_kernel_device(hidden):
            inj.fallback(kind, f"tensors on {hidden.device.type}", instead="lm_head, then transformers' loss")
            logits = self.lm_head(hidden)
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        else:
            logits, loss = None, _causal_lm_loss(tk, self, hidden, labels, **kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{name: getattr(outputs, name, None) for name in carried})

    inj.set_forward(module, forward)


def _causal_lm_skip(m) -> str | None:
    head, config = getattr(m, "lm_head", None), getattr(m, "config", None)
    if not isinstance(head, torch.nn.Linear) or not hasattr(m, "model"):
        return "not a causal LM with a base model and a linear lm_head"
    if head.out_features != getattr(config, "vocab_size", None):
        return f"lm_head gives {head.out_features} logits, the config's vocabulary is {getattr(config, 'vocab_size', None)}"
    if getattr(m, "loss_type", "ForCausalLM") != "ForCausalLM":
        return f"its loss is {m.loss_type}, not transformers' causal LM loss"
    if "labels" not in inspect.signature(type(m).forward).parameters:
        return "its forward takes no labels"
    return None


# Applied in training only (before the other rules).
TRAINING_RULES: tuple[Rule, ...] = (
    Rule("causal_lm_loss", ("fused_linear_cross_entropy",), suffixed("ForCausalLM"), _patch_causal_lm,
         skip=_causal_lm_skip, ops=("fused_linear_cross_entropy",),
         fallback="CPU tensors, return_dict=False or logits_to_keep: lm_head, then transformers' loss"),
)
