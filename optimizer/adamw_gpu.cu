// AdamW on the GPU (gpu_link and device paths) and the deterministic device sum of squares.
//
// One kernel serves both paths: master, m and v are read and written in place wherever they live
// (HBM, mapped pinned host memory over PCIe, system memory over C2C), the gradient is read from
// HBM or host memory, and the bf16 weight is written to HBM. Per parameter it moves
// 12 B read + 12 B written of state (8 + 8 with bf16 m and v, 6.03 + 6.03 with q8), 2 or 4 B of gradient and 2 B of
// weight: memory-bound.
// Each thread handles 8 consecutive parameters per iteration with 16-byte accesses (two float4
// per fp32 array, one uint4 per bf16 array), which keeps many long-latency link
// reads in flight; state uses streaming (evict-first) cache hints because it is touched once.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>

#include "optimizer/adamw_kernels.hpp"
#include "tier/cuda_check.hpp"

namespace ght::optimizer {

namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ void load8(const float* p, float (&o)[8]) {
  const float4 a = __ldcs(reinterpret_cast<const float4*>(p));
  const float4 b = __ldcs(reinterpret_cast<const float4*>(p) + 1);
  o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w;
  o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
}

__device__ __forceinline__ void store8(float* p, const float (&o)[8]) {
  __stcs(reinterpret_cast<float4*>(p), make_float4(o[0], o[1], o[2], o[3]));
  __stcs(reinterpret_cast<float4*>(p) + 1, make_float4(o[4], o[5], o[6], o[7]));
}

__device__ __forceinline__ void load8_grad(const float* g, float (&o)[8]) { load8(g, o); }

__device__ __forceinline__ void load8_grad(const std::uint16_t* g, float (&o)[8]) {
  const uint4 u = __ldcs(reinterpret_cast<const uint4*>(g));
  const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    o[2 * j] = __uint_as_float(w[j] << 16);
    o[2 * j + 1] = __uint_as_float(w[j] & 0xFFFF0000u);
  }
}

__device__ __forceinline__ float load1_grad(const float* g, std::size_t i) { return g[i]; }
__device__ __forceinline__ float load1_grad(const std::uint16_t* g, std::size_t i) {
  return __uint_as_float(static_cast<unsigned>(g[i]) << 16);
}

__device__ __forceinline__ unsigned bf16_bits(float x) {
  return static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(x)));
}

// m and v as stored: fp32, or bf16 bits (8 per 16-byte vector).
__device__ __forceinline__ void load8_state(const float* s, float (&o)[8]) { load8(s, o); }
__device__ __forceinline__ void load8_state(const std::uint16_t* s, float (&o)[8]) { load8_grad(s, o); }
__device__ __forceinline__ float load1_state(const float* s, std::size_t i) { return s[i]; }
__device__ __forceinline__ float load1_state(const std::uint16_t* s, std::size_t i) {
  return bf16_bits_to_float(s[i]);
}

// Stores m and v of 8 (or 1) parameters; index: the first one's index within its region.
// bf16: m rounded to nearest even, v stochastically with its element's bits of the stream,
// with the same integer code adamw_cpu runs (bf16.hpp, adamw_kernels.hpp).
__device__ __forceinline__ void store8_moments(float* m, float* v, const float (&mm)[8],
                                               const float (&vv)[8], std::uint64_t, std::uint64_t) {
  store8(m, mm);
  store8(v, vv);
}
__device__ __forceinline__ void store8_moments(std::uint16_t* m, std::uint16_t* v, const float (&mm)[8],
                                               const float (&vv)[8], std::uint64_t stream,
                                               std::uint64_t index) {
  unsigned om[4], ov[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    om[j] = float_to_bf16_bits(mm[2 * j]) | (static_cast<unsigned>(float_to_bf16_bits(mm[2 * j + 1])) << 16);
    ov[j] = float_to_bf16_bits_sr(vv[2 * j], round_bits(stream, index + 2 * j)) |
            (static_cast<unsigned>(float_to_bf16_bits_sr(vv[2 * j + 1], round_bits(stream, index + 2 * j + 1))) << 16);
  }
  __stcs(reinterpret_cast<uint4*>(m), make_uint4(om[0], om[1], om[2], om[3]));
  __stcs(reinterpret_cast<uint4*>(v), make_uint4(ov[0], ov[1], ov[2], ov[3]));
}
__device__ __forceinline__ void store1_moments(float* m, float* v, std::size_t i, float mi, float vi,
                                               std::uint64_t, std::uint64_t) {
  m[i] = mi;
  v[i] = vi;
}
__device__ __forceinline__ void store1_moments(std::uint16_t* m, std::uint16_t* v, std::size_t i, float mi,
                                               float vi, std::uint64_t stream, std::uint64_t index) {
  m[i] = float_to_bf16_bits(mi);
  v[i] = float_to_bf16_bits_sr(vi, round_bits(stream, index));
}

