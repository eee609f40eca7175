"""What both integrations share: a table of rules, the switches, the forward swap, its undo, and the report.

A rule matches modules by class name (so ``diffusers.models.normalization.RMSNorm`` and
``torch.nn.RMSNorm`` are both found, and one table serves Llama, Mistral and Qwen). The first
matching rule whose switches are on and that does not skip a module patches it (a specific rule can
sit before a general one that takes what it leaves). Rules for a containing module claim the
children they fuse (an LTX block claims its norm1/norm2), so nothing is patched twice. A rule with
``also=True`` adds to a module without taking it (merging an attention's projections, which its
processor rule then reads): the rules after it still match that module.

Switches: every rule names the ``inject`` keywords it needs (``switches``: one per op kind it runs,
all must be on). ``inject(model, rope=False)`` turns off every rule that needs ``rope``; a fused rule
that is off leaves its children to the rules after it. A new rule is one table entry; its switch
names become ``inject`` keywords by being in the table (``switches_of``).

Patching replaces the instance's ``forward`` (or, under an accelerate hook, the ``_old_forward`` the
hook calls, so the hook survives), sets an attention processor, swaps a modeling module's
function, or merges projections (``merge``: one weight the original parameters become views of,
``merging.py``); each change is recorded on the model and ``uninject`` undoes them in reverse order
(a merge gives each parameter, the same object, storage of its own again with its current values).
Weights are read at call time, never cached.

Fallbacks: a patched forward that meets an input its kernel does not take (autocast, mixed dtypes,
tensors off the GPU) runs the library's own code, and a merged projection that cannot run
(gradients wanted) the separate projections; it says so once through ``logging`` (logger
``transformer_kernels_integrations``) and counts it in the report, or raises
``KernelFallbackError`` under ``inject(..., strict=True)``. The transformers rules check the device
in their forwards; the diffusers rules through ``Rule.kernel_devices``: ``Injection.set_forward``
wraps their forwards and ``set_processor`` tells our attention processors which one they replace.

Passes: a feature applied to a whole model after its rules (FP8 linear layers, ``fp8.PASS``; the
decode steps' GEMMs, ``decode.PASS``) is a ``Pass`` its tables carry (``RuleTable.passes``): off unless
``inject(model, <switch>=True)`` (or, declared ``default=True``, on unless given False), with options
``<switch>_<option>`` (``fp8_exclude``, ``fp8_weights_only``); ``inject`` takes, checks and refuses these
keywords from the passes' declarations, as it does the rules' switches, and this module imports no
feature. What a pass records beyond its count goes to ``report.extras[<switch>]``.

Training (``inject`` on a model in training mode, or ``training=True``): ``for_training`` keeps a
rule only where every op it needs under grad (``Rule.needs_backward``) has a backward (``tk.has_backward``),
and skips the others with the reason; the merged-projection rules stay (their GEMM runs where no
gradient is wanted, the separate projections under grad: a fallback), except under ``strict=True``,
where they skip so that the separate projections' rules take the modules and a training step does
not raise. Patches ask ``Injection.ours(op)`` where they can run an op or the module's own code.
"""

from __future__ import annotations

import functools
import logging
import sys
import types
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any, Callable, Iterable

import torch

from . import merging

logger = logging.getLogger("transformer_kernels_integrations")

# The attribute on an injected model that holds its undo log (removed again by uninject).
UNDO_ATTR = "_transformer_kernels_undo"


class KernelFallbackError(RuntimeError):
    """A patched forward met an input its kernel does not take, under ``inject(..., strict=True)``."""


