"""The quant family's eager CPU stand-ins (tests/eager_kernel.py gathers them): reference/fp8.py's
codes and row scales, of x or of act(gate) * up."""

from eager_kernel import fp8_outputs
from reference.activations import eager_act_mul

IMPLS = {
    "quantize_fp8": lambda x: fp8_outputs(x),
    "act_mul_fp8": lambda g, u, act: fp8_outputs(eager_act_mul(g, u, act)),
}