// The update of one parameter; same operation order as adamw_cpu (see adamw_kernels.hpp).
// fp32 state lets the compiler contract to FMA (within an fp32 ulp of adamw_cpu per operation);
// bf16 and q8 state round every operation on its own, as adamw_cpu (-ffp-contract=off) does, so the
// fp32 values that get rounded to bf16 are the host's bit for bit.
template <typename S>
__device__ __forceinline__ void adam_elem(float& p, float& m, float& v, float g,
                                          const StepScalars& k) {
  if constexpr (std::is_same_v<S, float>) {
    g *= k.grad_scale;
    m = k.beta1 * m + k.one_minus_beta1 * g;
    v = k.beta2 * v + k.one_minus_beta2 * (g * g);
    const float denom = sqrtf(v) * k.inv_sqrt_bc2 + k.eps;
    p = p * k.decay - k.step_size * (m / denom);
  } else {
    g = __fmul_rn(g, k.grad_scale);
    m = __fadd_rn(__fmul_rn(k.beta1, m), __fmul_rn(k.one_minus_beta1, g));
    v = __fadd_rn(__fmul_rn(k.beta2, v), __fmul_rn(k.one_minus_beta2, __fmul_rn(g, g)));
    const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), k.inv_sqrt_bc2), k.eps);
    p = __fsub_rn(__fmul_rn(p, k.decay), __fmul_rn(k.step_size, __fdiv_rn(m, denom)));
  }
}

// The compute weight: bf16 of p, or with k.extrapolate ≠ 0 of p + x·(p − before), each
// operation rounded on its own as in adamw_cpu (-ffp-contract=off). A uniform branch.
__device__ __forceinline__ unsigned weight_bits(float p, float before, const StepScalars& k) {
  if (k.extrapolate != 0.0f) p = __fadd_rn(p, __fmul_rn(k.extrapolate, __fsub_rn(p, before)));
  return bf16_bits(p);
}

// The vector part of up to kAdamWBatchSpans spans, one launch (AdamWBatch). Vector i of the
// batch belongs to the span s with end8[s-1] <= i < end8[s]; each thread walks its grid-stride
// indices upward, so it only ever moves forward through the spans. The batch travels as a
// __grid_constant__ kernel argument (no copy to device memory, nothing to keep alive).
struct VecSpan {
  float* master;
  void* m;
  void* v;
  const void* grad;
  std::uint16_t* weight;
  std::uint64_t stream;  // round_stream(key, step)
  std::uint64_t first;   // index of the span's element 0 within its region
  std::size_t begin8;    // the span's first vector within the batch
  int k;                 // which of the batch's StepScalars
};
struct VecBatch {
  VecSpan span[kAdamWBatchSpans];
  std::size_t end8[kAdamWBatchSpans];  // cumulative vector counts
  StepScalars k[2];
};

template <typename G, typename S, bool kWeight>
__global__ void __launch_bounds__(kThreads)
    adamw_vec8_kernel(const __grid_constant__ VecBatch b, std::size_t total8) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  int si = 0;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total8;
       i += stride) {
    while (i >= b.end8[si]) ++si;
    const VecSpan& a = b.span[si];
    const StepScalars& k = b.k[a.k];
    const std::size_t e = (i - a.begin8) * 8;
    float* master = a.master + e;
    S* m = static_cast<S*>(a.m) + e;
    S* v = static_cast<S*>(a.v) + e;
    float p[8], mm[8], vv[8], g[8];
    // All loads first, so each thread has 6-8 independent 16-byte link reads outstanding.
    load8(master, p);
    load8_state(m, mm);
    load8_state(v, vv);
    load8_grad(static_cast<const G*>(a.grad) + e, g);
    float before[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      before[j] = p[j];
      adam_elem<S>(p[j], mm[j], vv[j], g[j], k);
    }
    store8(master, p);
    store8_moments(m, v, mm, vv, a.stream, a.first + e);
    if constexpr (kWeight) {
      unsigned o[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        o[j] = weight_bits(p[2 * j], before[2 * j], k) | (weight_bits(p[2 * j + 1], before[2 * j + 1], k) << 16);
      }
      *reinterpret_cast<uint4*>(a.weight + e) = make_uint4(o[0], o[1], o[2], o[3]);
    }
  }
}

