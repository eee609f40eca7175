"""What the integration tests share: kernel stand-ins that count their calls (and the merged
projections' GEMMs), the ops each rule kind must call, and a snapshot of a model to check that
uninject restores it exactly."""

import types

import torch
from torch.overrides import TorchFunctionMode

# The kernel functions a patched model must call for each kind the report says it replaced
# (layers.X: the Hub layer X's forward; merged.K: the GEMM of a merged projection kept under key K,
# counted by CountingKernels.counting). A wiring test that checks them cannot pass with a kernel
# never run.
KIND_OPS = {
    # transformers
    "decoder_layer": ("fused_add_rms_norm",),
    "mlp": ("act_mul",),
    "merged_gate_up_mlp": ("merged.gate_up", "silu_and_mul"),
    "rms_norm": ("layers.RMSNorm",),
    "rope": ("apply_rotary_pos_emb",),
    "merged_qkv_rope": ("merged.qkv", "apply_rotary_pos_emb"),
    "qk_norm_rope": ("hf_qk_norm_rope",),
    "merged_qkv_qk_norm_rope": ("merged.qkv", "hf_qk_norm_rope"),
    # diffusers
    "ltx_rope_coords": (),  # checked through the attention ops that take the coordinates
    "ltx_merged_projections": ("merged.qkv", "merged.kv"),  # self-attention q/k/v, cross-attention k/v
    "ltx_block": ("norm_modulate", "gated_add", "gated_add_norm_modulate"),
    "ltx_attention": ("ltx_qk_norm_rope_from_coords", "layers.RMSNorm"),  # self-attention fused; cross norms
    "ltx_attention_unfused": ("layers.RMSNorm", "ltx_rope_from_coords"),
    "ltx_attention_rope": ("ltx_rope_from_coords",),
    "flux_merged_projections": ("merged.qkv",),  # and merged.added_qkv in the joint blocks (the models' tests)
    "flux_attention": ("layers.RMSNorm", "flux_rope"),
    "adaln_zero": ("norm_modulate",),
    "adaln_zero_single": ("norm_modulate",),
    "sd35_adaln_zero_x": ("norm_modulate",),
    "adaln_continuous": ("norm_modulate",),
    "linear_gelu": ("linear_gelu",),
    "gelu": ("gelu",),
    "layer_norm": ("layers.LayerNorm",),
}


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
    """Each replaced kind's kernel functions were called at least once."""
    missing = {kind: [op for op in KIND_OPS[kind] if not kernels.calls.get(op)] for kind in report.replaced}
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
