// Kernel lab: times the torch-free kernels straight from their headers (no torch, no build of the
// extension), each case with the release's tuning policy and with every alternative policy of its
// family, side by side, from one binary (workshop/gpu_lab.sh builds it once and runs it).
//
//   nvcc -std=c++17 -O3 --expt-relaxed-constexpr -arch=sm_90 -Icsrc workshop/lab/kernel_lab.cu -o kernel_lab
//   ./kernel_lab --list                                  the variants and the cases
//   ./kernel_lab [--variants a,b] [case-name-substring ...]
//
// Prints one line per case and variant: device time (median of CUDA-event timings, L2 flushed
// before each), GB/s counting each input read once and each output written once, % of a
// device-to-device copy timed in the same process, and the time against the release's policy.
// bf16 throughout, shapes from the target models. The numbers are for choosing between variants;
// the project's benchmark of record is benchmarks/bench_micro.py.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/elementwise.cuh"
#include "norm/norm.cuh"
#include "qk_norm_rope/qk_norm_rope.cuh"
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

// ---- the alternative policies: each derives from its family's release policy ----

struct NormBlockVecs8 : NormPolicy {
  static constexpr int kBlockCachedVecs = 8;
};
struct NormBlockVecs2 : NormPolicy {
  static constexpr int kBlockCachedVecs = 2;
};
struct NormFusedVecs2 : NormPolicy {
  static constexpr int kFusedCachedVecs = 2;
};
struct NormModulatedNoCap : NormPolicy {
  static constexpr int kModulatedRmsRegisterCap = kNoRegisterCap;
};
struct ActVecs2 : ElementwisePolicy {
  static constexpr int kActVecsPerThread = 2;
};
struct GatedVecs2 : ElementwisePolicy {
  static constexpr int kGatedVecsPerThread = 2;
};
struct ActMulNoCap : ElementwisePolicy {
  static constexpr int kActMulRegisterCap = kNoRegisterCap;
};
struct RopeHeads1 : RopePolicy {
  static constexpr int kMaxHeadsPerGroup = 1;
};
struct RopeHeads4 : RopePolicy {
  static constexpr int kMaxHeadsPerGroup = 4;
};
struct RopeCoordsStep1 : RopePolicy {
  static constexpr int kLtxCoordsSteps = 1;
  static constexpr int kLtxCoordsRegisterCap = 48;
};
struct RopeCoordsRow1 : RopePolicy {
  static constexpr int kLtxCoordsRows = 1;
};
struct QkBlockVecs4 : QkNormRopePolicy {
  static constexpr int kBlockCachedVecs = 4;
};
struct QkUnsharedTables : QkNormRopePolicy {
  static constexpr bool kShareTables = false;
};
struct QkEveryGroupWidth : QkNormRopePolicy {
  using RowGroups = RowGroupWidths<4, 8, 16, 32>;
};

// A policy with its name on the command line and what it changes.
template <typename P>
struct Variant {
  using policy = P;
  const char* name;
  const char* what;
};

const auto kNormVariants = std::make_tuple(
    Variant<NormPolicy>{"release", "NormPolicy"},
    Variant<NormBlockVecs8>{"norm_block_vecs_8", "8 cached vectors a thread with a block per row (unfused)"},
    Variant<NormBlockVecs2>{"norm_block_vecs_2", "2 cached vectors a thread with a block per row (unfused)"},
    Variant<NormFusedVecs2>{"norm_fused_vecs_2", "2 cached vectors a thread in the fused norms"},
    Variant<NormModulatedNoCap>{"norm_mod_no_cap", "no register cap on the modulated RMSNorms"});
const auto kActVariants = std::make_tuple(
    Variant<ElementwisePolicy>{"release", "ElementwisePolicy"},
    Variant<ActVecs2>{"act_vecs_2", "2 vectors a thread a step for the activations alone"},
    Variant<GatedVecs2>{"gated_vecs_2", "2 vectors a thread a step for act_mul and gated_add"},
    Variant<ActMulNoCap>{"act_mul_no_cap", "no register cap on act_mul"});