// Unaligned buffers and the last n % 8 parameters.
template <typename G, typename S, bool kWeight>
__global__ void __launch_bounds__(kThreads)
    adamw_scalar_kernel(float* __restrict__ master, S* __restrict__ m, S* __restrict__ v,
                        const G* __restrict__ grad, std::uint16_t* __restrict__ weight,
                        std::size_t n, StepScalars k, std::uint64_t stream, std::uint64_t first) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float p = master[i], mi = load1_state(m, i), vi = load1_state(v, i);
    const float before = p;
    adam_elem<S>(p, mi, vi, load1_grad(grad, i), k);
    master[i] = p;
    store1_moments(m, v, i, mi, vi, stream, first + i);
    if constexpr (kWeight) weight[i] = static_cast<std::uint16_t>(weight_bits(p, before, k));
  }
}

// ---- q8 state ------------------------------------------------------------------------------
// One warp per quantization block of kQ8Block = 256 elements: lane l holds elements 4l..4l+3
// and 128+4l..128+4l+3 (16-byte master and gradient vectors, one 4-byte word of codes each),
// the new m and v stay in registers while the warp reduces their absmax by shuffles, then every
// lane writes its 8 codes and lane 0 the two scales. The same fp32 operations as adamw_cpu, each
// rounded on its own; the maps come in as a kernel argument (the host's q8_tables() bytes) and
// are read from shared memory (the binary search indexes them per thread).
constexpr int kQ8Warps = kThreads / 32;
static_assert(kQ8Block == 256, "the q8 kernel gives each of 32 lanes 8 elements");

__device__ __forceinline__ int q8_elem(int lane, int j) { return (j < 4 ? 0 : 128) + 4 * lane + (j & 3); }

__device__ __forceinline__ void load4(const float* p, float* o) {
  const float4 a = __ldcs(reinterpret_cast<const float4*>(p));
  o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w;
}
__device__ __forceinline__ void load4_grad(const float* g, float* o) { load4(g, o); }
__device__ __forceinline__ void load4_grad(const std::uint16_t* g, float* o) {
  const uint2 u = __ldcs(reinterpret_cast<const uint2*>(g));
  o[0] = __uint_as_float(u.x << 16);
  o[1] = __uint_as_float(u.x & 0xFFFF0000u);
  o[2] = __uint_as_float(u.y << 16);
  o[3] = __uint_as_float(u.y & 0xFFFF0000u);
}

__device__ __forceinline__ float warp_absmax(const float (&x)[8]) {
  float s = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const float a = x[j] < 0 ? -x[j] : x[j];
    s = a > s ? a : s;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xFFFFFFFFu, s, o);
    s = other > s ? other : s;
  }
  return s;
}