@dataclass
class InjectionReport:
    """What ``inject`` did. ``replaced``: kind -> modules patched; ``ops``: kind -> the ops it runs
    (the names of docs/ops.md and ``tk.has_backward``); ``skipped``: module path -> why no rule
    patched it (a rule's reason, or the switch that is off); ``fallbacks``: kind -> when its patched
    path runs the library's own code instead of the kernel; ``fallbacks_taken``: kind -> how often
    that happened since (updated while the model runs; not counted under torch.compile).
    ``extras``: pass switch -> what that pass recorded, for each pass the models' tables carry (on
    or off); ``report.<switch>_<key>`` reads ``extras[switch][key]``: ``report.fp8_layers``, the paths
    of the linear layers ``inject(fp8=True)`` runs in FP8, and ``report.fp8_weight_bytes``, the memory
    their FP8 weights take (beside the bf16 weights, or in their place under ``fp8_weights_only``)."""

    replaced: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    fallbacks: dict[str, str] = field(default_factory=dict)
    fallbacks_taken: dict[str, int] = field(default_factory=dict)
    switches: dict[str, bool] = field(default_factory=dict)
    training: bool = False  # injected for training: only rules whose ops have a backward
    ops: dict[str, tuple[str, ...]] = field(default_factory=dict)  # kind -> the ops it runs (docs/ops.md)
    extras: dict[str, dict[str, Any]] = field(default_factory=dict)  # pass switch -> its record
    # pass switch -> the line its record gives in the text (Pass.describe), or None for none
    describe: dict[str, Callable[[dict[str, Any]], str | None]] = field(default_factory=dict, repr=False,
                                                                       compare=False)

    @property
    def left(self) -> dict[str, str]:  # the name before the switches came
        return self.skipped

    def __getattr__(self, name: str) -> Any:
        """``<switch>_<key>``: ``extras[switch][key]`` (``fp8_layers``, ``fp8_weight_bytes``)."""
        for switch, record in (self.__dict__.get("extras") or {}).items():
            key = name[len(switch) + 1:]
            if name.startswith(switch + "_") and key in record:
                return record[key]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __str__(self) -> str:
        def kind(k: str, n: int) -> str:
            ops = self.ops.get(k)
            return f"{n} {k}" + (f" [{', '.join(ops)}]" if ops else "")

        lines = ["replaced: " + (", ".join(kind(k, n) for k, n in sorted(self.replaced.items())) or "nothing")]
        if self.training:
            lines.append("training: only the rules whose ops have a backward")
        off = sorted(k for k, on in self.switches.items() if not on)
        if off:
            lines.append("switched off: " + ", ".join(off))
        by_reason: dict[str, list[str]] = {}
        for path, why in sorted(self.skipped.items()):
            by_reason.setdefault(why, []).append(path)
        for why, paths in sorted(by_reason.items()):
            shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
            lines.append(f"skipped {len(paths)} ({why}): {shown}")
        for switch, record in sorted(self.extras.items()):
            line = self.describe[switch](record) if switch in self.describe else None
            if line:
                lines.append(line)
        lines += [f"can fall back: {kind}: {when}" for kind, when in sorted(self.fallbacks.items())]
        lines += [f"fell back {n}x: {kind}" for kind, n in sorted(self.fallbacks_taken.items())]
        return "\n".join(lines)


@dataclass(frozen=True)
class Rule:
    kind: str                                            # what the report calls it
    switches: tuple[str, ...]                            # inject keywords that must all be on
    matches: Callable[[str], bool]                       # on type(module).__name__
    patch: Callable[[torch.nn.Module, "Injection"], None]
    claims: tuple[str, ...] = ()                         # children this rule fuses (not patched again)
    skip: Callable[[torch.nn.Module], str | None] = lambda m: None  # why to leave a match alone, or None
    fallback: str | None = None                          # when the patched path runs the library's code
    also: bool = False                                   # adds to the module; the rules after it still match
    # set: the devices our kernels take, read at call time (a test may widen them); the patched
    # forwards and processors run the library's own code for tensors on other devices
    kernel_devices: Callable[[], tuple[str, ...]] | None = None
    # the C++ ops (docs/ops.md's names) its patched path runs with every switch on; None: not
    # declared, so training skips the rule (no backward assumed)
    ops: tuple[str, ...] | None = None
    # the ops it needs a backward of in training (None: ``ops``); a rule whose training path differs
    # (q/k norms that run the module's own code without a backward, merges that run the separate
    # projections under grad) says so here
    training_ops: tuple[str, ...] | None = None
    merges: tuple[str, ...] = ()                         # keys of the projections it merges (merging.py)

    @property
    def needs_backward(self) -> tuple[str, ...] | None:
        """The ops that must have a backward for ``for_training`` to keep the rule (None: undeclared)."""
        return self.ops if self.training_ops is None else self.training_ops


