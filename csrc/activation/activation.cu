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

// One launch: raw operands with their row addressing, all on x's device with x's dtype (the
// operands as ElementwiseParams names them; absent ones null).
struct ElementwiseCall {
  const char* op;
  Elementwise kind;
  Activation act;
  const at::Tensor* input;  // decides device and dtype
  at::Tensor* out;
  int64_t num_rows;
  int64_t cols;
  const void* x = nullptr;
  RowIndexer x_rows;
  const void* gated = nullptr;
  RowIndexer gated_rows;
  const void* gate = nullptr;
  RowIndexer gate_rows;

  ElementwiseCall(const char* op_, Elementwise kind_, Activation act_, const at::Tensor& input_, at::Tensor& out_,
                  int64_t num_rows_, int64_t cols_)
      : op(op_), kind(kind_), act(act_), input(&input_), out(&out_), num_rows(num_rows_), cols(cols_) {}
};


template <Elementwise kOp, Activation kAct>
void run(const ElementwiseCall& c) {
  dispatch_float_dtype(c.input->scalar_type(), "x", [&](auto tag) {
    using T = typename decltype(tag)::type;
    ElementwiseParams<T> p;
    p.x = static_cast<const T*>(c.x);
    p.x_rows = c.x_rows;
    p.gated = static_cast<const T*>(c.gated);
    p.gated_rows = c.gated_rows;
    p.gate = static_cast<const T*>(c.gate);
    p.gate_rows = c.gate_rows;
    p.out = static_cast<T*>(c.out->data_ptr());
    p.out_rows = row_indexer(c.op, *c.out, "out");
    p.num_rows = c.num_rows;
    p.cols = c.cols;
    const cudaError_t err = elementwise<kOp, kAct>(p, at::cuda::getCurrentCUDAStream());
    check_launch(c.op, err);
  });
}

template <Elementwise kOp>
void dispatch_activation(const ElementwiseCall& c) {
  switch (c.act) {
    case Activation::kSilu: return run<kOp, Activation::kSilu>(c);
    case Activation::kGelu: return run<kOp, Activation::kGelu>(c);
    case Activation::kGeluTanh: return run<kOp, Activation::kGeluTanh>(c);
  }
}

void launch_elementwise_call(const ElementwiseCall& c) {
  if (validation_only(*c.input)) return;
  const at::cuda::OptionalCUDAGuard device_guard(c.input->device());
  switch (c.kind) {
    case Elementwise::kAct: return dispatch_activation<Elementwise::kAct>(c);
    case Elementwise::kActMul: return dispatch_activation<Elementwise::kActMul>(c);
    case Elementwise::kGatedAdd:
      TORCH_CHECK(false, c.op, ": the gated add is the norm family's (norm/gated_add.cu)");
  }
}

// ---- act(x) ----

ElementwiseCall activation_call(const at::Tensor& x, std::string_view act, at::Tensor& out) {
  constexpr const char* op = "activation";
  ElementwiseCall c(op, Elementwise::kAct, resolve_activation(op, act), x, out, num_rows(x), x.size(-1));
  c.x = x.const_data_ptr();
  c.x_rows = row_indexer(op, x, "x");
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

ElementwiseCall act_and_mul_call(const at::Tensor& x, std::string_view act, bool act_first, at::Tensor& out) {
  constexpr const char* op = "act_and_mul";
  const int64_t h = x.size(-1) / 2;
  const RowIndexer rows = row_indexer(op, x, "x");
  const char* first = static_cast<const char*>(x.const_data_ptr());
  const char* second = first + h * static_cast<int64_t>(x.element_size());
  ElementwiseCall c(op, Elementwise::kActMul, resolve_activation(op, act), x, out, num_rows(x), h);
  c.gate = act_first ? first : second;  // the activated half
  c.gate_rows = rows;
  c.gated = act_first ? second : first;
  c.gated_rows = rows;
  return c;
}

}  // namespace

at::Tensor activation(const at::Tensor& x, std::string_view act) {
  check_row_input("activation", x, "x");
  at::Tensor out = empty_tensor(x.sizes(), x.options());
  launch_elementwise_call(activation_call(x, act, out));
  return out;
}

void activation_out(at::Tensor& out, const at::Tensor& x, std::string_view act) {
  check_row_input("activation", x, "x");
  ElementwiseCall c = activation_call(x, act, out);
  check_output("activation", out, "out", x, x.sizes(), x.scalar_type(), {{&x, "x"}});
  launch_elementwise_call(c);
}

at::Tensor act_and_mul(const at::Tensor& x, std::string_view act, bool act_first) {
  check_row_input("act_and_mul", x, "x");
  at::Tensor out = empty_tensor(half_last_dim("act_and_mul", x), x.options());
  launch_elementwise_call(act_and_mul_call(x, act, act_first, out));
  return out;
}

void act_and_mul_out(at::Tensor& out, const at::Tensor& x, std::string_view act, bool act_first) {
  check_row_input("act_and_mul", x, "x");
  const std::vector<int64_t> sizes = half_last_dim("act_and_mul", x);
  ElementwiseCall c = act_and_mul_call(x, act, act_first, out);
  check_output("act_and_mul", out, "out", x, sizes, x.scalar_type(), {{&x, "x"}});
  launch_elementwise_call(c);
}

namespace {
ElementwiseCall act_mul_call(const at::Tensor& gate, const at::Tensor& up, std::string_view act, at::Tensor& out) {
  constexpr const char* op = "act_mul";
  check_row_input(op, gate, "gate");
  check_same_as_x(op, up, "up", gate, "gate");
  ElementwiseCall c(op, Elementwise::kActMul, resolve_activation(op, act), gate, out, num_rows(gate), gate.size(-1));
  c.gate = gate.const_data_ptr();
  c.gate_rows = row_indexer(op, gate, "gate");
  c.gated = up.const_data_ptr();
  c.gated_rows = row_indexer(op, up, "up");
  return c;
}

}  // namespace

at::Tensor act_mul(const at::Tensor& gate, const at::Tensor& up, std::string_view act) {
  at::Tensor out;  // allocated once the inputs are known to be valid
  ElementwiseCall c = act_mul_call(gate, up, act, out);
  out = empty_tensor(gate.sizes(), gate.options());
  launch_elementwise_call(c);
  return out;
}

void act_mul_out(at::Tensor& out, const at::Tensor& gate, const at::Tensor& up, std::string_view act) {
  ElementwiseCall c = act_mul_call(gate, up, act, out);
  check_output("act_mul", out, "out", gate, gate.sizes(), gate.scalar_type(), {{&gate, "gate"}, {&up, "up"}},
               "gate");
  launch_elementwise_call(c);
}

// The entry points defined above are the ones ops.h declares: a definition with another signature
// would be a second overload, and taking its address here ambiguous (a compile error, not a failure
// to load the extension).
[[maybe_unused]] constexpr auto kDeclaredEntryPoints = std::make_tuple(&activation, &activation_out, &act_and_mul,
    &act_and_mul_out, &act_mul, &act_mul_out);

}  // namespace transformer_kernels
