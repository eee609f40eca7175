"""What the integration tests share: kernel stand-ins that count their calls (and the merged
projections' GEMMs), the ops each rule kind must call, and a snapshot of a model to check that
uninject restores it exactly."""

import types

import torch
from ops_table import function_ops
from torch.overrides import TorchFunctionMode


def kind_ops() -> dict[str, tuple[str, ...]]:
    """What a patched model must have run for each kind the report says it replaced: the rule's ops
    (``Rule.ops``, C++ op names) and ``merged.<key>`` for each projection it merges (counted by
    CountingKernels.counting). Both integrations' tables; a kind in both has the same ops there. A
    wiring test that checks them cannot pass with a kernel never run."""
    from transformer_kernels_integrations import diffusers_models, transformers_models

    kinds: dict[str, tuple[str, ...]] = {}
    for table in (transformers_models.TABLE, diffusers_models.TABLE):
        for rule in table.all_rules:
            ops = tuple(rule.ops or ()) + tuple(f"merged.{key}" for key in rule.merges)
            assert kinds.setdefault(rule.kind, ops) == ops, f"kind {rule.kind}: {kinds[rule.kind]} and {ops}"
    return kinds


class CountingKernels:
    """The kernel module (or a stand-in), counting the calls of each function and of each Hub
    layer's forward (``layers.<Name>``), to see which path a forward took."""

    def __init__(self, tk):
        self._tk, self.calls = tk, {}
        self.layers = types.SimpleNamespace(**{name: self._counted_layer(name, getattr(tk.layers, name))
                                               for name in dir(tk.layers) if not name.startswith("_")
                                               and isinstance(getattr(tk.layers, name), type)})

    def _count(self, name):
        self.calls[name] = self.calls.get(name, 0) + 1

    def _counted_layer(self, name, layer):
        forward = layer.forward

        def counted(module, *args, **kwargs):
            self._count(f"layers.{name}")
            return forward(module, *args, **kwargs)

        return types.SimpleNamespace(forward=counted)

    def counting(self, *models):
        """A context in which each GEMM of the models' merged projections (``merging.MergedLinear``,
        an ``F.linear`` on the merged weight) counts as ``merged.<key>``."""
        return _MergedGemms(self, models)

    def __getattr__(self, name):
        attr = getattr(self._tk, name)
        if not callable(attr) or isinstance(attr, type):
            return attr

        def counted(*args, **kwargs):
            self._count(name)
            return attr(*args, **kwargs)

        return counted


class CudaOnlyKernels:
    """The kernel module (or a stand-in) refusing CPU tensors as the CUDA build does (``<function>:
    ... must be a CUDA tensor``): where a patched forward calls a kernel function with tensors off
    the GPU, a CPU test fails as the GPU machine does."""

    def __init__(self, tk):
        self._tk = tk
        self.layers = types.SimpleNamespace(**{
            name: types.SimpleNamespace(forward=self._cuda_only(f"layers.{name}", getattr(tk.layers, name).forward))
            for name in dir(tk.layers) if not name.startswith("_") and isinstance(getattr(tk.layers, name), type)})

    @staticmethod
    def _cuda_only(name, fn):
        def call(*args, **kwargs):
            for arg in (*args, *kwargs.values()):
                if isinstance(arg, torch.Tensor) and not arg.is_cuda:
                    raise ValueError(f"{name}: tensors must be CUDA tensors, got a tensor on {arg.device}")
            return fn(*args, **kwargs)

        return call

    def __getattr__(self, name):
        attr = getattr(self._tk, name)
        return attr if not callable(attr) or isinstance(attr, type) else self._cuda_only(name, attr)