@dataclass(frozen=True)
class Option:
    """An option of a pass: the ``inject`` keyword ``<switch>_<name>`` (``fp8_exclude``), its value when
    not given, and ``parse``: the value as the pass takes it, or a TypeError whose message says what
    the keyword takes ("takes a sequence of module-path patterns, got ..."; inject names the keyword)."""

    name: str
    default: Any
    parse: Callable[[Any], Any] = lambda value: value


@dataclass(frozen=True)
class Pass:
    """A feature applied to each model after its rules, by every table that carries it
    (``RuleTable.passes``): the FP8 linear layers (``fp8.PASS``), the decode GEMMs (``decode.PASS``).
    Off unless ``inject(..., <switch>=True)``, or with ``default=True`` on unless given False; its
    options are the keywords ``<switch>_<option>``, refused while it is off. Before anything is
    patched, ``check(tk, models, training)`` may refuse it (training, the GPU), and a kernel build
    without its ops is refused (a pass on by default and not asked for is left out instead, with a
    logged warning: an older build still injects); after each model's rules, ``apply(model, prefix,
    injection, options)`` patches and returns how many modules, which the report counts under
    ``kind`` (with ``ops`` and ``fallback``, as for a rule; ``variant(options)`` gives another kind,
    ops and fallback where an option changes what it runs: ``fp8_weights_only``). What else it records
    goes to ``report.extras[switch]`` (``extras()``: the empty record, there for each pass the tables
    carry; ``describe(record)``: the report's line, or None)."""

    switch: str                                          # the inject keyword that turns it on
    kind: str                                            # what the report calls the modules it patches
    what: str                                            # what it turns on, for messages ("the FP8 layers")
    ops: tuple[str, ...]                                 # the C++ ops it needs (docs/ops.md's names)
    apply: Callable[[torch.nn.Module, str, "Injection", dict[str, Any]], int]
    options: tuple[Option, ...] = ()
    check: Callable[[ModuleType, list, bool], None] = lambda tk, models, training: None
    fallback: str | None = None                          # when its patched path runs the library's code
    extras: Callable[[], dict[str, Any]] = dict
    describe: Callable[[dict[str, Any]], str | None] = lambda record: None
    default: bool = False                                # on unless given False (True), off unless given True
    # (options) -> the kind, ops and fallback of what it patches under them; None: kind, ops, fallback
    variant: Callable[[dict[str, Any]], tuple[str, tuple[str, ...], str | None]] | None = None

    @property
    def keywords(self) -> tuple[str, ...]:
        """The ``inject`` keywords it takes: its switch, then its options'."""
        return (self.switch, *(f"{self.switch}_{option.name}" for option in self.options))

    def reported(self, options: dict[str, Any]) -> tuple[str, tuple[str, ...], str | None]:
        """The kind, ops and fallback of what it patches with these options (``variant``)."""
        return self.variant(options) if self.variant is not None else (self.kind, self.ops, self.fallback)


def _cuda() -> tuple[str, ...]:
    return ("cuda",)