const auto kRopeVariants = std::make_tuple(
    Variant<RopePolicy>{"release", "RopePolicy"},
    Variant<RopeHeads1>{"rope_heads_1", "each head loads its token's cos/sin (table form)"},
    Variant<RopeHeads4>{"rope_heads_4", "up to 4 heads share a load of cos/sin (table form)"},
    Variant<RopeCoordsStep1>{"rope_coords_step_1", "coordinate form: one vector step a thread, 48 registers"},
    Variant<RopeCoordsRow1>{"rope_coords_row_1", "coordinate form: q's and k's rows compute their sines apart"});
const auto kQkVariants = std::make_tuple(
    Variant<QkNormRopePolicy>{"release", "QkNormRopePolicy"},
    Variant<QkBlockVecs4>{"qk_block_vecs_4", "4 cached vectors a thread with a block per row"},
    Variant<QkUnsharedTables>{"qk_unshared_tables", "q's and k's rows load their cos/sin apart (LTX tables)"},
    Variant<QkEveryGroupWidth>{"qk_groups_4_8_16_32", "row groups of 4, 8, 16 and 32 lanes (release: 4, 32)"});

// The families' variant tables by name, for --list.
template <typename F>
void for_each_family(F&& f) {
  f("norm", kNormVariants);
  f("activation", kActVariants);
  f("rope", kRopeVariants);
  f("qk_norm_rope", kQkVariants);
}


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

// q/k rows with the kernels' 32-bit dividers, as the extension sets them.
QkRows<bf16> lab_divisors(const QkRows<bf16>& qk) { return qk.with_fast_divisors(); }

// [B, S] rows broadcast from [B, 1, C]: scale, shift and gate of LTX's AdaLN (one row per sample).
RowIndexer per_sample_rows(int64_t batch, int64_t seq, int64_t cols) {
  RowIndexer r;
  const int64_t sizes[2] = {batch, seq}, strides[2] = {cols, 0};
  make_row_indexer(sizes, strides, 2, &r);
  return r;
}

struct Case {
  std::string name;
  const char* family;
  double bytes;                                               // each input read once, each output written once
  std::vector<std::pair<std::string, std::function<void()>>> runs;  // per variant, the release's first
};

// Adds a case: `launch(policy)` returns the launch of the case's kernel compiled with that policy,
// for each of the family's variants.
template <typename Variants, typename Launch>
void add_case(std::vector<Case>& cases, std::string name, const char* family, double bytes, const Variants& variants,
              Launch launch) {
  Case c{std::move(name), family, bytes, {}};
  std::apply(
      [&](const auto&... v) {
        (c.runs.emplace_back(v.name, std::function<void()>(launch(typename std::decay_t<decltype(v)>::policy{}))),
         ...);
      },
      variants);
  cases.push_back(std::move(c));
}

