// q and k of the RoPE kernels as rows of one head: addressing of [B, S, H, d] views with any
// strides (last dim contiguous), q's heads first. Torch-free.
#pragma once

#include <cstdint>

#include "common/divmod.cuh"
#include "common/math.cuh"
#include "common/vec.cuh"

namespace transformer_kernels {

// A [B, S, H, d] tensor's strides, in elements.
struct HeadStrides {
  int64_t b, s, h;
};

// q and k, inputs and outputs, as [B, S, H, d] views (any strides, last dim contiguous), taken as
// rows of d: row = token * (Hq + Hk) + head, q's heads first. Shared by the RoPE kernels.
template <typename T>
struct QkRows {
  T* q_out;  // [B, S, Hq, d]
  HeadStrides q_out_strides;
  const T* q;  // [B, S, Hq, d]
  HeadStrides q_strides;
  T* k_out;  // [B, S, Hk, d]
  HeadStrides k_out_strides;
  const T* k;  // [B, S, Hk, d]
  HeadStrides k_strides;
  int64_t batch, seq;
  int num_q_heads, num_k_heads;
  // seq and heads() as 32-bit dividers, valid when `fast` (with_fast_divisors: every row index is
  // below kFastDivmodLimit). A thread locates its row once, and many take a single step of it, so
  // two 64-bit divisions (~70-instruction calls each) weighed on the short-row kernels.
  FastDivmod seq_divisor, heads_divisor;
  bool fast = false;

  TK_HOST_DEVICE int heads() const { return num_q_heads + num_k_heads; }
  TK_HOST_DEVICE int64_t num_rows() const { return batch * seq * heads(); }

  // Host side: sets the 32-bit dividers when every row index allows them.
  QkRows with_fast_divisors() const {
    QkRows r = *this;
    r.fast = seq > 0 && heads() > 0 && num_rows() < static_cast<int64_t>(kFastDivmodLimit);
    if (r.fast) {
      r.seq_divisor = FastDivmod(static_cast<uint32_t>(seq));
      r.heads_divisor = FastDivmod(static_cast<uint32_t>(heads()));
    }
    return r;
  }

  // Token `token`'s (b, s).
  TK_DEVICE void token_at(int64_t token, int64_t& b, int64_t& s) const {
    if (fast) {
      const uint32_t t = static_cast<uint32_t>(token), quotient = seq_divisor.div(t);
      b = quotient;
      s = t - quotient * seq_divisor.divisor;
      return;
    }
    b = token / seq;
    s = token % seq;
  }

  // Head `head` of token (b, s) (q's heads first): its input x and its output.
  TK_DEVICE void head_at(int64_t b, int64_t s, int head, const T*& x, T*& out) const {
    const bool is_q = head < num_q_heads;
    const int h = is_q ? head : head - num_q_heads;
    const HeadStrides& in = is_q ? q_strides : k_strides;
    const HeadStrides& o = is_q ? q_out_strides : k_out_strides;
    x = (is_q ? q : k) + b * in.b + s * in.s + h * in.h;
    out = (is_q ? q_out : k_out) + b * o.b + s * o.s + h * o.h;
  }

  // Row `row`'s token (b, s) and head. The fast and slow paths stay apart, so that the compiler
  // drops token_at's 64-bit division from the fast one (merged, they cost the HF kernel 10 registers).
  TK_DEVICE void token_and_head(int64_t row, int64_t& b, int64_t& s, int& head) const {
    if (fast) {
      const uint32_t r = static_cast<uint32_t>(row), token = heads_divisor.div(r);
      token_at(token, b, s);
      head = static_cast<int>(r - token * heads_divisor.divisor);
      return;
    }
    token_at(row / heads(), b, s);
    head = static_cast<int>(row % heads());
  }

  // Row `row`'s token (b, s), its input x and its output.
  TK_DEVICE void locate(int64_t row, int64_t& b, int64_t& s, const T*& x, T*& out) const {
    if (fast) {
      const uint32_t r = static_cast<uint32_t>(row), token = heads_divisor.div(r);
      token_at(token, b, s);
      head_at(b, s, static_cast<int>(r - token * heads_divisor.divisor), x, out);
      return;
    }
    token_at(row / heads(), b, s);
    head_at(b, s, static_cast<int>(row % heads()), x, out);
  }

  // True when every pointer and stride allows vec_t<T, kElems> (host side).
  template <int kElems>
  bool aligned() const {
    auto strides_ok = [](const HeadStrides& st) { return st.b % kElems == 0 && st.s % kElems == 0 && st.h % kElems == 0; };
    return is_vec_aligned<T, kElems>(q) && is_vec_aligned<T, kElems>(k) && is_vec_aligned<T, kElems>(q_out) &&
           is_vec_aligned<T, kElems>(k_out) && strides_ok(q_strides) && strides_ok(k_strides) &&
           strides_ok(q_out_strides) && strides_ok(k_out_strides);
  }
};

}  // namespace transformer_kernels
