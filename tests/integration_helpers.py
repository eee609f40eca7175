"""What the integration tests share: kernel stand-ins that count their calls, the ops each rule
kind must call, and a snapshot of a model to check that uninject restores it exactly."""

import types

import torch

# The kernel functions a patched model must call for each kind the report says it replaced
# (layers.X: the Hub layer X's forward). A wiring test that checks them cannot pass with a kernel
# never run.
KIND_OPS = {
    # transformers
    "decoder_layer": ("fused_add_rms_norm",),
    "mlp": ("act_mul",),
    "rms_norm": ("layers.RMSNorm",),
    "rope": ("apply_rotary_pos_emb",),
    "qk_norm_rope": ("hf_qk_norm_rope",),
    # diffusers
    "ltx_rope_coords": (),  # checked through the attention ops that take the coordinates
    "ltx_block": ("norm_modulate", "gated_add", "gated_add_norm_modulate"),
    "ltx_attention": ("ltx_qk_norm_rope_from_coords", "layers.RMSNorm"),  # self-attention fused; cross norms
    "ltx_attention_unfused": ("layers.RMSNorm", "ltx_rope_from_coords"),
    "ltx_attention_rope": ("ltx_rope_from_coords",),
    "flux_attention": ("layers.RMSNorm", "flux_rotary_emb"),
    "adaln_zero": ("norm_modulate",),
    "adaln_zero_single": ("norm_modulate",),
    "sd35_adaln_zero_x": ("norm_modulate",),
    "adaln_continuous": ("norm_modulate",),
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

    def __getattr__(self, name):
        attr = getattr(self._tk, name)
        if not callable(attr) or isinstance(attr, type):
            return attr

        def counted(*args, **kwargs):
            self._count(name)
            return attr(*args, **kwargs)

        return counted


def assert_every_kind_ran(report, kernels):
    """Each replaced kind's kernel functions were called at least once."""
    missing = {kind: [op for op in KIND_OPS[kind] if not kernels.calls.get(op)] for kind in report.replaced}
    missing = {kind: ops for kind, ops in missing.items() if ops}
    assert not missing, f"replaced but never called: {missing} (calls: {kernels.calls})"


def snapshot(model: torch.nn.Module) -> dict:
    """Every module's attributes (by identity), parameters and buffers (objects and values)."""
    state = {}
    for path, m in model.named_modules():
        attrs = dict(vars(m))
        tensors = {**{f"p.{k}": v for k, v in m._parameters.items()}, **{f"b.{k}": v for k, v in m._buffers.items()}}
        state[path] = (type(m), attrs, {k: (v, None if v is None else v.detach().clone()) for k, v in tensors.items()},
                       dict(m._modules))
    return state


def assert_restored(model: torch.nn.Module, before: dict, added_by_the_run: tuple[str, ...] = ()) -> None:
    """The model is the one `before` describes, attribute for attribute and bit for bit (but for
    attributes `added_by_the_run`: what the library itself adds when the model first runs)."""
    after = snapshot(model)
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
        for k, (t, value) in tensors.items():
            assert tensors2[k][0] is t, f"{path}.{k} is not the original tensor"
            assert t is None or torch.equal(t, value), f"{path}.{k} changed"
        assert {k: id(v) for k, v in children2.items()} == {k: id(v) for k, v in children.items()}, path
