// Kernel lab: times the torch-free kernels straight from their headers (no torch, no build of the
// extension), so that several builds of one tuning knob can be compared in one GPU call:
// workshop/gpu_lab.sh compiles this file once per variant (-D flags) in parallel and runs each.
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -arch=sm_90 -Icsrc [-DTK_...] workshop/lab/kernel_lab.cu
//   ./kernel_lab [case-name-substring ...]
//
// Prints one line per case: device time (median of CUDA-event timings, L2 flushed before each),
// GB/s counting each input read once and each output written once, and % of a device-to-device
// copy timed in the same process. bf16 throughout, shapes from the target models. The numbers are
// for choosing between variants; the project's benchmark of record is benchmarks/bench_micro.py.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "activation/activation.cuh"
#include "norm/norm.cuh"
#include "rope/qk_norm_rope.cuh"
#include "rope/rope.cuh"

using namespace transformer_kernels;
using bf16 = __nv_bfloat16;

#define CHECK(call)                                                                          \
  do {                                                                                       \
    const cudaError_t err_ = (call);                                                         \
    if (err_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err_));      \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

namespace {

constexpr int kReps = 25;
constexpr size_t kFlushBytes = size_t{256} << 20;  // > 5x the H200's 50 MB L2

__global__ void fill_kernel(bf16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 13, h *= 0x5bd1e995u, h ^= h >> 15;
    p[i] = __float2bfloat16(static_cast<float>(h & 0xffff) / 32768.f - 1.f);  // [-1, 1)
  }
}

__global__ void fill_float_kernel(float* p, size_t n, float scale) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    p[i] = scale * static_cast<float>(i % 997) / 997.f;
}

// A device buffer of n elements of T (at least one), filled by `fill<<<grid, 256>>>(p, n, arg)`.
template <typename T, typename Arg>
T* device_buffer(size_t n, void (*fill)(T*, size_t, Arg), Arg arg, unsigned grid) {
  T* p;
  CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  fill<<<grid, 256>>>(p, n, arg);
  CHECK(cudaGetLastError());
  return p;
}

bf16* random_bf16(size_t n, uint32_t seed) { return device_buffer(n, fill_kernel, seed, 1024); }
float* ramp_float(size_t n, float scale) { return device_buffer(n, fill_float_kernel, scale, 256); }

