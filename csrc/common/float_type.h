// The floating-point storage types of the kernels, named without torch: what a torch-free launcher
// takes to give type-erased pointers their types.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>
#include <type_traits>

namespace transformer_kernels {

template <typename T>
struct type_tag {
  using type = T;
};

enum class FloatType { kFloat32, kFloat16, kBFloat16 };

template <typename T>
constexpr FloatType float_type_of() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>,
                "float, __half or __nv_bfloat16");
  if constexpr (std::is_same_v<T, float>) return FloatType::kFloat32;
  else if constexpr (std::is_same_v<T, __half>) return FloatType::kFloat16;
  else return FloatType::kBFloat16;
}

// Calls f(type_tag<T>{}) with T = float, __half or __nv_bfloat16 for `type`; returns what f returns.
template <typename F>
decltype(auto) with_float_type(FloatType type, F&& f) {
  switch (type) {
    case FloatType::kFloat16: return f(type_tag<__half>{});
    case FloatType::kBFloat16: return f(type_tag<__nv_bfloat16>{});
    case FloatType::kFloat32: break;
  }
  return f(type_tag<float>{});
}

// A launch's params with its pointers' types given back (or erased: retyped<void, void, void>):
// the instantiations of one params template differ only in their pointees, so they share one
// layout and the bytes carry over as they are (no field list to keep in step with the struct).
template <typename... To, template <typename...> class Params, typename... From>
Params<To...> retyped(const Params<From...>& from) {
  using Result = Params<To...>;
  static_assert(sizeof(Result) == sizeof(from) && alignof(Result) == alignof(Params<From...>),
                "instantiations of one params template share one layout");
  static_assert(std::is_trivially_copyable_v<Result> && std::is_trivially_copyable_v<Params<From...>>,
                "params are copied as bytes");
  Result to;
  std::memcpy(static_cast<void*>(&to), &from, sizeof to);
  return to;
}

}  // namespace transformer_kernels