template <typename G, bool kWeight>
__global__ void __launch_bounds__(kThreads)
    adamw_q8_kernel(float* __restrict__ master, std::uint8_t* __restrict__ m, std::uint8_t* __restrict__ v,
                    const G* __restrict__ grad, std::uint16_t* __restrict__ weight, std::size_t n, bool vec,
                    StepScalars k, Q8Tables tables) {
  __shared__ Q8Tables t;
  {
    const float* src = reinterpret_cast<const float*>(&tables);
    float* dst = reinterpret_cast<float*>(&t);
    for (int i = threadIdx.x; i < static_cast<int>(sizeof(Q8Tables) / sizeof(float)); i += blockDim.x) dst[i] = src[i];
  }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const std::size_t blocks = (n + kQ8Block - 1) / kQ8Block;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * kQ8Warps;
  for (std::size_t b = static_cast<std::size_t>(blockIdx.x) * kQ8Warps + (threadIdx.x >> 5); b < blocks; b += stride) {
    const std::size_t e0 = b * kQ8Block;
    const int len = static_cast<int>(n - e0 < kQ8Block ? n - e0 : kQ8Block);
    std::uint8_t* mrec = m + b * kQ8Record;
    std::uint8_t* vrec = v + b * kQ8Record;
    const float sm = *reinterpret_cast<const float*>(mrec + kQ8Block);
    const float sv = *reinterpret_cast<const float*>(vrec + kQ8Block);
    float p[8], mm[8], vv[8], g[8];
    unsigned cm[2], cv[2];
    const bool full = vec && len == static_cast<int>(kQ8Block);  // warp-uniform
    if (full) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int e = q8_elem(lane, 4 * h);
        load4(master + e0 + e, p + 4 * h);
        load4_grad(grad + e0 + e, g + 4 * h);
        cm[h] = __ldcs(reinterpret_cast<const unsigned*>(mrec + e));
        cv[h] = __ldcs(reinterpret_cast<const unsigned*>(vrec + e));
      }
    } else {
      cm[0] = cm[1] = cv[0] = cv[1] = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int e = q8_elem(lane, j);
        const bool in = e < len;
        p[j] = in ? master[e0 + e] : 0.0f;
        g[j] = in ? load1_grad(grad, e0 + e) : 0.0f;
        cm[j >> 2] |= static_cast<unsigned>(in ? mrec[e] : 0) << (8 * (j & 3));
        cv[j >> 2] |= static_cast<unsigned>(in ? vrec[e] : 0) << (8 * (j & 3));
      }
    }
    float before[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      // Elements past len hold zeros: their new m and v are 0 and do not move the absmax.
      mm[j] = __fmul_rn(t.m[(cm[j >> 2] >> (8 * (j & 3))) & 0xFFu], sm);
      vv[j] = __fmul_rn(t.v[(cv[j >> 2] >> (8 * (j & 3))) & 0xFFu], sv);
      if (q8_elem(lane, j) >= len) mm[j] = vv[j] = 0.0f;
      before[j] = p[j];
      adam_elem<std::uint8_t>(p[j], mm[j], vv[j], g[j], k);
    }
    const float am = warp_absmax(mm), av = warp_absmax(vv);
    const float rm = am > 0 ? __frcp_rn(am) : 0.0f, rv = av > 0 ? __frcp_rn(av) : 0.0f;
    unsigned om[2] = {0, 0}, ov[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      if (q8_elem(lane, j) >= len) continue;  // codes past len stay 0
      om[j >> 2] |= static_cast<unsigned>(q8_code_m(t, __fmul_rn(mm[j], rm))) << (8 * (j & 3));
      ov[j >> 2] |= static_cast<unsigned>(q8_code_v(t, __fmul_rn(vv[j], rv))) << (8 * (j & 3));
    }
    if (full) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int e = q8_elem(lane, 4 * h);
        __stcs(reinterpret_cast<float4*>(master + e0 + e), make_float4(p[4 * h], p[4 * h + 1], p[4 * h + 2], p[4 * h + 3]));
        __stcs(reinterpret_cast<unsigned*>(mrec + e), om[h]);
        __stcs(reinterpret_cast<unsigned*>(vrec + e), ov[h]);
        if constexpr (kWeight) {
          const unsigned w0 = weight_bits(p[4 * h], before[4 * h], k) | (weight_bits(p[4 * h + 1], before[4 * h + 1], k) << 16);
          const unsigned w1 = weight_bits(p[4 * h + 2], before[4 * h + 2], k) | (weight_bits(p[4 * h + 3], before[4 * h + 3], k) << 16);
          *reinterpret_cast<uint2*>(weight + e0 + e) = make_uint2(w0, w1);
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int e = q8_elem(lane, j);
        if (e < len) {
          master[e0 + e] = p[j];
          if constexpr (kWeight) weight[e0 + e] = static_cast<std::uint16_t>(weight_bits(p[j], before[j], k));
        }
        mrec[e] = static_cast<std::uint8_t>(om[j >> 2] >> (8 * (j & 3)));  // 0 past len
        vrec[e] = static_cast<std::uint8_t>(ov[j >> 2] >> (8 * (j & 3)));
      }
    }
    if (lane == 0) {
      *reinterpret_cast<float*>(mrec + kQ8Block) = am;
      *reinterpret_cast<float*>(vrec + kQ8Block) = av;
    }
  }
}

int sm_count() {
  static const int n = [] {
    int dev = 0, sms = 0;
    GHT_CUDA_TRY(cudaGetDevice(&dev));
    GHT_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return sms;
  }();
  return n;
}