@dataclass(frozen=True)
class RuleTable:
    """One library's rules, in the order they are tried, the rules applied in training only (tried
    first), the passes applied after them, and the devices whose tensors its kernels take (read at
    call time: the passes' forwards check it; the rules' through ``Rule.kernel_devices`` or their
    forwards). The keywords ``inject`` takes for it and what training keeps derive from it."""

    rules: tuple[Rule, ...]
    training_rules: tuple[Rule, ...] = ()
    passes: tuple[Pass, ...] = ()
    kernel_devices: Callable[[], tuple[str, ...]] = _cuda

    @property
    def all_rules(self) -> tuple[Rule, ...]:
        return self.training_rules + self.rules

    @property
    def switches(self) -> tuple[str, ...]:
        return switches_of(self.all_rules)

    def rules_for(self, tk: ModuleType, training: bool, strict: bool = False) -> tuple[Rule, ...]:
        """The rules ``inject`` applies: ``rules``, or in training ``for_training``'s gating of
        ``training_rules + rules``."""
        return for_training(self.all_rules, tk, strict=strict) if training else self.rules


def first_tensor_device(args: tuple, kwargs: dict) -> torch.device | None:
    """The device of a call's first tensor argument (positional, then keyword), or None."""
    for arg in (*args, *kwargs.values()):
        if isinstance(arg, torch.Tensor):
            return arg.device
    return None


def named(*class_names: str) -> Callable[[str], bool]:
    return lambda name: name in class_names


def suffixed(suffix: str) -> Callable[[str], bool]:
    return lambda name: name.endswith(suffix)


def forward_from(make: Callable[[ModuleType], Callable]) -> Callable[[torch.nn.Module, "Injection"], None]:
    """A patch that binds the forward `make(tk)` builds."""
    return lambda module, inj: inj.set_forward(module, make(inj.tk))


def layer_forward(layer: str) -> Callable[[torch.nn.Module, "Injection"], None]:
    """A patch that binds the forward of the Hub layer `tk.layers.<layer>`: the same code kernelize
    installs, which reads the host module's weight and eps and picks the rounding to match."""
    return lambda module, inj: inj.set_forward(module, getattr(inj.tk.layers, layer).forward)


def switches_of(rules: Iterable[Rule]) -> tuple[str, ...]:
    """Every switch the rules name, sorted: the keywords ``inject`` takes for that table."""
    return tuple(sorted({s for rule in rules for s in rule.switches}))


# ---- process-wide swaps (a modeling module's function), shared by the models that need them ----

class _GlobalSwap:
    """A modeling module's function, replaced for the whole process by ``function``, which runs the
    replacement of the most recent injection still in place: each injected model's replacement
    closes over its own ``Injection`` (kernel module, strictness, report), so a model injected
    later with another kernel module (or ``strict``) is not served by an earlier one's."""

    def __init__(self, original: Callable):
        self.original = original
        self.replacements: list[Callable] = []  # one per injected model using it, in injection order
        replacements = self.replacements

        def function(*args, **kwargs):
            return replacements[-1](*args, **kwargs)

        function.__name__ = function.__qualname__ = getattr(original, "__name__", "function")
        function.__doc__ = getattr(original, "__doc__", None)
        self.function = function


# (module name, attribute) -> its swap
_GLOBAL_SWAPS: dict[tuple[str, str], _GlobalSwap] = {}


def _release_global(key: tuple[str, str], swap: _GlobalSwap, replacement: Callable, module: ModuleType) -> None:
    if _GLOBAL_SWAPS.get(key) is not swap:  # superseded (see swap_global): nothing of ours to undo
        return
    swap.replacements[:] = [r for r in swap.replacements if r is not replacement]
    if not swap.replacements:  # the last injected model that needed it is gone: transformers' own again
        setattr(module, key[1], swap.original)
        del _GLOBAL_SWAPS[key]


def restore_global_swaps() -> int:
    """Puts every process-wide swap's original function back and forgets the swaps; returns how
    many. For tests (a test that leaves a model injected would otherwise hand its swap to every
    later one in the process) and for a process that drops injected models without ``uninject``."""
    for (module_name, name), swap in _GLOBAL_SWAPS.items():
        module = sys.modules.get(module_name)
        if module is not None and getattr(module, name, None) is swap.function:
            setattr(module, name, swap.original)
    count = len(_GLOBAL_SWAPS)
    _GLOBAL_SWAPS.clear()
    return count