// The policy type of a `launch(policy)` argument.
template <typename P>
using policy_of = std::decay_t<P>;

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
    add_case(cases, "silu_and_mul 4096x(2x14336)", "activation", 3.0 * rows * h * kBf16, kActVariants, [p](auto policy) {
      return [p] { CHECK((elementwise<Elementwise::kActMul, Activation::kSilu, policy_of<decltype(policy)>>(p, 0))); };
    });
  }
  // gelu (tanh) on LTX's FFN hidden: [2 x 8064, 8192], and a short LTX clip (1536 tokens, 50 MB):
  // 2.33 waves of one-row blocks at 48 registers.
  {
    const int64_t rows = 16128, h = 8192, short_rows = 1536;
    bf16* in = random_bf16(rows * h, 3);
    bf16* out = random_bf16(rows * h, 4);
    ElementwiseParams<bf16> p{};
    p.x = in, p.x_rows = rows_of(rows, h);
    p.out = out, p.out_rows = p.x_rows;
    p.num_rows = rows, p.cols = h;
    ElementwiseParams<bf16> ps = p;
    ps.x_rows = ps.out_rows = rows_of(short_rows, h), ps.num_rows = short_rows;
    for (const auto& [name, q] : {std::pair{"gelu_tanh 16128x8192", p}, std::pair{"gelu_tanh 1536x8192", ps}}) {
      add_case(cases, name, "activation", 2.0 * q.num_rows * h * kBf16, kActVariants, [q = q](auto policy) {
        return [q] { CHECK((elementwise<Elementwise::kAct, Activation::kGeluTanh, policy_of<decltype(policy)>>(q, 0))); };
      });
    }
  }
  // gated residual x + gate * y of an LTX block: [2, 8064, 2048], gate [2, 1, 2048].
  {
    const int64_t batch = 2, seq = 8064, c = 2048, rows = batch * seq;
    ElementwiseParams<bf16> p{};
    p.x = random_bf16(rows * c, 5), p.x_rows = rows_of(rows, c);
    p.gated = random_bf16(rows * c, 6), p.gated_rows = p.x_rows;
    p.gate = random_bf16(batch * c, 7), p.gate_rows = per_sample_rows(batch, seq, c);
    p.out = random_bf16(rows * c, 8), p.out_rows = p.x_rows;
    p.num_rows = rows, p.cols = c;
    add_case(cases, "gated_add 2x8064x2048", "activation", (3.0 * rows + batch) * c * kBf16, kActVariants,
             [p](auto policy) {
               return [p] { CHECK((elementwise<Elementwise::kGatedAdd, Activation::kNone, policy_of<decltype(policy)>>(p, 0))); };
             });
  }
  // Norms: plain and fused-add RMSNorm (LLM prefill), modulated and gated (LTX blocks), LayerNorm.
  auto norm_case = [&](const std::string& name, int64_t batch, int64_t seq, int64_t c, auto type_tag, auto pre_tag,
                       auto mod_tag, bool split = false) {
    constexpr NormType kType = decltype(type_tag)::value;
    constexpr PreAdd kPre = decltype(pre_tag)::value;
    constexpr bool kMod = decltype(mod_tag)::value;
    const int64_t rows = batch * seq;
    NormParams<bf16, bf16, bf16> p{};
    p.x = random_bf16(rows * c, 9), p.x_rows = rows_of(rows, c);
    p.weight = random_bf16(c, 10);
    p.out = random_bf16(rows * c, 11), p.out_rows = p.x_rows;
    double bytes = 2.0 * rows * c + c;
    if (kPre != PreAdd::kNone) {
      p.residual = random_bf16(rows * c, 12), p.residual_rows = p.x_rows;
      p.h_out = random_bf16(rows * c, 13), p.h_rows = p.x_rows;
      bytes += 2.0 * rows * c;
    }
    if (kPre == PreAdd::kGated) {
      p.gate = random_bf16(batch * c, 14), p.gate_rows = per_sample_rows(batch, seq, c);
      bytes += batch * c;
    }
    if (kMod) {
      p.scale = random_bf16(batch * c, 15), p.scale_rows = per_sample_rows(batch, seq, c);
      p.shift = random_bf16(batch * c, 16), p.shift_rows = p.scale_rows;
      bytes += 2.0 * batch * c;
    }
    if (kType == NormType::kLayer) {
      p.bias = random_bf16(c, 17);
      bytes += c;
    }
    p.num_rows = rows, p.hidden = c, p.eps = 1e-6f, p.round_normalized = true;
    if (split) {  // as the binding does for a few very wide rows (norm_split_chunks)
      p.split_chunks = norm_chunks(c);
      p.split_chunk_elems = NormPolicy::kSplitChunkElems;
      CHECK(cudaMalloc(&p.split_stats, sizeof(float) * rows * p.split_chunks * ChunkStatFloats::kForward));
    }
    add_case(cases, name, "norm", bytes * kBf16, kNormVariants, [p](auto policy) {
      return [p] { CHECK((norm<kType, kPre, kMod, policy_of<decltype(policy)>>(p, 0))); };
    });
  };
  using Rms = std::integral_constant<NormType, NormType::kRms>;
  using Layer = std::integral_constant<NormType, NormType::kLayer>;
  using NoPre = std::integral_constant<PreAdd, PreAdd::kNone>;
  using Residual = std::integral_constant<PreAdd, PreAdd::kResidual>;
  using Gated = std::integral_constant<PreAdd, PreAdd::kGated>;
  using Plain = std::false_type;
  using Mod = std::true_type;
  norm_case("rms_norm 16384x4096", 1, 16384, 4096, Rms{}, NoPre{}, Plain{});
  norm_case("rms_norm 2048x4096", 1, 2048, 4096, Rms{}, NoPre{}, Plain{});
  norm_case("rms_norm 16384x1024", 1, 16384, 1024, Rms{}, NoPre{}, Plain{});  // a warp a row (Qwen3-0.6B)
  norm_case("rms_norm 65536x128 heads", 1, 65536, 128, Rms{}, NoPre{}, Plain{});  // 4 lanes a row
  norm_case("fused_add_rms_norm 16384x4096", 1, 16384, 4096, Rms{}, Residual{}, Plain{});
  norm_case("fused_add_rms_norm 2048x4096", 1, 2048, 4096, Rms{}, Residual{}, Plain{});
  norm_case("layer_norm 8192x4096", 1, 8192, 4096, Layer{}, NoPre{}, Plain{});
  norm_case("rms_norm 64x262144 whole rows", 1, 64, 262144, Rms{}, NoPre{}, Plain{});
  norm_case("rms_norm 64x262144 split", 1, 64, 262144, Rms{}, NoPre{}, Plain{}, true);
  norm_case("layer_norm 64x262144 whole rows", 1, 64, 262144, Layer{}, NoPre{}, Plain{});
  norm_case("layer_norm 64x262144 split", 1, 64, 262144, Layer{}, NoPre{}, Plain{}, true);
  norm_case("fused_add_rms_norm 16x65536 whole rows", 1, 16, 65536, Rms{}, Residual{}, Plain{});
  norm_case("fused_add_rms_norm 16x65536 split", 1, 16, 65536, Rms{}, Residual{}, Plain{}, true);
  norm_case("norm_modulate 2x8064x2048", 2, 8064, 2048, Rms{}, NoPre{}, Mod{});
  norm_case("norm_modulate 2x7392x4096", 2, 7392, 4096, Rms{}, NoPre{}, Mod{});
  norm_case("gated_add_norm_modulate 2x8064x2048", 2, 8064, 2048, Rms{}, Gated{}, Mod{});
  norm_case("gated_add_norm_modulate 2x7392x4096", 2, 7392, 4096, Rms{}, Gated{}, Mod{});
  norm_case("layer_norm_modulate 1x4608x3072", 1, 4608, 3072, Layer{}, NoPre{}, Mod{});  // Flux
  norm_case("gated_add_layer_norm_modulate 1x4608x3072", 1, 4608, 3072, Layer{}, Gated{}, Mod{});  // Flux

  // LTX attention's q/k: [2, 8064, 2048] each; RoPE with cos/sin from the token coordinates, and
  // the fused q/k RMSNorm + RoPE from coordinates and from diffusers' fp32 tables.
  {
    const int64_t batch = 2, seq = 8064, c = 2048, tokens = batch * seq;
    QkRows<bf16> qk{};
    const HeadStrides st{seq * c, c, c};
    qk.q = random_bf16(tokens * c, 17), qk.k = random_bf16(tokens * c, 18);
    qk.q_out = random_bf16(tokens * c, 19), qk.k_out = random_bf16(tokens * c, 20);
    qk.q_strides = qk.k_strides = qk.q_out_strides = qk.k_out_strides = st;
    qk.batch = batch, qk.seq = seq, qk.num_q_heads = qk.num_k_heads = 1;
    qk = lab_divisors(qk);
    LtxCoords coords;
    coords.grid = video_grid(batch, seq, 24, 16);  // 21 frames of 16 x 24 tokens, as LTX's patches
    coords.grid_b = seq * 3, coords.grid_s = 3, coords.grid_c = 1;
    coords.freqs = ramp_float(c / 6, 15708.f);  // up to 10000 * pi / 2, as LTX's
    coords.pad_pairs = static_cast<int>(c % 6 / 2);
    const double qk_bytes = 4.0 * tokens * c * kBf16, table_bytes = 2.0 * tokens * c * sizeof(float);

    RopeParams<bf16, float> rp{};
    rp.qk = qk, rp.coords = coords, rp.head_dim = rp.rotary_dim = static_cast<int>(c);
    rp.copy_pass_through = false;
    add_case(cases, "ltx_rope_from_coords 2x8064x2048", "rope", qk_bytes, kRopeVariants, [rp](auto policy) {
      return [rp] { CHECK((Rope<RopeStyle::kInterleaved, true, CosSinSource::kLtxCoords, policy_of<decltype(policy)>>(rp, 0))); };
    });
    RopeParams<bf16, float> tr = rp;  // diffusers' fp32 tables [B, S, C], read once for q and k
    tr.cos = ramp_float(tokens * c, 1.f), tr.sin = ramp_float(tokens * c, 1.f);
    tr.table_b = seq * c, tr.table_s = c;
    add_case(cases, "ltx_rope tables 2x8064x2048", "rope", qk_bytes + table_bytes, kRopeVariants, [tr](auto policy) {
      return [tr] { CHECK((Rope<RopeStyle::kInterleaved, true, CosSinSource::kTables, policy_of<decltype(policy)>>(tr, 0))); };
    });

    QkNormRopeParams<bf16, bf16, float> np{};
    np.qk = qk, np.q_weight = random_bf16(c, 21), np.k_weight = random_bf16(c, 22);
    np.coords = coords, np.width = static_cast<int>(c), np.eps = 1e-5f;
    add_case(cases, "ltx_qk_norm_rope_from_coords 2x8064x2048", "qk_norm_rope", qk_bytes, kQkVariants, [np](auto policy) {
      return [np] {
        CHECK((QkNormRope<QkNormRopeForm::kDiffusers, CosSinSource::kLtxCoords, policy_of<decltype(policy)>>(np, 0)));
      };
    });
    QkNormRopeParams<bf16, bf16, float> tp = np;
    tp.cos = ramp_float(tokens * c, 1.f), tp.sin = ramp_float(tokens * c, 1.f);
    tp.table_b = seq * c, tp.table_s = c;
    add_case(cases, "ltx_qk_norm_rope tables 2x8064x2048", "qk_norm_rope", qk_bytes + table_bytes, kQkVariants,
             [tp](auto policy) {
               return [tp] {
                 CHECK((QkNormRope<QkNormRopeForm::kDiffusers, CosSinSource::kTables, policy_of<decltype(policy)>>(tp, 0)));
               };
             });
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
    add_case(cases, "hf_rope 4x4096 q32 k8 d128", "rope", bytes, kRopeVariants, [rp](auto policy) {
      return [rp] { CHECK((Rope<RopeStyle::kNeox, false, CosSinSource::kTables, policy_of<decltype(policy)>>(rp, 0))); };
    });
    // Qwen3's per-head q/k RMSNorm + the same RoPE, on the first sample: [1, 4096, 32 + 8, 128].
    QkNormRopeParams<bf16, bf16, bf16> np{};
    np.qk = qk, np.qk.batch = 1;
    np.qk = lab_divisors(np.qk);
    np.q_weight = random_bf16(d, 28), np.k_weight = random_bf16(d, 29);
    np.cos = rp.cos, np.sin = rp.sin, np.table_b = 0, np.table_s = d;
    np.width = static_cast<int>(d), np.eps = 1e-6f;
    add_case(cases, "hf_qk_norm_rope 1x4096 q32 k8 d128", "qk_norm_rope", bytes / batch, kQkVariants, [np](auto policy) {
      return [np] {
        CHECK((QkNormRope<QkNormRopeForm::kTransformers, CosSinSource::kTables, policy_of<decltype(policy)>>(np, 0)));
      };
    });
  }
  // Flux's RoPE and q/k norm + RoPE: q, k [1, 4608, 24, 128] (diffusers' [B, S, H, d] memory),
  // interleaved pairs, fp32 tables [S, d] shared by every head; and the same with heads of 256
  // (the widths between a 4-lane group and a warp).
  for (const int64_t d : {128, 256}) {
    const int64_t seq = 4608, heads = 24;
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
    const std::string shape = "1x4608x24x" + std::to_string(d);
    if (d == 128) {
      add_case(cases, "flux_rope " + shape, "rope", bytes, kRopeVariants, [rp](auto policy) {
        return [rp] { CHECK((Rope<RopeStyle::kInterleaved, true, CosSinSource::kTables, policy_of<decltype(policy)>>(rp, 0))); };
      });
    }
    QkNormRopeParams<bf16, bf16, float> np{};
    np.qk = qk, np.q_weight = random_bf16(d, 32), np.k_weight = random_bf16(d, 33);
    np.cos = rp.cos, np.sin = rp.sin, np.table_b = 0, np.table_s = d;
    np.width = static_cast<int>(d), np.eps = 1e-6f;
    add_case(cases, "qk_norm_rope " + shape, "qk_norm_rope", bytes, kQkVariants, [np](auto policy) {
      return [np] {
        CHECK((QkNormRope<QkNormRopeForm::kDiffusers, CosSinSource::kTables, policy_of<decltype(policy)>>(np, 0)));
      };
    });
  }
  // vLLM's rotary_embedding: 16384 tokens, q [T, 32 x 128], k [T, 8 x 128] in place, NeoX pairs,
  // a bf16 cos_sin_cache [8192, 128] indexed by positions.
  {
    const int64_t tokens = 16384, hq = 32, hk = 8, d = 128, max_pos = 8192;
    QkRows<bf16> qk{};
    qk.q = qk.q_out = random_bf16(tokens * hq * d, 34);
    qk.k = qk.k_out = random_bf16(tokens * hk * d, 35);
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
    rp.qk = qk, rp.cos = random_bf16(max_pos * d, 36), rp.positions = positions, rp.max_position = max_pos;
    rp.table_s = d, rp.head_dim = rp.rotary_dim = static_cast<int>(d);
    rp.copy_pass_through = false;
    const double bytes = 2.0 * tokens * (hq + hk) * d * kBf16 + tokens * (sizeof(int64_t) + d * kBf16);
    add_case(cases, "vllm_rope cache 16384 tokens q32 k8 d128", "rope", bytes, kRopeVariants, [rp](auto policy) {
      return [rp] { CHECK((Rope<RopeStyle::kNeox, false, CosSinSource::kCache, policy_of<decltype(policy)>>(rp, 0))); };
    });
  }
  return cases;
}