class _MergedGemms(TorchFunctionMode):
    def __init__(self, kernels, models):
        super().__init__()
        self.kernels, self.models = kernels, models

    def __enter__(self):
        # by identity: the merged weights as they are when the context starts
        self.keys = {id(merged.weight): merged.key for model in self.models for m in model.modules()
                     for merged in vars(m).get("_tk_merged", {}).values()}
        return super().__enter__()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.linear:
            weight = args[1] if len(args) > 1 else kwargs.get("weight")
            key = self.keys.get(id(weight))
            if key is not None:
                self.kernels._count(f"merged.{key}")
        return func(*args, **kwargs)


def assert_every_kind_ran(report, kernels):
    """Each replaced kind's ops were run at least once (a call of a public function counts for its op)."""
    kinds, op_of = kind_ops(), function_ops()
    ran = {op_of.get(name, name) for name, n in kernels.calls.items() if n}
    missing = {kind: [op for op in kinds[kind] if op not in ran] for kind in report.replaced}
    missing = {kind: ops for kind, ops in missing.items() if ops}
    assert not missing, f"replaced but never called: {missing} (calls: {kernels.calls})"


def snapshot(model: torch.nn.Module) -> dict:
    """Every module's attributes (by identity), parameters and buffers (objects, values, layout),
    and which of them share a storage."""
    state = {}
    for path, m in model.named_modules():
        attrs = dict(vars(m))
        tensors = {**{f"p.{k}": v for k, v in m._parameters.items()}, **{f"b.{k}": v for k, v in m._buffers.items()}}
        state[path] = (type(m), attrs, {k: (v, None if v is None else (v.detach().clone(), _layout(v)))
                                        for k, v in tensors.items()}, dict(m._modules))
    state[_SHARING] = _storage_sharing(model)
    return state


_SHARING = "<storages>"  # snapshot's entry for which tensors share a storage


def _layout(t: torch.Tensor) -> tuple:
    return t.dtype, t.device, tuple(t.shape), t.stride(), t.storage_offset(), t.untyped_storage().nbytes()


def _storage_sharing(model: torch.nn.Module) -> set:
    """The groups of parameter/buffer names that share one storage (tied weights; a merge's views)."""
    groups: dict[int, set] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        groups.setdefault(t.untyped_storage().data_ptr(), set()).add(name)
    return {frozenset(names) for names in groups.values()}


def assert_restored(model: torch.nn.Module, before: dict, added_by_the_run: tuple[str, ...] = ()) -> None:
    """The model is the one `before` describes, attribute for attribute and bit for bit (but for
    attributes `added_by_the_run`: what the library itself adds when the model first runs)."""
    after = snapshot(model)
    before = dict(before)
    sharing, sharing_after = before.pop(_SHARING), after.pop(_SHARING)
    assert sharing_after == sharing, (f"tensors that share a storage differ: {sorted(map(sorted, sharing_after - sharing))}"
                                      f" now, {sorted(map(sorted, sharing - sharing_after))} before")
    for state in (before, after):
        for _, attrs, _, _ in state.values():
            for name in added_by_the_run:
                attrs.pop(name, None)
    assert after.keys() == before.keys(), "modules added or removed"
    for path, (cls, attrs, tensors, children) in before.items():
        cls2, attrs2, tensors2, children2 = after[path]
        assert cls2 is cls, path
        assert attrs2.keys() == attrs.keys(), f"{path}: attributes {sorted(attrs2.keys() ^ attrs.keys())} differ"
        changed = [k for k in attrs if attrs2[k] is not attrs[k] and k not in ("_parameters", "_buffers", "_modules")]
        assert not changed, f"{path}: attributes {changed} are not the original objects"
        assert tensors2.keys() == tensors.keys(), path
        for k, (t, saved) in tensors.items():
            assert tensors2[k][0] is t, f"{path}.{k} is not the original tensor"
            if t is not None:
                value, layout = saved
                assert _layout(t) == layout, f"{path}.{k}: layout {_layout(t)}, was {layout}"
                assert torch.equal(t, value), f"{path}.{k} changed"
        assert {k: id(v) for k, v in children2.items()} == {k: id(v) for k, v in children.items()}, path
