// Torch entry points of the activation family: validate, pick dtypes, call the torch-free
// launcher in activation.cuh on the current stream of x's device.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <string_view>
#include <tuple>

#include "activation/ops.h"
#include "common/alloc.h"
#include "common/checks.h"
#include "common/choices.h"
#include "common/dispatch.h"
#include "common/elementwise.cuh"

namespace transformer_kernels {
namespace {

// One launch: the op's form and activation, the tensor that decides device and dtype, and the
// kernel's params with their pointers' types erased, filled once from the tensors (out at launch).
struct ElementwiseCall {
  const char* op;
  Elementwise kind;
  Activation act;
  const at::Tensor* input;
  ElementwiseParams<void> params;
};

ElementwiseCall make_call(const char* op, Elementwise kind, std::string_view activation, const at::Tensor& input,
                          int64_t cols) {
  ElementwiseCall c{op, kind, resolve_activation(op, activation), &input, {}};
  c.params.num_rows = num_rows(input);
  c.params.cols = cols;
  return c;
}

template <Elementwise kOp, Activation kAct>
void run(const ElementwiseCall& c) {
  dispatch_float_dtype(c.input->scalar_type(), "x", [&](auto tag) {
    using T = typename decltype(tag)::type;
    check_launch(c.op, elementwise<kOp, kAct>(retyped<T>(c.params), at::cuda::getCurrentCUDAStream()));
  });
}

template <Elementwise kOp>
void dispatch_activation(const ElementwiseCall& c) {
  switch (c.act) {
    case Activation::kSilu: return run<kOp, Activation::kSilu>(c);
    case Activation::kGelu: return run<kOp, Activation::kGelu>(c);
    case Activation::kGeluTanh: return run<kOp, Activation::kGeluTanh>(c);
    case Activation::kNone: break;  // resolve_activation accepts none here
  }
}

void launch_elementwise_call(ElementwiseCall c, at::Tensor& out) {
  if (validation_only(*c.input)) return;
  c.params.out = out.data_ptr();
  c.params.out_rows = row_indexer(c.op, out, "out");
  const at::cuda::OptionalCUDAGuard device_guard(c.input->device());
  switch (c.kind) {
    case Elementwise::kAct: return dispatch_activation<Elementwise::kAct>(c);
    case Elementwise::kActMul: return dispatch_activation<Elementwise::kActMul>(c);
    case Elementwise::kGatedAdd:
      TORCH_CHECK(false, c.op, ": the gated add is the norm family's (norm/gated_add.cu)");
  }
}

// ---- act(x) ----

ElementwiseCall activation_call(const at::Tensor& x, std::string_view act) {
  constexpr const char* op = "activation";
  ElementwiseCall c = make_call(op, Elementwise::kAct, act, x, x.size(-1));
  c.params.x = x.const_data_ptr();
  c.params.x_rows = row_indexer(op, x, "x");
  return c;
}

// ---- act(first half) * second half, or the reverse ----

std::vector<int64_t> half_last_dim(const char* op, const at::Tensor& x) {
  TORCH_CHECK_VALUE(x.size(-1) % 2 == 0, op, ": x's last dimension must be even (the two halves [..., 2 * H]), got ",
                    x.size(-1));
  std::vector<int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() /= 2;
  return sizes;
}

ElementwiseCall act_and_mul_call(const at::Tensor& x, std::string_view act, bool act_first) {
  constexpr const char* op = "act_and_mul";
  const int64_t h = x.size(-1) / 2;
  const RowIndexer rows = row_indexer(op, x, "x");
  const char* first = static_cast<const char*>(x.const_data_ptr());
  const char* second = first + h * static_cast<int64_t>(x.element_size());
  ElementwiseCall c = make_call(op, Elementwise::kActMul, act, x, h);
  c.params.gate = act_first ? first : second;  // the activated half
  c.params.gate_rows = rows;
  c.params.gated = act_first ? second : first;
  c.params.gated_rows = rows;
  return c;
}

}  // namespace

at::Tensor activation(const at::Tensor& x, std::string_view act) {
  check_row_input("activation", x, "x");
  const ElementwiseCall c = activation_call(x, act);
  at::Tensor out = empty_tensor(x.sizes(), x.options());
  launch_elementwise_call(c, out);
  return out;
}

void activation_out(at::Tensor& out, const at::Tensor& x, std::string_view act) {
  check_row_input("activation", x, "x");
  const ElementwiseCall c = activation_call(x, act);
  check_output("activation", out, "out", x, x.sizes(), x.scalar_type(), {{&x, "x"}});
  launch_elementwise_call(c, out);
}

at::Tensor act_and_mul(const at::Tensor& x, std::string_view act, bool act_first) {
  check_row_input("act_and_mul", x, "x");
  const std::vector<int64_t> sizes = half_last_dim("act_and_mul", x);
  const ElementwiseCall c = act_and_mul_call(x, act, act_first);
  at::Tensor out = empty_tensor(sizes, x.options());
  launch_elementwise_call(c, out);
  return out;
}

void act_and_mul_out(at::Tensor& out, const at::Tensor& x, std::string_view act, bool act_first) {
  check_row_input("act_and_mul", x, "x");
  const std::vector<int64_t> sizes = half_last_dim("act_and_mul", x);
  const ElementwiseCall c = act_and_mul_call(x, act, act_first);
  check_output("act_and_mul", out, "out", x, sizes, x.scalar_type(), {{&x, "x"}});
  launch_elementwise_call(c, out);
}

namespace {
ElementwiseCall act_mul_call(const at::Tensor& gate, const at::Tensor& up, std::string_view act) {
  constexpr const char* op = "act_mul";
  check_row_input(op, gate, "gate");
  check_same_as_x(op, up, "up", gate, "gate");
  ElementwiseCall c = make_call(op, Elementwise::kActMul, act, gate, gate.size(-1));
  c.params.gate = gate.const_data_ptr();
  c.params.gate_rows = row_indexer(op, gate, "gate");
  c.params.gated = up.const_data_ptr();
  c.params.gated_rows = row_indexer(op, up, "up");
  return c;
}

}  // namespace

at::Tensor act_mul(const at::Tensor& gate, const at::Tensor& up, std::string_view act) {
  const ElementwiseCall c = act_mul_call(gate, up, act);  // validates before the output is allocated
  at::Tensor out = empty_tensor(gate.sizes(), gate.options());
  launch_elementwise_call(c, out);
  return out;
}

void act_mul_out(at::Tensor& out, const at::Tensor& gate, const at::Tensor& up, std::string_view act) {
  const ElementwiseCall c = act_mul_call(gate, up, act);
  check_output("act_mul", out, "out", gate, gate.sizes(), gate.scalar_type(), {{&gate, "gate"}, {&up, "up"}},
               "gate");
  launch_elementwise_call(c, out);
}

// The entry points defined above are the ones ops.h declares: a definition with another signature
// would be a second overload, and taking its address here ambiguous (a compile error, not a failure
// to load the extension).
[[maybe_unused]] constexpr auto kDeclaredEntryPoints = std::make_tuple(&activation, &activation_out, &act_and_mul,
    &act_and_mul_out, &act_mul, &act_mul_out);

}  // namespace transformer_kernels
