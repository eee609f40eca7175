"""The quant family's catalog entries (tests/op_catalog.py gathers them): quantize_fp8 and act_mul_fp8
(e4m3 codes and a scale per row), on rows [B, S, H] of the row cases (op_catalog.ROW_SHAPES)."""

from op_catalog import rows


def entries():
    def quantize(m, case):
        shape, lay = rows(m, case)
        return (m.tensor(shape, lay, scale=3.0, offset=0.0),), ()

    def act_mul(act: str):
        def build(m, case):
            shape, lay = rows(m, case)
            return (m.tensor(shape, lay, scale=3.0, offset=0.0), m.tensor(shape, lay), act), ()
        return build

    return {"quantize_fp8": ("quantize_fp8", quantize), "act_mul_fp8[silu]": ("act_mul_fp8", act_mul("silu")),
            "act_mul_fp8[gelu_tanh]": ("act_mul_fp8", act_mul("gelu_tanh"))}
