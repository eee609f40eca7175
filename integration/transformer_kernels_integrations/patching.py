"""What both integrations share: a table of rules, the forward swap, and the report.

A rule matches modules by class name (so ``diffusers.models.normalization.RMSNorm`` and
``torch.nn.RMSNorm`` are both found, and one table serves Llama, Mistral and Qwen). The first
matching rule that does not skip a module patches it (a specific rule can sit before a general one
that takes what it leaves). Rules for a containing module claim the children they fuse (an LTX
block claims its norm1/norm2), so nothing is patched twice. Patching replaces the instance's
``forward``, or, under an accelerate hook, the ``_old_forward`` the hook calls, so the hook
survives. Weights are read at call time, never cached.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from types import ModuleType
from typing import Callable, Iterable

import torch


@dataclass
class InjectionReport:
    replaced: dict[str, int] = field(default_factory=dict)  # kind -> count
    left: dict[str, str] = field(default_factory=dict)      # module path -> why it was left alone

    def __str__(self) -> str:
        lines = ["replaced: " + (", ".join(f"{n} {k}" for k, n in sorted(self.replaced.items())) or "nothing")]
        lines += [f"left {path}: {why}" for path, why in sorted(self.left.items())]
        return "\n".join(lines)


@dataclass(frozen=True)
class Rule:
    kind: str                                            # what the report calls it
    matches: Callable[[str], bool]                       # on type(module).__name__
    patch: Callable[[torch.nn.Module, ModuleType], None]
    claims: tuple[str, ...] = ()                         # children this rule fuses (not patched again)
    skip: Callable[[torch.nn.Module], str | None] = lambda m: None  # why to leave a match alone, or None


def named(*class_names: str) -> Callable[[str], bool]:
    return lambda name: name in class_names


def suffixed(suffix: str) -> Callable[[str], bool]:
    return lambda name: name.endswith(suffix)


def set_forward(module: torch.nn.Module, forward: Callable) -> None:
    """Binds `forward` (a function taking the module as `self`) as the module's forward."""
    bound = types.MethodType(forward, module)
    if hasattr(module, "_old_forward"):  # an accelerate hook wraps forward: replace what it calls
        module._old_forward = bound
    else:
        module.forward = bound


def forward_from(make: Callable[[ModuleType], Callable]) -> Callable[[torch.nn.Module, ModuleType], None]:
    """A patch that binds the forward `make(tk)` builds."""
    return lambda module, tk: set_forward(module, make(tk))


def layer_forward(layer: str) -> Callable[[torch.nn.Module, ModuleType], None]:
    """A patch that binds the forward of the Hub layer `tk.layers.<layer>`: the same code kernelize
    installs, which reads the host module's weight and eps and picks the rounding to match."""
    return lambda module, tk: set_forward(module, getattr(tk.layers, layer).forward)


def apply_rules(models: Iterable[tuple[str, torch.nn.Module]], rules: Iterable[Rule], tk: ModuleType
                ) -> InjectionReport:
    rules = tuple(rules)
    report = InjectionReport()
    for prefix, model in models:
        claimed: set[int] = set()
        for path, module in model.named_modules(prefix=prefix):
            name = type(module).__name__
            if id(module) in claimed:
                continue
            reasons = []
            for rule in (r for r in rules if r.matches(name)):
                reason = rule.skip(module)
                if reason is not None:
                    reasons.append(reason)
                    continue
                rule.patch(module, tk)
                report.replaced[rule.kind] = report.replaced.get(rule.kind, 0) + 1
                claimed.update(id(getattr(module, child)) for child in rule.claims if hasattr(module, child))
                break
            else:
                if reasons:
                    report.left[path or name] = "; ".join(reasons)
    return report


def for_training(rules: Iterable[Rule], ops_of: dict[str, tuple[str, ...]], tk: ModuleType) -> tuple[Rule, ...]:
    """The rules as training mode applies them: a rule whose ops (``ops_of[rule.kind]``) do not all
    have a backward in ``tk`` skips every module with that reason (the module keeps its own forward,
    which autograd differentiates), as does a rule missing from ``ops_of``. Builds without
``has_backward`` have no backward at all."""
    has_backward = getattr(tk, "has_backward", lambda name: False)

    def gated(rule: Rule) -> Rule:
        if rule.kind not in ops_of:
            why = "training: the ops of this rule are not declared (no backward assumed)"
        else:
            missing = [op for op in ops_of[rule.kind] if not has_backward(op)]
            if not missing:
                return rule
            why = f"training: {', '.join(missing)} {'has' if len(missing) == 1 else 'have'} no backward yet"
        return Rule(rule.kind, rule.matches, rule.patch, rule.claims, skip=lambda m: why)

    return tuple(gated(rule) for rule in rules)
