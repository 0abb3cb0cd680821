// SwiGLU forward/backward on gate/up halves (see swiglu.hpp).
#include "kernels/cuda/swiglu.hpp"

#include <algorithm>
#include <string>

#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/detail/fp8_tile.cuh"
#include "tier/cuda_check.hpp"
#include "tier/error.hpp"

namespace ght::kernels::cuda {
namespace {

using detail::bf16;

__device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + __expf(-x)); }

// Grid-stride over (row, VEC-chunk) pairs; F % VEC == 0.
template <int VEC>
__global__ void swiglu_forward_kernel(bf16* __restrict__ act, std::int64_t ld_act,
                                      const bf16* __restrict__ gate, const bf16* __restrict__ up,
                                      std::int64_t ld_in, std::int64_t R, int F) {
  const int chunks = F / VEC;
  const std::int64_t total = R * chunks;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < total; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / chunks;
    const int c = static_cast<int>(i % chunks) * VEC;
    float g[VEC], u[VEC], a[VEC];
    detail::load_vec<VEC>(gate + r * ld_in + c, g);
    detail::load_vec<VEC>(up + r * ld_in + c, u);
#pragma unroll
    for (int j = 0; j < VEC; ++j) a[j] = g[j] * sigmoidf(g[j]) * u[j];
    detail::store_vec<VEC>(act + r * ld_act + c, a);
  }
}

// swiglu_forward_kernel's act, and its 1 x 128 e4m3 tiles as quantize_fp8_rows(act) writes them:
// half a warp per tile (detail::quantize_tile_chunk), 8 values per lane, tiles row-major over
// (R, across), a warp on tiles 2w and 2w+1. The tile is quantised from the bf16 act it stores.
template <bool VEC>
__global__ void swiglu_forward_fp8_kernel(bf16* __restrict__ act, std::int64_t ld_act,
                                          std::uint8_t* __restrict__ codes, float* __restrict__ scales,
                                          const bf16* __restrict__ gate, const bf16* __restrict__ up,
                                          std::int64_t ld_in, std::int64_t R, int F, std::int64_t across) {
  using detail::kChunk;
  const std::int64_t tiles = R * across;
  for (std::int64_t w = detail::first_tile_warp(); 2 * w < tiles; w += detail::tile_warp_stride()) {
    const detail::TileSlot s = detail::tile_slot(w, tiles, across, F);
    const bool valid = s.valid;
    const std::int64_t r = s.row, tc = s.tile_col, c = s.col;
    const int n = s.n;
    float v[kChunk];
#pragma unroll
    for (int j = 0; j < kChunk; ++j) v[j] = 0.0f;
    if (n > 0) {
      float g[kChunk], u[kChunk];
      detail::load_chunk<VEC>(gate + r * ld_in + c, n, g);
      detail::load_chunk<VEC>(up + r * ld_in + c, n, u);
      detail::Bf16x8 h;
#pragma unroll
      for (int j = 0; j < kChunk; ++j) {
        h.v[j] = __float2bfloat16(g[j] * sigmoidf(g[j]) * u[j]);  // swiglu_forward_kernel's
        if (j < n) v[j] = __bfloat162float(h.v[j]);
      }
      bf16* dst = act + r * ld_act + c;
      if constexpr (VEC) {
        *reinterpret_cast<detail::Bf16x8*>(dst) = h;
      } else {
#pragma unroll
        for (int j = 0; j < kChunk; ++j)
          if (j < n) dst[j] = h.v[j];
      }
    }
    detail::quantize_tile_chunk<VEC>(v, n, valid, codes + r * F + c, scales + r * across + tc);
  }
}

// No __restrict__: dgate/dup may alias gate/up.
template <int VEC>
__global__ void swiglu_backward_kernel(bf16* dgate, bf16* dup, std::int64_t ld_dgu,
                                       const bf16* __restrict__ dact, std::int64_t ld_dact,
                                       const bf16* gate, const bf16* up, std::int64_t ld_in,
                                       std::int64_t R, int F) {
  const int chunks = F / VEC;
  const std::int64_t total = R * chunks;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < total; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / chunks;
    const int c = static_cast<int>(i % chunks) * VEC;
    float g[VEC], u[VEC], da[VEC], dg[VEC], du[VEC];
    detail::load_vec<VEC>(gate + r * ld_in + c, g);
    detail::load_vec<VEC>(up + r * ld_in + c, u);
    detail::load_vec<VEC>(dact + r * ld_dact + c, da);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float s = sigmoidf(g[j]);
      du[j] = da[j] * g[j] * s;
      dg[j] = da[j] * u[j] * s * (1.0f + g[j] * (1.0f - s));
    }
    detail::store_vec<VEC>(dgate + r * ld_dgu + c, dg);
    detail::store_vec<VEC>(dup + r * ld_dgu + c, du);
  }
}