class Injection:
    """One ``inject`` call: the kernel module, strictness, the report, and the undo log of the model
    being patched. Patch functions call ``set_forward``/``set_processor``/``swap_global`` on it."""

    def __init__(self, tk: ModuleType, strict: bool, report: InjectionReport, training: bool = False,
                 kernel_devices: Callable[[], tuple[str, ...]] = _cuda):
        self.tk, self.strict, self.report, self.training = tk, strict, report, training
        self.kernel_devices = kernel_devices  # the table's (RuleTable.kernel_devices), for the passes
        self._has_backward = getattr(tk, "has_backward", lambda name: False)
        self._logged: set[tuple[str, str]] = set()
        self.undo: list[Callable[[], None]] = []
        self.rule: Rule | None = None  # the rule being applied (apply_rules sets it before its patch)

    def ours(self, op: str) -> bool:
        """Whether a patched forward runs our op `op` (the C++ op's name): always in inference; in
        training only where it has a backward (else the module's own code, which autograd
        differentiates: the attention processors' q/k norms)."""
        return not self.training or self._has_backward(op)

    # -- patching, each recorded for uninject --

    def set_forward(self, module: torch.nn.Module, forward: Callable) -> None:
        """Binds `forward` (a function taking the module as `self`) as the module's forward; under a
        rule with ``kernel_devices``, tensors on other devices run the forward it replaces."""
        # an accelerate hook wraps forward: replace what it calls
        attr = "_old_forward" if hasattr(module, "_old_forward") else "forward"
        if self.rule is not None and self.rule.kernel_devices:
            forward = self._on_kernel_devices(forward, getattr(module, attr), self.rule)
        self._set_attr(module, attr, types.MethodType(forward, module))

    def _on_kernel_devices(self, forward: Callable, replaced: Callable, rule: Rule) -> Callable:
        """`forward` where the call's first tensor is on one of the rule's devices, else `replaced`
        (the module's own bound forward: a logged fallback of the rule's kind)."""
        devices, off_device = rule.kernel_devices, self.off_device_fallback(rule)

        @functools.wraps(forward)  # inspect.unwrap gives the patched forward
        def forward_on_kernel_devices(module, *args, **kwargs):
            device = first_tensor_device(args, kwargs)
            if device is not None and device.type not in devices():
                off_device(device)
                return replaced(*args, **kwargs)
            return forward(module, *args, **kwargs)

        return forward_on_kernel_devices

    def off_device_fallback(self, rule: Rule) -> Callable[[torch.device], None]:
        kind = rule.kind
        return lambda device: self.fallback(kind, f"tensors on {device.type}, not the GPU")

    def set_processor(self, module: torch.nn.Module, processor: Any) -> None:
        """Gives a diffusers attention module our processor (keeping the attention backend and
        parallel config set on the one it replaces). Under a rule with ``kernel_devices`` the
        processor learns the one it replaces and the devices (``replaced``, ``kernel_devices``,
        ``off_device``): our processors run the replaced one for tensors on other devices."""
        old = module.processor
        for attr in ("_attention_backend", "_parallel_config"):
            if getattr(old, attr, None) is not None:
                setattr(processor, attr, getattr(old, attr))
        if self.rule is not None and self.rule.kernel_devices:
            processor.replaced, processor.kernel_devices = old, self.rule.kernel_devices
            processor.off_device = self.off_device_fallback(self.rule)
        module.set_processor(processor)
        self.undo.append(lambda: module.set_processor(old))

    def merge(self, module: torch.nn.Module, key: str, names: tuple[str, ...], kind: str) -> merging.MergedLinear:
        """Merges the ``names`` projections of `module` into one weight (``merging.attach``); where
        the merge cannot run (``MergedLinear.use``), it is a fallback of `kind`. Undone by
        ``merging.detach``."""
        merged = merging.attach(module, key, names)
        merged.on_fallback = lambda why: self.fallback(kind, why, instead="the separate projections")
        self.undo.append(lambda: merging.detach(module, key))
        return merged

    def swap_global(self, module: ModuleType, name: str, make: Callable[[Callable], Callable]) -> None:
        """Replaces ``module.<name>`` for every caller in the process by one function that runs
        ``make(original)`` of the most recent injection still in place (this one's, until a later
        model is injected); the original returns when the last of them is uninjected."""
        key = (module.__name__, name)
        if key in _GLOBAL_SWAPS and getattr(module, name) is not _GLOBAL_SWAPS[key].function:
            del _GLOBAL_SWAPS[key]  # replaced behind our back (another patcher, a test): start over
        if key not in _GLOBAL_SWAPS:
            _GLOBAL_SWAPS[key] = _GlobalSwap(getattr(module, name))
            setattr(module, name, _GLOBAL_SWAPS[key].function)
        swap = _GLOBAL_SWAPS[key]
        replacement = make(swap.original)
        swap.replacements.append(replacement)
        self.undo.append(lambda: _release_global(key, swap, replacement, module))

    def _set_attr(self, obj: Any, attr: str, value: Any) -> None:
        had, old = attr in vars(obj), vars(obj).get(attr)
        setattr(obj, attr, value)

        def undo() -> None:
            if attr == "forward" and vars(obj).get(attr) is not value and vars(obj).get("_old_forward") is value:
                # an accelerate hook wrapped our forward after inject: give the hook the original
                obj._old_forward = old if had else types.MethodType(type(obj).forward, obj)
            elif had:
                setattr(obj, attr, old)
            else:
                delattr(obj, attr)

        self.undo.append(undo)

    # -- run time --

    def fallback(self, kind: str, why: str, instead: str = "the library's own code") -> None:
        """A patched forward of `kind` is about to run `instead` of its kernel path, because `why`."""
        message = f"transformer-kernels: {kind} runs {instead}: {why}"
        if self.strict:
            raise KernelFallbackError(message + " (inject(..., strict=True))")
        if torch.compiler.is_compiling():  # nothing host-side in a traced graph
            return
        self.report.fallbacks_taken[kind] = self.report.fallbacks_taken.get(kind, 0) + 1
        if (kind, why) not in self._logged:
            self._logged.add((kind, why))
            logger.warning(message)


