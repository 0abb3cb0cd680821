#pragma once
// Device helpers shared by the CUDA kernels (internal; include only from .cu files).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ght::kernels::cuda::detail {

using bf16 = __nv_bfloat16;

constexpr int kWarp = 32;

__host__ __device__ constexpr std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
/// `shared` needs 32 floats. The order of additions is fixed, so the result is deterministic.
__device__ __forceinline__ float block_sum(float v, float* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0.0f;
  return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(v);
}

/// Eight bf16 values moved as one 16-byte transaction.
struct alignas(16) Bf16x8 {
  bf16 v[8];
};

__device__ __forceinline__ void load8(const bf16* p, float (&out)[8]) {
  const Bf16x8 pk = *reinterpret_cast<const Bf16x8*>(p);
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = __bfloat162float(pk.v[i]);
}

__device__ __forceinline__ void store8(bf16* p, const float (&in)[8]) {
  Bf16x8 pk;
#pragma unroll
  for (int i = 0; i < 8; ++i) pk.v[i] = __float2bfloat16(in[i]);
  *reinterpret_cast<Bf16x8*>(p) = pk;
}

__device__ __forceinline__ float to_float(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(float v) { return v; }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float v) {
  return __float2bfloat16(v);
}
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}

/// VEC consecutive values as float: VEC == 8 uses one 16-byte load (caller guarantees alignment),
/// VEC == 1 a scalar load.
template <int VEC>
__device__ __forceinline__ void load_vec(const bf16* p, float (&out)[VEC]) {
  if constexpr (VEC == 8) {
    load8(p, out);
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = __bfloat162float(p[i]);
  }
}

template <int VEC>
__device__ __forceinline__ void store_vec(bf16* p, const float (&in)[VEC]) {
  if constexpr (VEC == 8) {
    store8(p, in);
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) p[i] = __float2bfloat16(in[i]);
  }
}

/// dst[0, C) = src[0, C), by one warp: each lane moves VEC-wide chunks, four at a time (four
/// loads in flight before their stores, so a warp keeps 2 KiB moving with VEC = 8).
template <int VEC>
__device__ __forceinline__ void copy_row(bf16* __restrict__ dst, const bf16* __restrict__ src, int C) {
  constexpr int kUnroll = 4;
  const int lane = threadIdx.x % kWarp;
  for (int c0 = lane * VEC; c0 < C; c0 += kWarp * VEC * kUnroll) {
    float v[kUnroll][VEC];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (c0 + u * kWarp * VEC < C) load_vec<VEC>(src + c0 + u * kWarp * VEC, v[u]);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (c0 + u * kWarp * VEC < C) store_vec<VEC>(dst + c0 + u * kWarp * VEC, v[u]);
  }
}

__device__ __forceinline__ float round_bf16(float v) {
  return __bfloat162float(__float2bfloat16(v));
}

/// dst[c] += sum over b < rows of partial[b·cols + c], added in b order (deterministic).
/// Second stage of the column reductions (weight gradients) of several kernels.
template <typename T>
__global__ void column_reduce_add_kernel(T* __restrict__ dst, const float* __restrict__ partial,
                                         int rows, int cols) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0.0f;
  for (int b = 0; b < rows; ++b) s += partial[static_cast<std::int64_t>(b) * cols + c];
  dst[c] = from_float<T>(to_float(dst[c]) + s);
}

/// True when every pointer is 16-byte aligned (vectorised paths need it).
template <typename... P>
inline bool aligned16(const P*... p) {
  return ((reinterpret_cast<std::uintptr_t>(p) % 16 == 0) && ...);
}

/// Grid size for a grid-stride loop over `n` items with `threads` per block.
inline unsigned grid_for(std::int64_t n, int threads, std::int64_t cap = 65535) {
  std::int64_t g = ceil_div(n, threads);
  if (g < 1) g = 1;
  if (g > cap) g = cap;
  return static_cast<unsigned>(g);
}

}  // namespace ght::kernels::cuda::detail
