// Torch entry points of the activation family: validate, pick dtypes, call the torch-free
// launcher in activation.cuh on the current stream of x's device.
#include <ATen/cuda/CUDAContext.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>

#include <string_view>

#include "activation/activation.cuh"
#include "common/checks.h"
#include "common/dispatch.h"

namespace transformer_kernels {
namespace {

// One launch: raw operands with their row addressing, all on x's device with x's dtype.
struct ElementwiseCall {
  const char* op;
  Elementwise kind;
  Activation act;
  const at::Tensor* x;  // decides device and dtype
  const void* a;
  RowIndexer a_rows;
  const void* b = nullptr;
  RowIndexer b_rows;
  const void* c = nullptr;
  RowIndexer c_rows;
  at::Tensor* out;
  int64_t num_rows;
  int64_t cols;
};

Activation resolve_activation(const char* op, std::string_view act) {
  if (act == "silu") return Activation::kSilu;
  if (act == "gelu") return Activation::kGelu;
  if (act == "gelu_tanh") return Activation::kGeluTanh;
  TORCH_CHECK_VALUE(false, op, ": activation must be \"silu\", \"gelu\" or \"gelu_tanh\", got \"", act, "\"");
}

template <Elementwise kOp, Activation kAct>
void run(const ElementwiseCall& c) {
  dispatch_float_dtype(c.x->scalar_type(), "x", [&](auto tag) {
    using T = typename decltype(tag)::type;
    ElementwiseParams<T> p;
    p.a = static_cast<const T*>(c.a);
    p.a_rows = c.a_rows;
    p.b = static_cast<const T*>(c.b);
    p.b_rows = c.b_rows;
    p.c = static_cast<const T*>(c.c);
    p.c_rows = c.c_rows;
    p.out = static_cast<T*>(c.out->data_ptr());
    p.out_rows = row_indexer(c.op, *c.out, "out");
    p.num_rows = c.num_rows;
    p.cols = c.cols;
    const cudaError_t err = elementwise<kOp, kAct>(p, at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(err == cudaSuccess, c.op, ": kernel launch failed: ", cudaGetErrorString(err));
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

void launch(const ElementwiseCall& c) {
  const at::cuda::OptionalCUDAGuard device_guard(c.x->device());
  switch (c.kind) {
    case Elementwise::kAct: return dispatch_activation<Elementwise::kAct>(c);
    case Elementwise::kActMul: return dispatch_activation<Elementwise::kActMul>(c);
    case Elementwise::kGatedAdd: return run<Elementwise::kGatedAdd, Activation::kSilu>(c);  // no activation
  }
}

// ---- act(x) ----

ElementwiseCall activation_call(const at::Tensor& x, std::string_view act, at::Tensor& out) {
  constexpr const char* op = "activation";
  return {op, Elementwise::kAct, resolve_activation(op, act), &x, x.const_data_ptr(), row_indexer(op, x, "x"),
          nullptr, {}, nullptr, {}, &out, num_rows(x), x.size(-1)};
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
  return {op, Elementwise::kActMul, resolve_activation(op, act), &x, act_first ? first : second, rows,
          act_first ? second : first, rows, nullptr, {}, &out, num_rows(x), h};
}

}  // namespace

at::Tensor activation(const at::Tensor& x, std::string_view act) {
  check_row_input("activation", x, "x");
  at::Tensor out = at::empty(x.sizes(), x.options());
  launch(activation_call(x, act, out));
  return out;
}

void activation_out(at::Tensor& out, const at::Tensor& x, std::string_view act) {
  check_row_input("activation", x, "x");
  ElementwiseCall c = activation_call(x, act, out);
  check_output("activation", out, "out", x, x.sizes(), x.scalar_type(), {{&x, "x"}});
  launch(c);
}

at::Tensor act_and_mul(const at::Tensor& x, std::string_view act, bool act_first) {
  check_row_input("act_and_mul", x, "x");
  at::Tensor out = at::empty(half_last_dim("act_and_mul", x), x.options());
  launch(act_and_mul_call(x, act, act_first, out));
  return out;
}

void act_and_mul_out(at::Tensor& out, const at::Tensor& x, std::string_view act, bool act_first) {
  check_row_input("act_and_mul", x, "x");
  const std::vector<int64_t> sizes = half_last_dim("act_and_mul", x);
  ElementwiseCall c = act_and_mul_call(x, act, act_first, out);
  check_output("act_and_mul", out, "out", x, sizes, x.scalar_type(), {{&x, "x"}});
  launch(c);
}

namespace {
ElementwiseCall act_mul_call(const at::Tensor& gate, const at::Tensor& up, std::string_view act, at::Tensor& out) {
  constexpr const char* op = "act_mul";
  check_row_input(op, gate, "gate");
  check_same_as_x(op, up, "up", gate, "gate");
  return {op, Elementwise::kActMul, resolve_activation(op, act), &gate, gate.const_data_ptr(),
          row_indexer(op, gate, "gate"), up.const_data_ptr(), row_indexer(op, up, "up"), nullptr, {}, &out,
          num_rows(gate), gate.size(-1)};
}

ElementwiseCall gated_add_call(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gate, at::Tensor& out) {
  constexpr const char* op = "gated_add";
  check_row_input(op, x, "x");
  check_same_as_x(op, y, "y", x);
  check_broadcasts_to(op, gate, "gate", x);
  return {op, Elementwise::kGatedAdd, Activation::kSilu, &x, x.const_data_ptr(), row_indexer(op, x, "x"),
          y.const_data_ptr(), row_indexer(op, y, "y"), gate.const_data_ptr(),
          broadcast_row_indexer(op, gate, "gate", x), &out, num_rows(x), x.size(-1)};
}
}  // namespace

at::Tensor act_mul(const at::Tensor& gate, const at::Tensor& up, std::string_view act) {
  at::Tensor out;  // allocated once the inputs are known to be valid
  ElementwiseCall c = act_mul_call(gate, up, act, out);
  out = at::empty(gate.sizes(), gate.options());
  launch(c);
  return out;
}

void act_mul_out(at::Tensor& out, const at::Tensor& gate, const at::Tensor& up, std::string_view act) {
  ElementwiseCall c = act_mul_call(gate, up, act, out);
  check_output("act_mul", out, "out", gate, gate.sizes(), gate.scalar_type(), {{&gate, "gate"}, {&up, "up"}},
               "gate");
  launch(c);
}

at::Tensor gated_add(const at::Tensor& x, const at::Tensor& y, const at::Tensor& gate) {
  at::Tensor out;
  ElementwiseCall c = gated_add_call(x, y, gate, out);
  out = at::empty(x.sizes(), x.options());
  launch(c);
  return out;
}

void gated_add_out(at::Tensor& out, const at::Tensor& x, const at::Tensor& y, const at::Tensor& gate) {
  ElementwiseCall c = gated_add_call(x, y, gate, out);
  check_output("gated_add", out, "out", x, x.sizes(), x.scalar_type(), {{&x, "x"}, {&y, "y"}, {&gate, "gate"}});
  launch(c);
}

}  // namespace transformer_kernels