def check_switches(switches: dict[str, bool], known: Iterable[str], where: str) -> dict[str, bool]:
    """Every switch of `known`, on unless given; an unknown keyword is a TypeError naming the known ones."""
    known = tuple(sorted(known))
    unknown = sorted(set(switches) - set(known))
    if unknown:
        raise TypeError(f"{where}: unknown switch(es) {unknown}; the switches are {list(known)}")
    bad = {k: v for k, v in switches.items() if not isinstance(v, bool)}
    if bad:
        raise TypeError(f"{where}: switches take True or False, got {bad}")
    return {name: switches.get(name, True) for name in known}


def passes_of(tables: Iterable[RuleTable]) -> dict[str, Pass]:
    """The passes the tables carry, by switch (a pass two tables carry, once)."""
    found: dict[str, Pass] = {}
    for table in tables:
        for p in table.passes:
            if found.setdefault(p.switch, p) is not p:
                raise ValueError(f"two passes have the switch {p.switch!r}")
    return found


def check_keywords(keywords: dict[str, Any], tables: Iterable[RuleTable],
                   where: str) -> tuple[dict[str, bool], dict[str, dict[str, Any]]]:
    """``inject``'s keywords against what `tables` declare: the rules' switches (each on unless given
    False), and the passes that are on (switch -> its options, parsed, defaults filled in). Refused,
    naming the keyword: an unknown one (TypeError naming the known ones), a switch that is not True
    or False, an option its pass refuses (TypeError), an option given while its pass is off
    (ValueError)."""
    tables = tuple(tables)
    passes = passes_of(tables)
    pass_keywords = {k for p in passes.values() for k in p.keywords}
    rule_switches = switches_of(rule for table in tables for rule in table.all_rules)
    unknown = sorted(set(keywords) - set(rule_switches) - pass_keywords)
    if unknown and passes:
        def listed(default: bool) -> str:
            return ", ".join(f"{p.switch} ({p.what}" + (f"; options {', '.join(p.keywords[1:])}" if p.options else "")
                             + ")" for _, p in sorted(passes.items()) if p.default == default)

        groups = [f"({'on unless given False' if default else 'off unless given True'}) {listed(default)}"
                  for default in (False, True) if listed(default)]
        raise TypeError(f"{where}: unknown switch(es) {unknown}; the switches are {list(rule_switches)}, and the "
                        f"passes {'; '.join(groups)}")
    switches = check_switches({k: v for k, v in keywords.items() if k not in pass_keywords}, rule_switches, where)
    on: dict[str, dict[str, Any]] = {}
    for switch, p in sorted(passes.items()):
        value = keywords.get(switch, p.default)
        if not isinstance(value, bool):
            raise TypeError(f"{where}: {switch} takes True or False, got {value!r}")
        options = {}
        for option in p.options:
            keyword = f"{switch}_{option.name}"
            if keyword not in keywords:
                options[option.name] = option.default
                continue
            try:
                options[option.name] = option.parse(keywords[keyword])
            except TypeError as e:
                raise TypeError(f"{where}: {keyword} {e}") from None
            if not value and options[option.name] != option.default:
                raise ValueError(f"{where}: {keyword} is given but {switch} is off ({switch}=True turns {p.what} on)")
        if value:
            on[switch] = options
    return switches, on


