"""The activation family's catalog entries (tests/op_catalog.py gathers them): activation, act_and_mul
and act_mul with their out= and backward forms, on rows [B, S, H] of the row cases
(op_catalog.ROW_SHAPES)."""

from op_catalog import rows


def entries():
    def act(name: str):
        def build(m, case):
            (B, S, H), lay = rows(m, case)
            return (m.tensor((B, S, H), lay, scale=3.0, offset=0.0), name), ()
        return build

    def act_out(m, case):
        (B, S, H), lay = rows(m, case)
        return (m.nan((B, S, H), lay), m.tensor((B, S, H), lay, scale=3.0, offset=0.0), "gelu_tanh"), (0,)

    def and_mul(name: str, act_first: bool):
        def build(m, case):
            (B, S, H), lay = rows(m, case)
            return (m.tensor((B, S, 2 * H), lay, scale=3.0, offset=0.0), name, act_first), ()
        return build

    def and_mul_out(m, case):
        (B, S, H), lay = rows(m, case)
        return (m.nan((B, S, H), lay), m.tensor((B, S, 2 * H), lay, scale=3.0, offset=0.0), "silu", True), (0,)

    def mul(name: str):
        def build(m, case):
            (B, S, H), lay = rows(m, case)
            return (m.tensor((B, S, H), lay, scale=3.0, offset=0.0), m.tensor((B, S, H), lay), name), ()
        return build

    def mul_out(m, case):
        (B, S, H), lay = rows(m, case)
        return (m.nan((B, S, H), lay), m.tensor((B, S, H), lay, scale=3.0, offset=0.0), m.tensor((B, S, H), lay),
                "gelu"), (0,)

    return {
        "activation[silu]": ("activation", act("silu")),
        "activation[gelu]": ("activation", act("gelu")),
        "activation[gelu_tanh]": ("activation", act("gelu_tanh")),
        "activation_out": ("activation_out", act_out),
        "act_and_mul[silu]": ("act_and_mul", and_mul("silu", True)),
        "act_and_mul[gelu,geglu]": ("act_and_mul", and_mul("gelu", False)),
        "act_and_mul[gelu_tanh]": ("act_and_mul", and_mul("gelu_tanh", True)),
        "act_and_mul_out": ("act_and_mul_out", and_mul_out),
        "act_mul[silu]": ("act_mul", mul("silu")),
        "act_mul[gelu_tanh]": ("act_mul", mul("gelu_tanh")),
        "act_mul_out": ("act_mul_out", mul_out),
        # backward: the output's gradient first, then the forward's inputs
        "activation_backward[gelu_tanh]": ("activation_backward", lambda m, case: (
            (m.tensor(rows(m, case)[0], rows(m, case)[1]), *act("gelu_tanh")(m, case)[0]), ())),
        "act_and_mul_backward[silu]": ("act_and_mul_backward", lambda m, case: (
            (m.tensor(rows(m, case)[0], rows(m, case)[1]), *and_mul("silu", True)(m, case)[0]), ())),
        "act_and_mul_backward[gelu,geglu]": ("act_and_mul_backward", lambda m, case: (
            (m.tensor(rows(m, case)[0], rows(m, case)[1]), *and_mul("gelu", False)(m, case)[0]), ())),
        "act_mul_backward[silu]": ("act_mul_backward", lambda m, case: (
            (m.tensor(rows(m, case)[0], rows(m, case)[1]), *mul("silu")(m, case)[0]), ())),
    }