void check(const char* op, std::int64_t R, int F, std::int64_t ld_a, std::int64_t ld_b,
           std::int64_t ld_c) {
  GHT_EXPECTS(R >= 0 && F > 0, std::string(op) + ": need R >= 0 and F > 0, got R=" +
                                   std::to_string(R) + " F=" + std::to_string(F));
  GHT_EXPECTS(ld_a >= F && ld_b >= F && ld_c >= F,
              std::string(op) + ": row strides must be >= F=" + std::to_string(F));
}

constexpr int kThreads = 256;

}  // namespace

void swiglu_forward(bf16* act, std::int64_t ld_act, const bf16* gate, const bf16* up,
                    std::int64_t ld_in, std::int64_t R, int F, cudaStream_t stream) {
  check("swiglu_forward", R, F, ld_act, ld_in, ld_in);
  if (R == 0) return;
  // The vector path needs every row start 16-byte aligned: F, the strides and the bases.
  const bool vec = F % 8 == 0 && ld_act % 8 == 0 && ld_in % 8 == 0 && detail::aligned16(act, gate, up);
  const std::int64_t items = R * (vec ? F / 8 : F);
  const unsigned grid = detail::grid_for(items, kThreads, 132 * 16);
  if (vec) {
    swiglu_forward_kernel<8><<<grid, kThreads, 0, stream>>>(act, ld_act, gate, up, ld_in, R, F);
  } else {
    swiglu_forward_kernel<1><<<grid, kThreads, 0, stream>>>(act, ld_act, gate, up, ld_in, R, F);
  }
  GHT_CUDA_CHECK_LAUNCH();
}

void swiglu_forward_fp8(bf16* act, std::int64_t ld_act, __nv_fp8_e4m3* codes, float* scales,
                        const bf16* gate, const bf16* up, std::int64_t ld_in, std::int64_t R, int F,
                        cudaStream_t stream) {
  check("swiglu_forward_fp8", R, F, ld_act, ld_in, ld_in);
  if (R == 0) return;
  GHT_EXPECTS(act && codes && scales && gate && up, "swiglu_forward_fp8: null pointer");
  const std::int64_t across = detail::ceil_div(F, kFp8TileK);
  // 16-byte loads and stores of act need every row start aligned; 8-byte code stores, F % 8.
  const bool vec = F % 8 == 0 && ld_act % 8 == 0 && ld_in % 8 == 0 && detail::aligned16(act, gate, up) &&
                   detail::aligned(codes, 8);
  auto* out = reinterpret_cast<std::uint8_t*>(codes);
  constexpr int kTilesPerBlock = 2 * (kThreads / detail::kWarp);
  const unsigned grid = detail::grid_for(R * across, kTilesPerBlock, std::int64_t{1} << 20);
  if (vec) {
    swiglu_forward_fp8_kernel<true><<<grid, kThreads, 0, stream>>>(act, ld_act, out, scales, gate, up, ld_in, R, F, across);
  } else {
    swiglu_forward_fp8_kernel<false><<<grid, kThreads, 0, stream>>>(act, ld_act, out, scales, gate, up, ld_in, R, F, across);
  }
  GHT_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(bf16* dgate, bf16* dup, std::int64_t ld_dgu, const bf16* dact,
                     std::int64_t ld_dact, const bf16* gate, const bf16* up, std::int64_t ld_in,
                     std::int64_t R, int F, cudaStream_t stream) {
  check("swiglu_backward", R, F, ld_dgu, ld_dact, ld_in);
  if (R == 0) return;
  const bool vec = F % 8 == 0 && ld_dgu % 8 == 0 && ld_dact % 8 == 0 && ld_in % 8 == 0 &&
                   detail::aligned16(dgate, dup, dact, gate, up);
  const std::int64_t items = R * (vec ? F / 8 : F);
  const unsigned grid = detail::grid_for(items, kThreads, 132 * 16);
  if (vec) {
    swiglu_backward_kernel<8><<<grid, kThreads, 0, stream>>>(dgate, dup, ld_dgu, dact, ld_dact,
                                                             gate, up, ld_in, R, F);
  } else {
    swiglu_backward_kernel<1><<<grid, kThreads, 0, stream>>>(dgate, dup, ld_dgu, dact, ld_dact,
                                                             gate, up, ld_in, R, F);
  }
  GHT_CUDA_CHECK_LAUNCH();
}

}  // namespace ght::kernels::cuda