def apply_rules(models: Iterable[tuple[str, torch.nn.Module, RuleTable]], tk: ModuleType, *,
                switches: dict[str, bool], strict: bool = False, training: bool = False,
                passes: dict[str, dict[str, Any]] | None = None) -> InjectionReport:
    """Patches each (path prefix, model, table) in place with the table's rules (``rules_for``);
    returns the report. A model injected already must be uninjected first (its undo log would
    otherwise mix two injections). ``training``: the rules are ``for_training``'s, and the patches'
    ``Injection.ours`` says which ops have a backward. ``passes`` (switch -> options): after a
    model's rules, its table's passes that are on, in the table's order."""
    models = list(models)
    passes = passes or {}
    for prefix, model, _ in models:
        if hasattr(model, UNDO_ATTR):
            raise ValueError(f"inject: {prefix or type(model).__name__} is injected already; call uninject() first")
    report = InjectionReport(switches=dict(switches), training=training)
    for switch, p in passes_of(table for _, _, table in models).items():
        report.extras[switch], report.describe[switch] = p.extras(), p.describe
    for prefix, model, table in models:
        rules = table.rules_for(tk, training, strict)
        injection = Injection(tk, strict, report, training, table.kernel_devices)
        claimed: set[int] = set()
        for path, module in model.named_modules(prefix=prefix):
            name = type(module).__name__
            if id(module) in claimed:
                continue
            reasons = []
            for rule in (r for r in rules if r.matches(name)):
                off = [s for s in rule.switches if not switches[s]]
                if off:
                    reasons.append(f"{rule.kind}: {', '.join(f'{s}=False' for s in off)}")
                    continue
                reason = rule.skip(module)
                if reason is not None:
                    reasons.append(reason)
                    continue
                injection.rule = rule
                rule.patch(module, injection)
                injection.rule = None
                _count(report, rule.kind, 1, rule.ops or (), rule.fallback)
                claimed.update(id(getattr(module, child)) for child in rule.claims if hasattr(module, child))
                if not rule.also:
                    break
            else:
                if reasons:
                    report.skipped[path or name] = "; ".join(reasons)
        for p in table.passes:
            if p.switch in passes:
                patched = p.apply(model, prefix, injection, passes[p.switch])
                if patched:
                    kind, ops, fallback = p.reported(passes[p.switch])
                    _count(report, kind, patched, ops, fallback)
        # set even when nothing was patched, so that uninject() of an injected model always works
        object.__setattr__(model, UNDO_ATTR, injection.undo)
    return report


