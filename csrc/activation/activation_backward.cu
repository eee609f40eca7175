// Torch entry points of the activations' backward: validate, allocate the gradients, call the
// torch-free launcher in activation_backward.cuh on the current stream of x's device.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <string_view>
#include <tuple>
#include <vector>

#include "activation/activation_backward.cuh"
#include "activation/ops.h"
#include "common/alloc.h"
#include "common/checks.h"
#include "common/choices.h"
#include "common/dispatch.h"

namespace transformer_kernels {
namespace {


// One launch: raw operands with their row addressing, on the device and dtype of `like` (the
// operands as ActivationBackwardParams names them; absent ones null).
struct BackwardCall {
  const char* op;
  Activation act;
  const at::Tensor* like;
  const void* grad;
  RowIndexer grad_rows;
  int64_t num_rows;
  int64_t cols;
  const void* x = nullptr;
  RowIndexer x_rows;
  const void* gate = nullptr;
  RowIndexer gate_rows;
  const void* gated = nullptr;
  RowIndexer gated_rows;
  void* grad_x = nullptr;
  RowIndexer grad_x_rows;
  void* grad_gate = nullptr;
  RowIndexer grad_gate_rows;
  void* grad_gated = nullptr;
  RowIndexer grad_gated_rows;

  BackwardCall(const char* op_, Activation act_, const at::Tensor& like_, const at::Tensor& grad_, int64_t num_rows_,
               int64_t cols_)
      : op(op_), act(act_), like(&like_), grad(grad_.const_data_ptr()), grad_rows(row_indexer(op_, grad_, "grad")),
        num_rows(num_rows_), cols(cols_) {}
};

template <Elementwise kOp, Activation kAct>
void run(const BackwardCall& c) {
  dispatch_float_dtype(c.like->scalar_type(), "x", [&](auto tag) {
    using T = typename decltype(tag)::type;
    ActivationBackwardParams<T> p;
    p.grad = static_cast<const T*>(c.grad);
    p.grad_rows = c.grad_rows;
    p.x = static_cast<const T*>(c.x);
    p.x_rows = c.x_rows;
    p.gate = static_cast<const T*>(c.gate);
    p.gate_rows = c.gate_rows;
    p.gated = static_cast<const T*>(c.gated);
    p.gated_rows = c.gated_rows;
    p.grad_x = static_cast<T*>(c.grad_x);
    p.grad_x_rows = c.grad_x_rows;
    p.grad_gate = static_cast<T*>(c.grad_gate);
    p.grad_gate_rows = c.grad_gate_rows;
    p.grad_gated = static_cast<T*>(c.grad_gated);
    p.grad_gated_rows = c.grad_gated_rows;
    p.num_rows = c.num_rows;
    p.cols = c.cols;
    const cudaError_t err = ActivationBackward<kOp, kAct>(p, at::cuda::getCurrentCUDAStream());
    check_launch(c.op, err);
  });
}

template <Elementwise kOp>
void launch_backward_call(const BackwardCall& c) {
  if (validation_only(*c.like)) return;
  const at::cuda::OptionalCUDAGuard device_guard(c.like->device());
  switch (c.act) {
    case Activation::kSilu: return run<kOp, Activation::kSilu>(c);
    case Activation::kGelu: return run<kOp, Activation::kGelu>(c);
    case Activation::kGeluTanh: return run<kOp, Activation::kGeluTanh>(c);
  }
}

// grad: the forward output's gradient, like the forward's output `out_sizes`, same device and dtype as x.
void check_grad(const char* op, const at::Tensor& grad, const at::Tensor& x, const char* x_name,
                at::IntArrayRef out_sizes) {
  check_same_device(op, grad, "grad", x, x_name);
  check_dtype(op, grad, "grad", x.scalar_type(), "the dtype of the forward's output");
  TORCH_CHECK_VALUE(grad.sizes() == out_sizes, op, ": grad must have the forward output's shape ", out_sizes,
                    ", got ", grad.sizes());
  check_last_dim_contiguous(op, grad, "grad");
}

}  // namespace

at::Tensor activation_backward(const at::Tensor& grad, const at::Tensor& x, std::string_view act) {
  constexpr const char* op = "activation_backward";
  check_row_input(op, x, "x");
  check_grad(op, grad, x, "x", x.sizes());
  const Activation a = resolve_activation(op, act);
  at::Tensor grad_x = empty_tensor(x.sizes(), x.options());
  BackwardCall c(op, a, x, grad, num_rows(x), x.size(-1));
  c.x = x.const_data_ptr();
  c.x_rows = row_indexer(op, x, "x");
  c.grad_x = grad_x.data_ptr();
  c.grad_x_rows = row_indexer(op, grad_x, "grad_x");
  launch_backward_call<Elementwise::kAct>(c);
  return grad_x;
}

at::Tensor act_and_mul_backward(const at::Tensor& grad, const at::Tensor& x, std::string_view act, bool act_first) {
  constexpr const char* op = "act_and_mul_backward";
  check_row_input(op, x, "x");
  TORCH_CHECK_VALUE(x.size(-1) % 2 == 0, op, ": x's last dimension must be even (the two halves [..., 2 * H]), got ",
                    x.size(-1));
  std::vector<int64_t> half(x.sizes().begin(), x.sizes().end());
  half.back() /= 2;
  check_grad(op, grad, x, "x", half);
  const Activation a = resolve_activation(op, act);
  const int64_t h = x.size(-1) / 2;
  at::Tensor grad_x = empty_tensor(x.sizes(), x.options());  // [..., 2H]: the gradients of both halves
  const int64_t item = static_cast<int64_t>(x.element_size());
  const char* first = static_cast<const char*>(x.const_data_ptr());
  char* grad_first = static_cast<char*>(grad_x.data_ptr());
  const RowIndexer rows = row_indexer(op, x, "x"), grad_x_rows = row_indexer(op, grad_x, "grad_x");
  // The activated half and the multiplied one: first and second (vLLM's order) or the reverse (GEGLU).
  const int64_t act_at = act_first ? 0 : h * item, mul_at = act_first ? h * item : 0;
  BackwardCall c(op, a, x, grad, num_rows(x), h);
  c.gate = first + act_at;
  c.gate_rows = rows;
  c.gated = first + mul_at;
  c.gated_rows = rows;
  c.grad_gate = grad_first + act_at;
  c.grad_gate_rows = grad_x_rows;
  c.grad_gated = grad_first + mul_at;
  c.grad_gated_rows = grad_x_rows;
  launch_backward_call<Elementwise::kActMul>(c);
  return grad_x;
}

std::tuple<at::Tensor, at::Tensor> act_mul_backward(const at::Tensor& grad, const at::Tensor& gate,
                                                    const at::Tensor& up, std::string_view act) {
  constexpr const char* op = "act_mul_backward";
  check_row_input(op, gate, "gate");
  check_same_as_x(op, up, "up", gate, "gate");
  check_grad(op, grad, gate, "gate", gate.sizes());
  const Activation a = resolve_activation(op, act);
  at::Tensor grad_gate = empty_tensor(gate.sizes(), gate.options());
  at::Tensor grad_up = empty_tensor(gate.sizes(), gate.options());
  BackwardCall c(op, a, gate, grad, num_rows(gate), gate.size(-1));
  c.gate = gate.const_data_ptr();
  c.gate_rows = row_indexer(op, gate, "gate");
  c.gated = up.const_data_ptr();
  c.gated_rows = row_indexer(op, up, "up");
  c.grad_gate = grad_gate.data_ptr();
  c.grad_gate_rows = row_indexer(op, grad_gate, "grad_gate");
  c.grad_gated = grad_up.data_ptr();
  c.grad_gated_rows = row_indexer(op, grad_up, "grad_up");
  launch_backward_call<Elementwise::kActMul>(c);
  return {grad_gate, grad_up};
}

// The entry points defined above are the ones ops.h declares: a definition with another signature
// would be a second overload, and taking its address here ambiguous (a compile error, not a failure
// to load the extension).
[[maybe_unused]] constexpr auto kDeclaredEntryPoints = std::make_tuple(&activation_backward, &act_and_mul_backward,
    &act_mul_backward);

}  // namespace transformer_kernels