// Enough resident blocks to fill every SM (or max_sms of them), never more than the work needs.
// Keyed by the kernel itself: instantiations differing only in a bool share a function type.
template <auto Kernel>
unsigned grid_for(std::size_t items, int max_sms) {
  static const int per_sm = [] {
    int b = 0;
    GHT_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, Kernel, kThreads, 0));
    return std::max(1, b);
  }();
  const int sms = max_sms > 0 ? std::min(max_sms, sm_count()) : sm_count();
  const std::size_t needed = (items + kThreads - 1) / kThreads;
  const std::size_t full = static_cast<std::size_t>(per_sm) * static_cast<std::size_t>(sms);
  return static_cast<unsigned>(std::max<std::size_t>(1, std::min(needed, full)));
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// Calls f.template operator()<G, S, kWeight>() for the element types of a span: gradient G
// (uint16_t bf16 bits or float), moments S (float, uint16_t bf16 bits or uint8_t q8 records),
// and whether a weight is written.
template <typename F>
void with_types(GradType gt, StateType st, bool weight, F&& f) {
  auto w = [&]<typename G, typename S>() {
    if (weight) f.template operator()<G, S, true>();
    else f.template operator()<G, S, false>();
  };
  auto s = [&]<typename G>() {
    if (st == StateType::q8) w.template operator()<G, std::uint8_t>();
    else if (st == StateType::bf16) w.template operator()<G, std::uint16_t>();
    else w.template operator()<G, float>();
  };
  if (gt == GradType::bf16) s.template operator()<std::uint16_t>();
  else s.template operator()<float>();
}

// Elements [done, n) of s with the scalar kernel (unaligned buffers, the last n % 8).
void launch_scalar(const AdamWSpan& s, std::size_t done, const StepScalars& k, cudaStream_t stream, int max_sms) {
  const std::size_t rest = s.n - done;
  with_types(s.grad_type, s.state, s.weight != nullptr, [&]<typename G, typename S, bool kWeight>() {
    if constexpr (!std::is_same_v<S, std::uint8_t>) {
      constexpr auto kern = adamw_scalar_kernel<G, S, kWeight>;
      kern<<<grid_for<kern>(rest, max_sms), kThreads, 0, stream>>>(
          s.master + done, static_cast<S*>(s.m) + done, static_cast<S*>(s.v) + done, static_cast<const G*>(s.grad) + done,
          kWeight ? reinterpret_cast<std::uint16_t*>(s.weight) + done : nullptr, rest, k,
          round_stream(s.key, k.step), s.first + done);
      GHT_CUDA_CHECK_LAUNCH();
    }
  });
}

bool aligned4(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 3u) == 0; }

void launch_q8(const AdamWSpan& s, const StepScalars& k, cudaStream_t stream, int max_sms) {
  GHT_EXPECTS(aligned4(s.m) && aligned4(s.v), "adamw_gpu: q8 moments must be 4-byte aligned (block records)");
  const bool vec = aligned16(s.master) && aligned16(s.grad) && (s.weight == nullptr || aligned16(s.weight));
  const std::size_t blocks = (s.n + kQ8Block - 1) / kQ8Block;
  with_types(s.grad_type, s.state, s.weight != nullptr, [&]<typename G, typename S, bool kWeight>() {
    if constexpr (std::is_same_v<S, std::uint8_t>) {
      constexpr auto kern = adamw_q8_kernel<G, kWeight>;
      kern<<<grid_for<kern>(blocks * 32, max_sms), kThreads, 0, stream>>>(
          s.master, static_cast<std::uint8_t*>(s.m), static_cast<std::uint8_t*>(s.v), static_cast<const G*>(s.grad),
          reinterpret_cast<std::uint16_t*>(s.weight), s.n, vec, k, q8_tables());
      GHT_CUDA_CHECK_LAUNCH();
    }
  });
}

// Whether the vector kernel can take s (the rest of the span then goes to launch_scalar).
bool vectorizable(const AdamWSpan& s) {
  return s.state != StateType::q8 && s.n >= 8 && aligned16(s.master) && aligned16(s.m) && aligned16(s.v) &&
         aligned16(s.grad) && (s.weight == nullptr || aligned16(s.weight));
}

