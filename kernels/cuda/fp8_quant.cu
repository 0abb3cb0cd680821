// Block-scaled e4m3 quantisation and dequantisation (see fp8_quant.hpp).
#include "kernels/cuda/fp8_quant.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/detail/fp8_tile.cuh"
#include "tier/cuda_check.hpp"
#include "tier/error.hpp"

namespace ght::kernels::cuda {
namespace {

using detail::bf16;

using detail::encode;
using detail::inverse_scale;
using detail::kChunk;
using detail::kLanesPerTile;
using detail::load_chunk;
using detail::nan_max;
using detail::scale_of;
using detail::store_chunk;

// 1 x 128 tiles: half a warp per tile, 8 values per lane. Tiles are numbered row-major over
// (rows, across); a warp takes tiles 2w and 2w+1 so both halves run the same loop.
// SCATTER: tile row a is assignment a, read from x row a / K and written to row dst_row[a]
// (skipped when negative). Tiles run in assignment order, so the K assignments of one token are
// neighbours in the grid and x is read about once from HBM (as permute.cu's scatter_rows_kernel).
template <bool VEC, bool SCATTER>
__global__ void quantize_rows_kernel(std::uint8_t* __restrict__ codes, float* __restrict__ scales,
                                     const bf16* __restrict__ x, std::int64_t rows, std::int64_t cols,
                                     std::int64_t ldx, std::int64_t across,
                                     const std::int32_t* __restrict__ dst_row, int K) {
  const std::int64_t tiles = rows * across;
  for (std::int64_t w = detail::first_tile_warp(); 2 * w < tiles; w += detail::tile_warp_stride()) {
    const detail::TileSlot s = detail::tile_slot(w, tiles, across, cols);
    bool valid = s.valid;
    const std::int64_t a = s.row, tc = s.tile_col, c = s.col;
    std::int64_t src = a, dst = a;
    if constexpr (SCATTER) {
      dst = valid ? dst_row[a] : -1;
      valid = dst >= 0;
      dst = valid ? dst : 0;
      src = a / K;
    }
    const int n = valid ? s.n : 0;
    float v[kChunk];
    if (n > 0) {
      load_chunk<VEC>(x + src * ldx + c, n, v);
    } else {
#pragma unroll
      for (int i = 0; i < kChunk; ++i) v[i] = 0.0f;
    }
    detail::quantize_tile_chunk<VEC>(v, n, valid, codes + dst * cols + c, scales + dst * across + tc);
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

using detail::aligned;

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
    quantize_rows_kernel<true, false><<<grid, kBlockThreads, 0, stream>>>(out, scales, x, rows, cols, ldx, across, nullptr, 1);
  } else {
    quantize_rows_kernel<false, false><<<grid, kBlockThreads, 0, stream>>>(out, scales, x, rows, cols, ldx, across, nullptr, 1);
  }
  GHT_CUDA_CHECK_LAUNCH();
}

void quantize_fp8_rows_scatter(__nv_fp8_e4m3* codes, float* scales, const __nv_bfloat16* x,
                               const std::int32_t* dst_row, std::int64_t N, int K, std::int64_t cols,
                               cudaStream_t stream) {
  GHT_EXPECTS(N >= 0 && K >= 1 && cols >= 0, "quantize_fp8_rows_scatter: need N >= 0, K >= 1, cols >= 0, got N=" +
                                                  std::to_string(N) + " K=" + std::to_string(K) +
                                                  " cols=" + std::to_string(cols));
  GHT_EXPECTS(N * K <= 0x7fffffff, "quantize_fp8_rows_scatter: N·K=" + std::to_string(N * K) +
                                       " exceeds int32 row ids");
  const std::int64_t A = N * K;
  if (A == 0 || cols == 0) return;
  GHT_EXPECTS(codes && scales && x && dst_row, "quantize_fp8_rows_scatter: null pointer");
  const std::int64_t across = detail::ceil_div(cols, kFp8TileK);
  const bool vec = cols % kChunk == 0 && aligned(x, 16) && aligned(codes, 8);
  auto* out = reinterpret_cast<std::uint8_t*>(codes);
  const unsigned grid = grid_for(A * across, 2 * (kBlockThreads / detail::kWarp));
  if (vec) {
    quantize_rows_kernel<true, true><<<grid, kBlockThreads, 0, stream>>>(out, scales, x, A, cols, cols, across, dst_row, K);
  } else {
    quantize_rows_kernel<false, true><<<grid, kBlockThreads, 0, stream>>>(out, scales, x, A, cols, cols, across, dst_row, K);
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