// --list: the variants of each family and the cases.
void list(const std::vector<Case>& cases) {
  std::printf("variants (--variants a,b; the release's policy always runs first):\n");
  for_each_family([](const char* family, const auto& variants) {
    std::apply([&](const auto&... v) { ((std::printf("  %-14s %-22s %s\n", family, v.name, v.what)), ...); },
               variants);
  });
  std::printf("cases (any substring selects):\n");
  for (const Case& c : cases) std::printf("  %-14s %s\n", c.family, c.name.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> wanted_cases, wanted_variants;
  bool list_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--list") {
      list_only = true;
    } else if (arg.rfind("--variants=", 0) == 0 || (arg == "--variants" && i + 1 < argc)) {
      std::string names = arg == "--variants" ? argv[++i] : arg.substr(std::strlen("--variants="));
      for (size_t at = 0; at <= names.size();) {
        const size_t comma = std::min(names.find(',', at), names.size());
        if (comma > at) wanted_variants.push_back(names.substr(at, comma - at));
        at = comma + 1;
      }
    } else {
      wanted_cases.push_back(arg);
    }
  }
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::vector<Case> cases = make_cases();
  CHECK(cudaDeviceSynchronize());
  if (list_only) {
    list(cases);
    return 0;
  }

  const size_t copy_bytes = size_t{512} << 20;
  void *src, *dst;
  CHECK(cudaMalloc(&src, copy_bytes));
  CHECK(cudaMalloc(&dst, copy_bytes));
  const double copy_us = time_us([&] { CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice)); });
  const double copy_gbps = 2.0 * copy_bytes / copy_us * 1e-3;
  std::printf("# %s, copy %.0f GB/s, L2 flushed by %s\n", prop.name, copy_gbps, read_flush() ? "reading" : "a memset");
  std::printf("# %-50s %-22s %12s %9s %7s %11s\n", "case", "variant", "time", "GB/s", "% copy", "vs release");
  for (const Case& c : cases) {
    bool wanted = wanted_cases.empty();
    for (const std::string& w : wanted_cases) wanted |= c.name.find(w) != std::string::npos;
    if (!wanted) continue;
    double release_us = 0;
    for (const auto& [variant, launch] : c.runs) {
      const bool is_release = variant == "release";
      bool run = is_release || wanted_variants.empty();
      for (const std::string& w : wanted_variants) run |= variant == w;
      if (!run) continue;
      const double us = time_us(launch);
      if (is_release) release_us = us;
      const double gbps = c.bytes / us * 1e-3;
      std::printf("  %-50s %-22s %9.1f us %9.0f %6.1f %%", c.name.c_str(), variant.c_str(), us, gbps,
                  100.0 * gbps / copy_gbps);
      if (!is_release) std::printf(" %+9.1f %%", 100.0 * (us / release_us - 1.0));
      std::printf("\n");
    }
  }
  return 0;
}