// LTXVideoRotaryPosEmbed's grid [batch, seq, 3] for frames of height x width tokens, in token order
// (frame, row, column), each coordinate scaled into [0, 1) as diffusers scales it by its base sizes.
float* video_grid(int64_t batch, int64_t seq, int64_t width, int64_t height) {
  const int64_t frames = (seq + width * height - 1) / (width * height);
  std::vector<float> host(static_cast<size_t>(batch * seq * 3));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < seq; ++s) {
      float* g = &host[static_cast<size_t>((b * seq + s) * 3)];
      g[0] = static_cast<float>(s / (width * height)) / static_cast<float>(frames);
      g[1] = static_cast<float>(s / width % height) / static_cast<float>(height);
      g[2] = static_cast<float>(s % width) / static_cast<float>(width);
    }
  float* p;
  CHECK(cudaMalloc(&p, host.size() * sizeof(float)));
  CHECK(cudaMemcpy(p, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  return p;
}

// Reads n 16-byte words: evicts L2 like the memset flush but leaves its lines clean.
__global__ void read_flush_kernel(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // the buffer is zeros: never taken, but keeps the loads
}

// LAB_FLUSH=read flushes L2 by reading instead of writing (the default, as triton's do_bench
// does): a diagnostic of what the memset's dirty lines, written back during the timed kernel, cost.
bool read_flush() {
  const char* v = std::getenv("LAB_FLUSH");
  return v != nullptr && std::strcmp(v, "read") == 0;
}

void flush_l2(void* buffer) {
  if (read_flush()) {
    read_flush_kernel<<<1024, 256>>>(static_cast<const uint4*>(buffer), kFlushBytes / sizeof(uint4),
                                     static_cast<unsigned*>(buffer));
    CHECK(cudaGetLastError());
  } else {
    CHECK(cudaMemsetAsync(buffer, 0, kFlushBytes));
  }
}

// Median device time (µs) of `launch`, each run after flushing L2 with a 256 MB buffer.
double time_us(const std::function<void()>& launch) {
  static void* flush = [] {
    void* p;
    CHECK(cudaMalloc(&p, kFlushBytes));
    CHECK(cudaMemset(p, 0, kFlushBytes));
    return p;
  }();
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  launch();  // warm-up
  CHECK(cudaGetLastError());
  std::vector<float> ms(kReps);
  for (float& t : ms) {
    flush_l2(flush);
    CHECK(cudaEventRecord(start));
    launch();
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    CHECK(cudaEventElapsedTime(&t, start, stop));
  }
  CHECK(cudaGetLastError());
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  std::nth_element(ms.begin(), ms.begin() + kReps / 2, ms.end());
  return 1e3 * ms[kReps / 2];
}

// Row indexer of a [rows, cols] row-major matrix whose rows are `row_stride` elements apart.
RowIndexer rows_of(int64_t rows, int64_t row_stride) {
  RowIndexer r;
  const int64_t sizes[1] = {rows}, strides[1] = {row_stride};
  make_row_indexer(sizes, strides, 1, &r);
  return r;
}

// q/k rows with the kernels' 32-bit dividers, as the extension sets them (-DLAB_SLOW_DIVISION
// keeps the 64-bit divisions, for the A/B of the dividers).
QkRows<bf16> lab_divisors(const QkRows<bf16>& qk) {
#ifdef LAB_SLOW_DIVISION
  return qk;
#else
  return qk.with_fast_divisors();
#endif
}

// [B, S] rows broadcast from [B, 1, C]: scale, shift and gate of LTX's AdaLN (one row per sample).
RowIndexer per_sample_rows(int64_t batch, int64_t seq, int64_t cols) {
  RowIndexer r;
  const int64_t sizes[2] = {batch, seq}, strides[2] = {cols, 0};
  make_row_indexer(sizes, strides, 2, &r);
  return r;
}

struct Case {
  std::string name;
  double bytes;  // each input read once, each output written once
  std::function<void()> launch;
};

std::vector<Case> make_cases() {
  std::vector<Case> cases;
  const size_t kBf16 = sizeof(bf16);

  // silu_and_mul on Llama-3-8B's concatenated gate/up projection: [4096, 2 x 14336].
  {
    const int64_t rows = 4096, h = 14336;
    bf16* in = random_bf16(rows * 2 * h, 1);
    bf16* out = random_bf16(rows * h, 2);
    ElementwiseParams<bf16> p{};
    p.gate = in, p.gate_rows = rows_of(rows, 2 * h);
    p.gated = in + h, p.gated_rows = p.gate_rows;
    p.out = out, p.out_rows = rows_of(rows, h);
    p.num_rows = rows, p.cols = h;
    cases.push_back({"silu_and_mul 4096x(2x14336)", 3.0 * rows * h * kBf16,
                     [p] { CHECK((elementwise<Elementwise::kActMul, Activation::kSilu>(p, 0))); }});
  }
  // gelu (tanh) on LTX's FFN hidden: [2 x 8064, 8192].
  {
    const int64_t rows = 16128, h = 8192;
    bf16* in = random_bf16(rows * h, 3);
    bf16* out = random_bf16(rows * h, 4);
    ElementwiseParams<bf16> p{};
    p.x = in, p.x_rows = rows_of(rows, h);
    p.out = out, p.out_rows = p.x_rows;
    p.num_rows = rows, p.cols = h;
    cases.push_back({"gelu_tanh 16128x8192", 2.0 * rows * h * kBf16,
                     [p] { CHECK((elementwise<Elementwise::kAct, Activation::kGeluTanh>(p, 0))); }});
    // A short LTX clip (1536 tokens, 50 MB): 2.33 waves of one-row blocks at 48 registers.
    const int64_t short_rows = 1536;
    ElementwiseParams<bf16> ps = p;
    ps.x_rows = ps.out_rows = rows_of(short_rows, h), ps.num_rows = short_rows;
    cases.push_back({"gelu_tanh 1536x8192", 2.0 * short_rows * h * kBf16,
                     [ps] { CHECK((elementwise<Elementwise::kAct, Activation::kGeluTanh>(ps, 0))); }});
  }
  // gated residual x + gate * y of an LTX block: [2, 8064, 2048], gate [2, 1, 2048].
  {
    const int64_t batch = 2, seq = 8064, c = 2048, rows = batch * seq;
    bf16* x = random_bf16(rows * c, 5);
    bf16* y = random_bf16(rows * c, 6);
    bf16* gate = random_bf16(batch * c, 7);
    bf16* out = random_bf16(rows * c, 8);
    ElementwiseParams<bf16> p{};
    p.x = x, p.x_rows = rows_of(rows, c);
    p.gated = y, p.gated_rows = p.x_rows;
    p.gate = gate, p.gate_rows = per_sample_rows(batch, seq, c);
    p.out = out, p.out_rows = p.x_rows;
    p.num_rows = rows, p.cols = c;
    cases.push_back({"gated_add 2x8064x2048", (3.0 * rows + batch) * c * kBf16,
                     [p] { CHECK((elementwise<Elementwise::kGatedAdd, Activation::kNone>(p, 0))); }});
  }
  // Norms: plain and fused-add RMSNorm (LLM prefill), modulated and gated (LTX blocks).
  auto norm_case = [&](const std::string& name, int64_t batch, int64_t seq, int64_t c, PreAdd pre, bool mod,
                       NormType type = NormType::kRms, bool split = false) {
    const int64_t rows = batch * seq;
    NormParams<bf16, bf16, bf16> p{};
    p.x = random_bf16(rows * c, 9), p.x_rows = rows_of(rows, c);
    p.weight = random_bf16(c, 10);
    p.out = random_bf16(rows * c, 11), p.out_rows = p.x_rows;
    double bytes = 2.0 * rows * c + c;
    if (pre != PreAdd::kNone) {
      p.residual = random_bf16(rows * c, 12), p.residual_rows = p.x_rows;
      p.h_out = random_bf16(rows * c, 13), p.h_rows = p.x_rows;
      bytes += 2.0 * rows * c;
    }
    if (pre == PreAdd::kGated) {
      p.gate = random_bf16(batch * c, 14), p.gate_rows = per_sample_rows(batch, seq, c);
      bytes += batch * c;
    }
    if (mod) {
      p.scale = random_bf16(batch * c, 15), p.scale_rows = per_sample_rows(batch, seq, c);
      p.shift = random_bf16(batch * c, 16), p.shift_rows = p.scale_rows;
      bytes += 2.0 * batch * c;
    }
    if (type == NormType::kLayer) {
      p.bias = random_bf16(c, 17);
      bytes += c;
    }
    p.num_rows = rows, p.hidden = c, p.eps = 1e-6f, p.round_normalized = true;
    if (split) {  // as the binding does for a few very wide rows (norm_split_chunks)
      p.split_chunks = norm_chunks(c);
      p.split_chunk_elems = NormPolicy::kSplitChunkElems;
      CHECK(cudaMalloc(&p.split_stats, sizeof(float) * rows * p.split_chunks * kChunkStatFloats));
    }
    std::function<void()> launch;
    if (type == NormType::kLayer) {
      launch = [p] { CHECK((norm<NormType::kLayer, PreAdd::kNone, false>(p, 0))); };
      cases.push_back({name, bytes * kBf16, launch});
      return;
    }
    if (pre == PreAdd::kNone && !mod) launch = [p] { CHECK((norm<NormType::kRms, PreAdd::kNone, false>(p, 0))); };
    if (pre == PreAdd::kResidual && !mod) launch = [p] { CHECK((norm<NormType::kRms, PreAdd::kResidual, false>(p, 0))); };
    if (pre == PreAdd::kNone && mod) launch = [p] { CHECK((norm<NormType::kRms, PreAdd::kNone, true>(p, 0))); };
    if (pre == PreAdd::kGated && mod) launch = [p] { CHECK((norm<NormType::kRms, PreAdd::kGated, true>(p, 0))); };
    cases.push_back({name, bytes * kBf16, launch});
  };
  norm_case("rms_norm 16384x4096", 1, 16384, 4096, PreAdd::kNone, false);
  norm_case("rms_norm 2048x4096", 1, 2048, 4096, PreAdd::kNone, false);
  norm_case("fused_add_rms_norm 16384x4096", 1, 16384, 4096, PreAdd::kResidual, false);
  norm_case("fused_add_rms_norm 2048x4096", 1, 2048, 4096, PreAdd::kResidual, false);
  norm_case("layer_norm 8192x4096", 1, 8192, 4096, PreAdd::kNone, false, NormType::kLayer);
  norm_case("rms_norm 64x262144 whole rows", 1, 64, 262144, PreAdd::kNone, false);
  norm_case("rms_norm 64x262144 split", 1, 64, 262144, PreAdd::kNone, false, NormType::kRms, true);
  norm_case("layer_norm 64x262144 whole rows", 1, 64, 262144, PreAdd::kNone, false, NormType::kLayer);
  norm_case("layer_norm 64x262144 split", 1, 64, 262144, PreAdd::kNone, false, NormType::kLayer, true);
  norm_case("fused_add_rms_norm 16x65536 whole rows", 1, 16, 65536, PreAdd::kResidual, false);
  norm_case("fused_add_rms_norm 16x65536 split", 1, 16, 65536, PreAdd::kResidual, false, NormType::kRms, true);
  norm_case("norm_modulate 2x8064x2048", 2, 8064, 2048, PreAdd::kNone, true);
  norm_case("norm_modulate 2x7392x4096", 2, 7392, 4096, PreAdd::kNone, true);
  norm_case("gated_add_norm_modulate 2x8064x2048", 2, 8064, 2048, PreAdd::kGated, true);
  norm_case("gated_add_norm_modulate 2x7392x4096", 2, 7392, 4096, PreAdd::kGated, true);
  norm_case("layer_norm_modulate 1x4608x3072", 1, 4608, 3072, PreAdd::kNone, true, NormType::kLayer);  // Flux

  // LTX attention's q/k: [2, 8064, 2048] each; RoPE with cos/sin from the token coordinates, and
  // the fused q/k RMSNorm + RoPE from coordinates and from diffusers' fp32 tables.
  {
    const int64_t batch = 2, seq = 8064, c = 2048, tokens = batch * seq;
    bf16* q = random_bf16(tokens * c, 17);
    bf16* k = random_bf16(tokens * c, 18);
    bf16* q_out = random_bf16(tokens * c, 19);
    bf16* k_out = random_bf16(tokens * c, 20);
    QkRows<bf16> qk{};
    const HeadStrides st{seq * c, c, c};
    qk.q = q, qk.k = k, qk.q_out = q_out, qk.k_out = k_out;
    qk.q_strides = qk.k_strides = qk.q_out_strides = qk.k_out_strides = st;
    qk.batch = batch, qk.seq = seq, qk.num_q_heads = qk.num_k_heads = 1;
    qk = lab_divisors(qk);
    LtxCoords coords;
    coords.grid = video_grid(batch, seq, 24, 16);  // 21 frames of 16 x 24 tokens, as LTX's patches
    coords.grid_b = seq * 3, coords.grid_s = 3, coords.grid_c = 1;
    coords.freqs = ramp_float(c / 6, 15708.f);  // up to 10000 * pi / 2, as LTX's
    coords.pad_pairs = static_cast<int>(c % 6 / 2);
    const double qk_bytes = 4.0 * tokens * c * kBf16;

    RopeParams<bf16, float> rp{};
    rp.qk = qk, rp.coords = coords, rp.head_dim = rp.rotary_dim = static_cast<int>(c);
    rp.copy_pass_through = false;
    cases.push_back({"ltx_rope_from_coords 2x8064x2048", qk_bytes, [rp] {
                       CHECK((rope<RopeStyle::kInterleaved, true, CosSinSource::kLtxCoords>(rp, 0)));
                     }});
    RopeParams<bf16, float> tr = rp;  // diffusers' fp32 tables [B, S, C], read once for q and k
    tr.cos = ramp_float(tokens * c, 1.f), tr.sin = ramp_float(tokens * c, 1.f);
    tr.table_b = seq * c, tr.table_s = c;
    cases.push_back({"ltx_rope tables 2x8064x2048", qk_bytes + 2.0 * tokens * c * sizeof(float), [tr] {
                       CHECK((rope<RopeStyle::kInterleaved, true, CosSinSource::kTables>(tr, 0)));
                     }});

    QkNormRopeParams<bf16, bf16, float> np{};
    np.qk = qk, np.q_weight = random_bf16(c, 21), np.k_weight = random_bf16(c, 22);
    np.coords = coords, np.width = static_cast<int>(c), np.eps = 1e-5f;
    cases.push_back({"ltx_qk_norm_rope_from_coords 2x8064x2048", qk_bytes, [np] {
                       CHECK((qk_norm_rope<QkNormRopeForm::kDiffusers, CosSinSource::kLtxCoords>(np, 0)));
                     }});
    QkNormRopeParams<bf16, bf16, float> tp = np;
    tp.cos = ramp_float(tokens * c, 1.f), tp.sin = ramp_float(tokens * c, 1.f);
    tp.table_b = seq * c, tp.table_s = c;
    cases.push_back({"ltx_qk_norm_rope tables 2x8064x2048", qk_bytes + 2.0 * tokens * c * sizeof(float), [tp] {
                       CHECK((qk_norm_rope<QkNormRopeForm::kDiffusers, CosSinSource::kTables>(tp, 0)));
                     }});
  }
  // transformers' RoPE on Llama-3-8B prefill: q, k views of a fused QKV [4, 4096, 48, 128], NeoX
  // pairs, bf16 tables [4, 4096, 128], out of place.
  {
    const int64_t batch = 4, seq = 4096, d = 128, hq = 32, hk = 8, tokens = batch * seq;
    bf16* qkv = random_bf16(tokens * 48 * d, 23);
    QkRows<bf16> qk{};
    qk.q = qkv, qk.k = qkv + hq * d;
    qk.q_strides = qk.k_strides = HeadStrides{seq * 48 * d, 48 * d, d};
    qk.q_out = random_bf16(tokens * hq * d, 24), qk.q_out_strides = HeadStrides{seq * hq * d, hq * d, d};
    qk.k_out = random_bf16(tokens * hk * d, 25), qk.k_out_strides = HeadStrides{seq * hk * d, hk * d, d};
    qk.batch = batch, qk.seq = seq, qk.num_q_heads = static_cast<int>(hq), qk.num_k_heads = static_cast<int>(hk);
    qk = lab_divisors(qk);
    RopeParams<bf16, bf16> rp{};
    rp.qk = qk, rp.cos = random_bf16(tokens * d, 26), rp.sin = random_bf16(tokens * d, 27);
    rp.table_b = seq * d, rp.table_s = d, rp.head_dim = rp.rotary_dim = static_cast<int>(d);
    rp.copy_pass_through = false;
    const double bytes = (2.0 * tokens * (hq + hk) * d + 2.0 * tokens * d) * kBf16;
    cases.push_back({"hf_rope 4x4096 q32 k8 d128", bytes, [rp] {
                       CHECK((rope<RopeStyle::kNeox, false, CosSinSource::kTables>(rp, 0)));
                     }});
    // Qwen3's per-head q/k RMSNorm + the same RoPE, on the first sample: [1, 4096, 32 + 8, 128].
    QkNormRopeParams<bf16, bf16, bf16> np{};
    np.qk = qk, np.qk.batch = 1;
    np.qk = lab_divisors(np.qk);
    np.q_weight = random_bf16(d, 28), np.k_weight = random_bf16(d, 29);
    np.cos = rp.cos, np.sin = rp.sin, np.table_b = 0, np.table_s = d;
    np.width = static_cast<int>(d), np.eps = 1e-6f;
    cases.push_back({"qwen3_qk_norm_rope 1x4096 q32 k8 d128", bytes / batch, [np] {
                       CHECK((qk_norm_rope<QkNormRopeForm::kTransformers, CosSinSource::kTables>(np, 0)));
                     }});
  }
  // Flux's RoPE: q, k [1, 4608, 24, 128] (diffusers' [B, S, H, d] memory), interleaved pairs, fp32
  // tables [S, d] shared by every head, in place.
  {
    const int64_t seq = 4608, heads = 24, d = 128;
    QkRows<bf16> qk{};
    qk.q = qk.q_out = random_bf16(seq * heads * d, 30);
    qk.k = qk.k_out = random_bf16(seq * heads * d, 31);
    qk.q_strides = qk.k_strides = qk.q_out_strides = qk.k_out_strides = HeadStrides{seq * heads * d, heads * d, d};
    qk.batch = 1, qk.seq = seq, qk.num_q_heads = qk.num_k_heads = static_cast<int>(heads);
    qk = lab_divisors(qk);
    RopeParams<bf16, float> rp{};
    rp.qk = qk, rp.cos = ramp_float(seq * d, 1.f), rp.sin = ramp_float(seq * d, 1.f);
    rp.table_b = 0, rp.table_s = d, rp.head_dim = rp.rotary_dim = static_cast<int>(d);
    rp.copy_pass_through = false;
    const double bytes = 4.0 * seq * heads * d * kBf16 + 2.0 * seq * d * sizeof(float);
    cases.push_back({"flux_rope 1x4608x24x128", bytes, [rp] {
                       CHECK((rope<RopeStyle::kInterleaved, true, CosSinSource::kTables>(rp, 0)));
                     }});
  }
  // vLLM's rotary_embedding: 16384 tokens, q [T, 32 x 128], k [T, 8 x 128] in place, NeoX pairs,
  // a bf16 cos_sin_cache [8192, 128] indexed by positions.
  {
    const int64_t tokens = 16384, hq = 32, hk = 8, d = 128, max_pos = 8192;
    QkRows<bf16> qk{};
    qk.q = qk.q_out = random_bf16(tokens * hq * d, 32);
    qk.k = qk.k_out = random_bf16(tokens * hk * d, 33);
    qk.q_strides = qk.q_out_strides = HeadStrides{tokens * hq * d, hq * d, d};
    qk.k_strides = qk.k_out_strides = HeadStrides{tokens * hk * d, hk * d, d};
    qk.batch = 1, qk.seq = tokens, qk.num_q_heads = static_cast<int>(hq), qk.num_k_heads = static_cast<int>(hk);
    qk = lab_divisors(qk);
    std::vector<int64_t> host_positions(tokens);
    for (int64_t t = 0; t < tokens; ++t) host_positions[t] = (t * 7919) % max_pos;  // non-monotonic
    int64_t* positions;
    CHECK(cudaMalloc(&positions, tokens * sizeof(int64_t)));
    CHECK(cudaMemcpy(positions, host_positions.data(), tokens * sizeof(int64_t), cudaMemcpyHostToDevice));
    RopeParams<bf16, bf16> rp{};
    rp.qk = qk, rp.cos = random_bf16(max_pos * d, 34), rp.positions = positions, rp.max_position = max_pos;
    rp.table_s = d, rp.head_dim = rp.rotary_dim = static_cast<int>(d);
    rp.copy_pass_through = false;
    const double bytes = 2.0 * tokens * (hq + hk) * d * kBf16 + tokens * (sizeof(int64_t) + d * kBf16);
    cases.push_back({"vllm_rope cache 16384 tokens q32 k8 d128", bytes, [rp] {
                       CHECK((rope<RopeStyle::kNeox, false, CosSinSource::kCache>(rp, 0)));
                     }});
  }
  return cases;
}

}  // namespace

int main(int argc, char** argv) {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::vector<Case> cases = make_cases();
  CHECK(cudaDeviceSynchronize());

  const size_t copy_bytes = size_t{512} << 20;
  void *src, *dst;
  CHECK(cudaMalloc(&src, copy_bytes));
  CHECK(cudaMalloc(&dst, copy_bytes));
  const double copy_us = time_us([&] { CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice)); });
  const double copy_gbps = 2.0 * copy_bytes / copy_us * 1e-3;
  std::printf("# %s, copy %.0f GB/s, L2 flushed by %s\n", prop.name, copy_gbps, read_flush() ? "reading" : "a memset");
  for (const Case& c : cases) {
    bool wanted = argc == 1;
    for (int i = 1; i < argc; ++i) wanted |= c.name.find(argv[i]) != std::string::npos;
    if (!wanted) continue;
    const double us = time_us(c.launch);
    const double gbps = c.bytes / us * 1e-3;
    std::printf("%-44s %9.1f us %6.0f GB/s %5.1f %%\n", c.name.c_str(), us, gbps, 100.0 * gbps / copy_gbps);
  }
  return 0;
}
