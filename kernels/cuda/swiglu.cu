// SwiGLU forward/backward on gate/up halves (see swiglu.hpp).
#include "kernels/cuda/swiglu.hpp"

#include <string>

#include "kernels/cuda/detail/common.cuh"
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
