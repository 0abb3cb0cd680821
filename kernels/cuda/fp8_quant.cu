// Block-scaled e4m3 quantisation and dequantisation (see fp8_quant.hpp).
#include "kernels/cuda/fp8_quant.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/detail/common.cuh"
#include "tier/cuda_check.hpp"
#include "tier/error.hpp"

namespace ght::kernels::cuda {
namespace {

using detail::bf16;

constexpr float kE4m3Max = 448.0f;
constexpr int kChunk = 8;                       // elements per thread and load
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
// VEC (n == 8 and p 16-byte aligned, which the launcher guarantees).
template <bool VEC>
__device__ __forceinline__ void load_chunk(const bf16* p, int n, float (&v)[kChunk]) {
  if constexpr (VEC) {
    detail::load8(p, v);
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

// 1 x 128 tiles: half a warp per tile, 8 values per lane. Tiles are numbered row-major over
// (rows, across); a warp takes tiles 2w and 2w+1 so both halves run the same loop.
template <bool VEC>
__global__ void quantize_rows_kernel(std::uint8_t* __restrict__ codes, float* __restrict__ scales,
                                     const bf16* __restrict__ x, std::int64_t rows, std::int64_t cols,
                                     std::int64_t ldx, std::int64_t across) {
  const std::int64_t tiles = rows * across;
  const int half = (threadIdx.x % detail::kWarp) / kLanesPerTile, lane = threadIdx.x % kLanesPerTile;
  const std::int64_t warps_total = static_cast<std::int64_t>(gridDim.x) * (blockDim.x / detail::kWarp);
  for (std::int64_t w = blockIdx.x * static_cast<std::int64_t>(blockDim.x / detail::kWarp) + threadIdx.x / detail::kWarp;
       2 * w < tiles; w += warps_total) {
    const std::int64_t t = 2 * w + half;
    const bool valid = t < tiles;
    const std::int64_t r = valid ? t / across : 0, tc = valid ? t % across : 0;
    const std::int64_t c = tc * kFp8TileK + lane * kChunk;
    const int n = valid ? static_cast<int>(std::max<std::int64_t>(0, std::min<std::int64_t>(kChunk, cols - c))) : 0;
    float v[kChunk];
    if (n > 0) {
      load_chunk<VEC>(x + r * ldx + c, n, v);
    } else {
#pragma unroll
      for (int i = 0; i < kChunk; ++i) v[i] = 0.0f;
    }
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < kChunk; ++i) amax = nan_max(amax, fabsf(v[i]));
    amax = half_warp_max(amax);
    if (!valid) continue;
    const float inv = inverse_scale(amax);
    if (lane == 0) scales[t] = scale_of(amax);
    if (n > 0) {
      std::uint8_t q[kChunk];
#pragma unroll
      for (int i = 0; i < kChunk; ++i) q[i] = encode(v[i], inv);
      store_chunk<VEC>(codes + r * cols + c, n, q);
    }
  }
}

constexpr int kBlockThreads = 256;
constexpr int kBlockRowsPerPass = kBlockThreads / kLanesPerTile;  // 16
constexpr int kBlockPasses = kFp8TileK / kBlockRowsPerPass;         // 8

// 128 x 128 blocks: one thread block per (group, block row, block column); thread t covers
// columns (t % 16)·8 .. +8 of rows t/16 + 16·i, i < 8, and keeps its 64 values in registers.
template <bool VEC>
__global__ void __launch_bounds__(kBlockThreads)
    quantize_blocks_kernel(std::uint8_t* __restrict__ codes, float* __restrict__ scales,
                           const bf16* __restrict__ w, std::int64_t rows, std::int64_t cols, std::int64_t ldw,
                           std::int64_t stride_w, std::int64_t down, std::int64_t across) {
  __shared__ float red[kBlockThreads / detail::kWarp];
  const std::int64_t g = blockIdx.z, br = blockIdx.y, bc = blockIdx.x;
  const int lane = threadIdx.x % kLanesPerTile, row_in_pass = threadIdx.x / kLanesPerTile;
  const std::int64_t c = bc * kFp8TileK + lane * kChunk;
  const int n = static_cast<int>(std::max<std::int64_t>(0, std::min<std::int64_t>(kChunk, cols - c)));
  const bf16* src = w + g * stride_w;
  float v[kBlockPasses][kChunk];
  float amax = 0.0f;
#pragma unroll
  for (int p = 0; p < kBlockPasses; ++p) {
    const std::int64_t r = br * kFp8TileK + p * kBlockRowsPerPass + row_in_pass;
    if (r < rows && n > 0) {
      load_chunk<VEC>(src + r * ldw + c, n, v[p]);
    } else {
#pragma unroll
      for (int i = 0; i < kChunk; ++i) v[p][i] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kChunk; ++i) amax = nan_max(amax, fabsf(v[p][i]));
  }
#pragma unroll
  for (int o = detail::kWarp / 2; o > 0; o /= 2) amax = nan_max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (threadIdx.x % detail::kWarp == 0) red[threadIdx.x / detail::kWarp] = amax;
  __syncthreads();
  amax = red[0];
#pragma unroll
  for (int i = 1; i < kBlockThreads / detail::kWarp; ++i) amax = nan_max(amax, red[i]);
  const float inv = inverse_scale(amax);
  if (threadIdx.x == 0) scales[(g * down + br) * across + bc] = scale_of(amax);
  std::uint8_t* dst = codes + g * rows * cols;
#pragma unroll
  for (int p = 0; p < kBlockPasses; ++p) {
    const std::int64_t r = br * kFp8TileK + p * kBlockRowsPerPass + row_in_pass;
    if (r >= rows || n == 0) continue;
    std::uint8_t q[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) q[i] = encode(v[p][i], inv);
    store_chunk<VEC>(dst + r * cols + c, n, q);
  }
}

__global__ void dequantize_kernel(float* __restrict__ out, const std::uint8_t* __restrict__ codes,
                                  const float* __restrict__ scales, std::int64_t rows, std::int64_t cols,
                                  int tile_rows, int tile_cols, std::int64_t across) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < rows * cols;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / cols, c = i % cols;
    __nv_fp8_e4m3 f;
    f.__x = static_cast<__nv_fp8_storage_t>(codes[i]);
    out[i] = __fmul_rn(static_cast<float>(f), scales[(r / tile_rows) * across + c / tile_cols]);
  }
}

bool aligned(const void* p, std::size_t bytes) { return reinterpret_cast<std::uintptr_t>(p) % bytes == 0; }

unsigned grid_for(std::int64_t work, std::int64_t per_block) {
  return static_cast<unsigned>(std::clamp<std::int64_t>(detail::ceil_div(work, per_block), 1, std::int64_t{1} << 20));
}

}  // namespace