def _count(report: InjectionReport, kind: str, patched: int, ops: tuple[str, ...], fallback: str | None) -> None:
    report.replaced[kind] = report.replaced.get(kind, 0) + patched
    report.ops[kind] = ops
    if fallback:
        report.fallbacks[kind] = fallback


def uninject_models(models: Iterable[torch.nn.Module]) -> int:
    """Undoes every change inject made to each model (reverse order); returns how many changes."""
    undone = 0
    for model in models:
        undo = vars(model).pop(UNDO_ATTR, None)
        if undo is None:
            continue
        for step in reversed(undo):
            step()
        undone += len(undo)
    return undone


def for_training(rules: Iterable[Rule], tk: ModuleType, *, strict: bool = False) -> tuple[Rule, ...]:
    """The rules as training mode applies them: a rule whose ops (``Rule.needs_backward``) do not
    all have a backward in ``tk``, or that declares none, skips every module with that reason (the
    module keeps its own forward, which autograd differentiates, or the next rule takes it). Builds
    without ``has_backward`` have no backward at all. Under ``strict`` the rules that merge
    projections skip too: a merged GEMM runs only where no gradient is wanted, so in training it
    would fall back at every step and strict would raise; the separate projections' rules take those
    modules instead."""
    has_backward = getattr(tk, "has_backward", lambda name: False)

    def gated(rule: Rule) -> Rule:
        if rule.needs_backward is None:
            why = "training: the ops of this rule are not declared (no backward assumed)"
        elif strict and "merge_projections" in rule.switches:
            why = ("training with strict=True: merged projections run only without gradients "
                   "(the separate projections' rule applies)")
        else:
            missing = [op for op in rule.needs_backward if not has_backward(op)]
            if not missing:
                return rule
            why = f"training: {', '.join(missing)} {'has' if len(missing) == 1 else 'have'} no backward yet"
        return replace(rule, skip=lambda m: why)

    return tuple(gated(rule) for rule in rules)


def inject_models(models: Iterable[tuple[str, torch.nn.Module, RuleTable]], tk: ModuleType | None, *,
                  keywords: dict[str, Any], tables: Iterable[RuleTable], strict: bool = False,
                  training: bool | None = None) -> InjectionReport:
    """What every ``inject`` does: checks its keywords against what `tables` declare
    (``check_keywords``: the rules' switches, the passes' switches and options), loads the kernel
    (`tk` None: ``loading.load_kernel()``), decides training (None: whether any model is in training
    mode), lets each pass that is on refuse (``Pass.check``; a build without its ops), and applies
    each (path prefix, model, table)'s rules, then its passes."""
    switches, passes = check_keywords(keywords, tables, "inject")
    passes = dict(passes)
    models = list(models)
    if tk is None:
        from .loading import load_kernel

        tk = load_kernel()
    if training is None:
        training = any(m.training for _, m, _ in models)
    for switch, p in passes_of(table for _, _, table in models).items():
        if switch not in passes:
            continue
        p.check(tk, [m for _, m, table in models if p in table.passes], training)
        missing = [op for op in p.reported(passes[switch])[1] if not hasattr(tk, op)]
        if missing and p.default and switch not in keywords:  # on by default, not asked for: an older build
            logger.warning(f"transformer-kernels: {switch} is left out: this kernel build lacks "
                           f"{', '.join(missing)} (update the kernel)")
            del passes[switch]
        elif missing:
            raise ValueError(f"inject: {switch}=True needs the kernel's {', '.join(missing)}; this build lacks "
                             f"{'it' if len(missing) == 1 else 'them'} (update the kernel)")
    return apply_rules(models, tk, switches=switches, strict=strict, training=training, passes=passes)
