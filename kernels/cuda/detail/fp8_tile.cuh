#pragma once
// The arithmetic of one 1 x 128 e4m3 tile (internal; include only from .cu files): shared by
// quantize_fp8_rows and its fused forms (fp8_quant.cu, swiglu.cu), so that every kernel that
// writes activation codes writes the same bits as kernels/cpu/fp8.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/fp8_quant.hpp"

namespace ght::kernels::cuda::detail {

constexpr float kE4m3Max = 448.0f;
constexpr int kChunk = 8;                          // elements per thread and load
constexpr int kLanesPerTile = kFp8TileK / kChunk;  // 16: half a warp covers one tile row

// max that keeps a NaN (fmaxf drops it), so a NaN anywhere in a tile reaches its scale.
__device__ __forceinline__ float nan_max(float a, float b) { return (a > b || a != a) ? a : b; }

// Max over the 16 lanes of a half warp; every lane of the warp must call it.
__device__ __forceinline__ float half_warp_max(float v) {
#pragma unroll
  for (int o = kLanesPerTile / 2; o > 0; o /= 2) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The CPU reference's arithmetic (kernels/cpu/fp8.cpp), with explicit round-to-nearest
// intrinsics so that no compiler flag can turn the divisions into reciprocals or fuse the product.
__device__ __forceinline__ float inverse_scale(float amax) { return amax > 0.0f ? __fdiv_rn(kE4m3Max, amax) : 0.0f; }
__device__ __forceinline__ float scale_of(float amax) { return __fdiv_rn(amax, kE4m3Max); }
__device__ __forceinline__ std::uint8_t encode(float x, float inv) {
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(__fmul_rn(x, inv), __NV_SATFINITE, __NV_E4M3));
}

// Up to 8 consecutive values from p (n of them valid; the rest read as 0), one 16-byte load when
// VEC (n == 8 and p 16-byte aligned, which the launchers guarantee).
template <bool VEC>
__device__ __forceinline__ void load_chunk(const bf16* p, int n, float (&v)[kChunk]) {
  if constexpr (VEC) {
    load8(p, v);
  } else {
#pragma unroll
    for (int i = 0; i < kChunk; ++i) v[i] = i < n ? __bfloat162float(p[i]) : 0.0f;
  }
}

template <bool VEC>
__device__ __forceinline__ void store_chunk(std::uint8_t* p, int n, const std::uint8_t (&c)[kChunk]) {
  if constexpr (VEC) {
    uint2 pk;
    pk.x = c[0] | (c[1] << 8) | (c[2] << 16) | (static_cast<std::uint32_t>(c[3]) << 24);
    pk.y = c[4] | (c[5] << 8) | (c[6] << 16) | (static_cast<std::uint32_t>(c[7]) << 24);
    *reinterpret_cast<uint2*>(p) = pk;
  } else {
#pragma unroll
    for (int i = 0; i < kChunk; ++i)
      if (i < n) p[i] = c[i];
  }
}

// One lane's share of a 1 x 128 tile whose 16 lanes are one half of a warp: v holds the lane's
// values (0 past the row's end, n of them in the row). The tile's amax comes from the half warp;
// then its first lane writes *scale and every lane its n codes at `codes`. Every lane of the warp
// must call it (shuffles); a half warp without a tile passes valid = false and writes nothing.
template <bool VEC>
__device__ __forceinline__ void quantize_tile_chunk(const float (&v)[kChunk], int n, bool valid,
                                                    std::uint8_t* codes, float* scale) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kChunk; ++i) amax = nan_max(amax, fabsf(v[i]));
  amax = half_warp_max(amax);
  if (!valid) return;
  const float inv = inverse_scale(amax);
  if (threadIdx.x % kLanesPerTile == 0) *scale = scale_of(amax);
  if (n > 0) {
    std::uint8_t q[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) q[i] = encode(v[i], inv);
    store_chunk<VEC>(codes, n, q);
  }
}

// The row-tile walk of the 1 x 128 kernels: each warp takes two tiles at a time (one per half
// warp), warps striding over the grid. For warp step w, TileSlot is this lane's share: the tile's
// row and column in a matrix of `cols` columns, `across` tiles a row, the lane's first column, and
// how many of its kChunk values lie in the row (0 past the end, or where the tile is not valid).
struct TileSlot {
  bool valid;
  std::int64_t row, tile_col, col;
  int n;
};
__device__ __forceinline__ std::int64_t first_tile_warp() {
  return blockIdx.x * static_cast<std::int64_t>(blockDim.x / kWarp) + threadIdx.x / kWarp;
}
__device__ __forceinline__ std::int64_t tile_warp_stride() {
  return static_cast<std::int64_t>(gridDim.x) * (blockDim.x / kWarp);
}
__device__ __forceinline__ TileSlot tile_slot(std::int64_t w, std::int64_t tiles, std::int64_t across,
                                              std::int64_t cols) {
  const int half = (threadIdx.x % kWarp) / kLanesPerTile, lane = threadIdx.x % kLanesPerTile;
  const std::int64_t t = 2 * w + half;
  TileSlot s;
  s.valid = t < tiles;
  s.row = s.valid ? t / across : 0;
  s.tile_col = s.valid ? t % across : 0;
  s.col = s.tile_col * kFp8TileK + lane * kChunk;
  s.n = s.valid ? static_cast<int>(std::max<std::int64_t>(0, std::min<std::int64_t>(kChunk, cols - s.col))) : 0;
  return s;
}

/// True when p is a multiple of `bytes` (the 8- and 16-byte paths need it).
inline bool aligned(const void* p, std::size_t bytes) {
  return reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

}  // namespace ght::kernels::cuda::detail