void quantize_fp8_rows(__nv_fp8_e4m3* codes, float* scales, const __nv_bfloat16* x, std::int64_t rows,
                       std::int64_t cols, std::int64_t ldx, cudaStream_t stream) {
  if (ldx == 0) ldx = cols;
  GHT_EXPECTS(rows >= 0 && cols >= 0 && ldx >= cols, "quantize_fp8_rows: need rows, cols >= 0 and ldx >= cols");
  if (rows == 0 || cols == 0) return;
  GHT_EXPECTS(codes && scales && x, "quantize_fp8_rows: null pointer");
  const std::int64_t across = detail::ceil_div(cols, kFp8TileK);
  const bool vec = cols % kChunk == 0 && ldx % kChunk == 0 && aligned(x, 16) && aligned(codes, 8);
  auto* out = reinterpret_cast<std::uint8_t*>(codes);
  const unsigned grid = grid_for(rows * across, 2 * (kBlockThreads / detail::kWarp));
  if (vec) {
    quantize_rows_kernel<true><<<grid, kBlockThreads, 0, stream>>>(out, scales, x, rows, cols, ldx, across);
  } else {
    quantize_rows_kernel<false><<<grid, kBlockThreads, 0, stream>>>(out, scales, x, rows, cols, ldx, across);
  }
  GHT_CUDA_CHECK_LAUNCH();
}

void quantize_fp8_blocks(__nv_fp8_e4m3* codes, float* scales, const __nv_bfloat16* w, int groups,
                         std::int64_t rows, std::int64_t cols, std::int64_t ldw, std::int64_t stride_w,
                         cudaStream_t stream) {
  if (ldw == 0) ldw = cols;
  GHT_EXPECTS(groups >= 0 && rows >= 0 && cols >= 0 && ldw >= cols,
              "quantize_fp8_blocks: need groups, rows, cols >= 0 and ldw >= cols");
  if (groups == 0 || rows == 0 || cols == 0) return;
  GHT_EXPECTS(codes && scales && w, "quantize_fp8_blocks: null pointer");
  GHT_EXPECTS(groups == 1 || stride_w >= (rows - 1) * ldw + cols,
              "quantize_fp8_blocks: groups overlap (stride_w = " + std::to_string(stride_w) + ")");
  const std::int64_t down = detail::ceil_div(rows, kFp8TileK), across = detail::ceil_div(cols, kFp8TileK);
  GHT_EXPECTS(down <= 65535 && groups <= 65535, "quantize_fp8_blocks: too many block rows or groups for one grid");
  const bool vec = cols % kChunk == 0 && ldw % kChunk == 0 && (groups == 1 || stride_w % kChunk == 0) &&
                   aligned(w, 16) && aligned(codes, 8);
  auto* out = reinterpret_cast<std::uint8_t*>(codes);
  const dim3 grid(static_cast<unsigned>(across), static_cast<unsigned>(down), static_cast<unsigned>(groups));
  if (vec) {
    quantize_blocks_kernel<true><<<grid, kBlockThreads, 0, stream>>>(out, scales, w, rows, cols, ldw, stride_w, down, across);
  } else {
    quantize_blocks_kernel<false><<<grid, kBlockThreads, 0, stream>>>(out, scales, w, rows, cols, ldw, stride_w, down, across);
  }
  GHT_CUDA_CHECK_LAUNCH();
}

void dequantize_fp8(float* out, const __nv_fp8_e4m3* codes, const float* scales, std::int64_t rows,
                    std::int64_t cols, int tile_rows, int tile_cols, cudaStream_t stream) {
  GHT_EXPECTS(rows >= 0 && cols >= 0 && tile_rows > 0 && tile_cols > 0, "dequantize_fp8: bad shape or tile");
  if (rows == 0 || cols == 0) return;
  const std::int64_t across = detail::ceil_div(cols, tile_cols);
  dequantize_kernel<<<grid_for(rows * cols, 256), 256, 0, stream>>>(
      out, reinterpret_cast<const std::uint8_t*>(codes), scales, rows, cols, tile_rows, tile_cols, across);
  GHT_CUDA_CHECK_LAUNCH();
}

}  // namespace ght::kernels::cuda