bool same_scalars(const StepScalars& a, const StepScalars& b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// ---- sum of squares ------------------------------------------------------------------------

constexpr int kSumsqBlocksPerSm = 4;

__device__ __forceinline__ double block_sum(double x) {
  __shared__ double warp_sums[kThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_down_sync(0xFFFFFFFFu, x, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) warp_sums[warp] = x;
  __syncthreads();
  double total = 0;
  if (threadIdx.x == 0) {
    for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
  }
  return total;
}

// Σ g² of up to kAdamWBatchSpans buffers of one type in one launch. Fixed grid: the elements
// each thread sees of a buffer, and the order they are added in, depend only on that buffer's n,
// and each block adds the buffers' block sums into its slot in queue order, so the slot holds
// the same double, bit for bit, as one launch per buffer would leave there.
struct SumsqBatch {
  const void* g[kAdamWBatchSpans];
  std::size_t n[kAdamWBatchSpans];
  bool vec[kAdamWBatchSpans];
  int count;
};

template <typename G>
__global__ void __launch_bounds__(kThreads)
    sumsq_kernel(const __grid_constant__ SumsqBatch b, double* __restrict__ partials) {
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  double slot = threadIdx.x == 0 ? partials[blockIdx.x] : 0.0;
  for (int s = 0; s < b.count; ++s) {
    const G* g = static_cast<const G*>(b.g[s]);
    const std::size_t n = b.n[s];
    double acc = 0;
    std::size_t start = 0;
    if (b.vec[s]) {
      const std::size_t n8 = n / 8;
      for (std::size_t i = tid; i < n8; i += stride) {
        float x[8];
        load8_grad(g + i * 8, x);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc += static_cast<double>(x[j]) * static_cast<double>(x[j]);
      }
      start = n8 * 8;
    }
    for (std::size_t i = start + tid; i < n; i += stride) {
      const double x = load1_grad(g, i);
      acc += x * x;
    }
    const double total = block_sum(acc);
    if (threadIdx.x == 0) slot += total;
    __syncthreads();  // block_sum's shared slots are reused by the next buffer
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = slot;
}

__global__ void sum_partials_kernel(double* partials, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += partials[i];
  partials[n] = s;
}

}  // namespace

struct AdamWBatch::Queue {
  VecBatch b;
  cudaStream_t stream = nullptr;
  int max_spans = kAdamWBatchSpans;
  int count = 0;
  int scalars = 0;  // distinct StepScalars in b.k
  std::size_t total8 = 0;
  GradType grad_type = GradType::bf16;
  StateType state = StateType::fp32;
  bool weight = false;
  int max_sms = 0;
  std::size_t launches = 0;
};

AdamWBatch::AdamWBatch(cudaStream_t stream, int max_spans) : q_(std::make_unique<Queue>()) {
  GHT_EXPECTS(max_spans >= 1 && max_spans <= kAdamWBatchSpans,
              "AdamWBatch: spans per launch must be in [1, " + std::to_string(kAdamWBatchSpans) + "], got " +
                  std::to_string(max_spans));
  q_->stream = stream;
  q_->max_spans = max_spans;
}

AdamWBatch::~AdamWBatch() = default;

bool AdamWBatch::fits(const AdamWSpan& s, const StepScalars& k, int max_sms) const {
  const Queue& q = *q_;
  if (q.count == 0 || !vectorizable(s)) return true;
  if (q.count == q.max_spans || s.grad_type != q.grad_type || s.state != q.state ||
      (s.weight != nullptr) != q.weight || max_sms != q.max_sms) {
    return false;
  }
  for (int i = 0; i < q.scalars; ++i) {
    if (same_scalars(q.b.k[i], k)) return true;
  }
  return q.scalars < 2;
}

void AdamWBatch::add(const AdamWSpan& s, const StepScalars& k, int max_sms) {
  if (s.n == 0) return;
  GHT_EXPECTS(s.master && s.m && s.v && s.grad, "adamw_gpu: null master/m/v/grad pointer");
  Queue& q = *q_;
  if (s.state == StateType::q8) {
    launch_q8(s, k, q.stream, max_sms);
    ++q.launches;
    return;
  }
  if (!vectorizable(s)) {
    launch_scalar(s, 0, k, q.stream, max_sms);
    ++q.launches;
    return;
  }
  if (!fits(s, k, max_sms)) flush();
  if (q.count == 0) {
    q.grad_type = s.grad_type;
    q.state = s.state;
    q.weight = s.weight != nullptr;
    q.max_sms = max_sms;
  }
  int ki = 0;
  while (ki < q.scalars && !same_scalars(q.b.k[ki], k)) ++ki;
  if (ki == q.scalars) q.b.k[q.scalars++] = k;
  const std::size_t n8 = s.n / 8;
  VecSpan& v = q.b.span[q.count];
  v.master = s.master;
  v.m = s.m;
  v.v = s.v;
  v.grad = s.grad;
  v.weight = reinterpret_cast<std::uint16_t*>(s.weight);
  v.stream = round_stream(s.key, k.step);
  v.first = s.first;
  v.begin8 = q.total8;
  v.k = ki;
  q.total8 += n8;
  q.b.end8[q.count++] = q.total8;
  if (n8 * 8 < s.n) {
    launch_scalar(s, n8 * 8, k, q.stream, max_sms);  // the last n % 8: other elements, same stream
    ++q.launches;
  }
}

void AdamWBatch::flush() {
  Queue& q = *q_;
  if (q.count == 0) return;
  with_types(q.grad_type, q.state, q.weight, [&]<typename G, typename S, bool kWeight>() {
    if constexpr (!std::is_same_v<S, std::uint8_t>) {
      constexpr auto kern = adamw_vec8_kernel<G, S, kWeight>;
      kern<<<grid_for<kern>(q.total8, q.max_sms), kThreads, 0, q.stream>>>(q.b, q.total8);
      GHT_CUDA_CHECK_LAUNCH();
    }
  });
  ++q.launches;
  q.count = 0;
  q.total8 = 0;
  q.scalars = 0;
}

std::size_t AdamWBatch::launches() const { return q_->launches; }

void adamw_gpu(const AdamWSpan& s, const StepScalars& k, cudaStream_t stream, int max_sms) {
  AdamWBatch b(stream, 1);
  b.add(s, k, max_sms);
  b.flush();
}

struct DeviceSumsq::Queue {
  SumsqBatch b{};
  GradType type = GradType::bf16;
  cudaStream_t stream = nullptr;
};

DeviceSumsq::DeviceSumsq(alloc::tiered_allocator& a, cudaStream_t stream) : q_(std::make_unique<Queue>()) {
  blocks_ = sm_count() * kSumsqBlocksPerSm;
  partials_ = alloc::unique_block(a, sizeof(double) * static_cast<std::size_t>(blocks_ + 1),
                                  {TensorClass::other, "optimizer.norm_partials", TierKind::hbm, false}, stream);
  result_ = alloc::unique_block(a, sizeof(double), {TensorClass::other, "optimizer.norm_result", TierKind::host, false});
}

DeviceSumsq::~DeviceSumsq() = default;

void DeviceSumsq::reset(cudaStream_t stream) {
  q_->b.count = 0;  // what was queued for the last sum is dropped with it
  GHT_CUDA_TRY(cudaMemsetAsync(partials_.get(), 0, sizeof(double) * static_cast<std::size_t>(blocks_ + 1),
                               stream));
}

void DeviceSumsq::add(const void* grad, GradType t, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  GHT_EXPECTS(grad != nullptr, "DeviceSumsq::add: null gradient pointer");
  Queue& q = *q_;
  if (q.b.count > 0 && (q.b.count == kAdamWBatchSpans || t != q.type || stream != q.stream)) flush();
  q.type = t;
  q.stream = stream;
  q.b.g[q.b.count] = grad;
  q.b.n[q.b.count] = n;
  q.b.vec[q.b.count] = aligned16(grad);
  ++q.b.count;
}

void DeviceSumsq::flush() {
  Queue& q = *q_;
  if (q.b.count == 0) return;
  if (q.type == GradType::bf16) {
    sumsq_kernel<std::uint16_t><<<blocks_, kThreads, 0, q.stream>>>(q.b, partials_.as<double>());
  } else {
    sumsq_kernel<float><<<blocks_, kThreads, 0, q.stream>>>(q.b, partials_.as<double>());
  }
  GHT_CUDA_CHECK_LAUNCH();
  q.b.count = 0;
}

double DeviceSumsq::finish(cudaStream_t stream) {
  flush();
  sum_partials_kernel<<<1, 1, 0, stream>>>(partials_.as<double>(), blocks_);
  GHT_CUDA_CHECK_LAUNCH();
  GHT_CUDA_TRY(cudaMemcpyAsync(result_.get(), partials_.as<double>() + blocks_, sizeof(double),
                               cudaMemcpyDeviceToHost, stream));
  GHT_CUDA_TRY(cudaStreamSynchronize(stream));
  return *result_.as<double>();
}

}  // namespace ght::optimizer
