// RMSNorm and fused residual + RMSNorm, forward and backward (see rmsnorm.hpp).
#include "kernels/cuda/rmsnorm.hpp"

#include <algorithm>
#include <string>

#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/scratch.hpp"
#include "tier/cuda_check.hpp"
#include "tier/error.hpp"

namespace ght::kernels::cuda {
namespace {

using detail::bf16;

// One block per row; each thread owns VEC-wide column chunks strided by blockDim.x·VEC.
// FUSED: sum = bf16(x + residual) is written first and normalised (sum may alias x/residual:
// every element is read and then written by the same thread, so no restrict here).
template <int VEC, bool FUSED>
__global__ void rmsnorm_forward_kernel(bf16* sum, bf16* __restrict__ out, float* __restrict__ rstd,
                                       const bf16* x, const bf16* residual,
                                       const bf16* __restrict__ w, int C, float eps) {
  __shared__ float red[32];
  const std::int64_t row = blockIdx.x;
  const bf16* xr = x + row * C;
  const bf16* src = xr;
  float ss = 0.0f;
  for (int c = threadIdx.x * VEC; c < C; c += blockDim.x * VEC) {
    float v[VEC];
    detail::load_vec<VEC>(xr + c, v);
    if constexpr (FUSED) {
      float r[VEC];
      detail::load_vec<VEC>(residual + row * C + c, r);
#pragma unroll
      for (int i = 0; i < VEC; ++i) v[i] = detail::round_bf16(v[i] + r[i]);
      detail::store_vec<VEC>(sum + row * C + c, v);
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) ss += v[i] * v[i];
  }
  if constexpr (FUSED) src = sum + row * C;
  ss = detail::block_sum(ss, red);
  const float r = rsqrtf(ss / static_cast<float>(C) + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  for (int c = threadIdx.x * VEC; c < C; c += blockDim.x * VEC) {
    float v[VEC], wv[VEC];
    detail::load_vec<VEC>(src + c, v);
    detail::load_vec<VEC>(w + c, wv);
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[i] = v[i] * r * wv[i];
    detail::store_vec<VEC>(out + row * C + c, v);
  }
}

// Rows strided over a fixed grid; each thread accumulates dw for its own columns in shared
// memory (no atomics), and the block's partial row goes to partial[blockIdx.x].
//   dx_c += r·(g_c·w_c − x_c·r²·mean_j(g_j·w_j·x_j)),  dw_c += g_c·x_c·r
template <int VEC>
__global__ void rmsnorm_backward_kernel(bf16* __restrict__ dx, float* __restrict__ partial,
                                       const bf16* __restrict__ dout, const bf16* __restrict__ x,
                                       const bf16* __restrict__ w, const float* __restrict__ rstd,
                                       std::int64_t N, int C) {
  extern __shared__ float pw[];  // (C)
  __shared__ float red[32];
  for (int c = threadIdx.x * VEC; c < C; c += blockDim.x * VEC) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) pw[c + i] = 0.0f;
  }
  for (std::int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const float r = rstd[row];
    const bf16* g = dout + row * C;
    const bf16* xr = x + row * C;
    float dot = 0.0f;
    for (int c = threadIdx.x * VEC; c < C; c += blockDim.x * VEC) {
      float gv[VEC], xv[VEC], wv[VEC];
      detail::load_vec<VEC>(g + c, gv);
      detail::load_vec<VEC>(xr + c, xv);
      detail::load_vec<VEC>(w + c, wv);
#pragma unroll
      for (int i = 0; i < VEC; ++i) dot += gv[i] * wv[i] * xv[i];
    }
    dot = detail::block_sum(dot, red);
    const float k = r * r * dot / static_cast<float>(C);
    for (int c = threadIdx.x * VEC; c < C; c += blockDim.x * VEC) {
      float gv[VEC], xv[VEC], wv[VEC], dv[VEC];
      detail::load_vec<VEC>(g + c, gv);
      detail::load_vec<VEC>(xr + c, xv);
      detail::load_vec<VEC>(w + c, wv);
      detail::load_vec<VEC>(dx + row * C + c, dv);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        dv[i] += r * (gv[i] * wv[i] - xv[i] * k);
        pw[c + i] += gv[i] * xv[i] * r;
      }
      detail::store_vec<VEC>(dx + row * C + c, dv);
    }
  }
  for (int c = threadIdx.x * VEC; c < C; c += blockDim.x * VEC) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) partial[static_cast<std::int64_t>(blockIdx.x) * C + c + i] = pw[c + i];
  }
}

// Enough threads that each owns about one VEC chunk of a row, within [32, 1024].
int threads_for(int C, int vec) {
  const int chunks = static_cast<int>(detail::ceil_div(C, vec));
  return std::clamp(static_cast<int>(detail::ceil_div(chunks, 32) * 32), 32, 1024);
}

// Fixed, device-independent grid of the backward: the partial sums and hence the rounding of dw
// depend only on N, so results are reproducible on any GPU.
constexpr std::int64_t kBackwardBlocks = 256;

void check_sizes(const char* op, std::int64_t N, int C) {
  GHT_EXPECTS(N >= 0 && C > 0, std::string(op) + ": need N >= 0 and C > 0, got N=" +
                                   std::to_string(N) + " C=" + std::to_string(C));
  GHT_EXPECTS(N <= 0x7fffffff, std::string(op) + ": N=" + std::to_string(N) +
                                   " exceeds the grid limit of this kernel");
}

template <bool FUSED>
void launch_forward(bf16* sum, bf16* out, float* rstd, const bf16* x, const bf16* residual,
                    const bf16* w, std::int64_t N, int C, float eps, cudaStream_t stream) {
  if (N == 0) return;
  const bool vec = C % 8 == 0 && detail::aligned16(x, w, out) &&
                   (!FUSED || detail::aligned16(sum, residual));
  const int threads = threads_for(C, vec ? 8 : 1);
  const auto grid = static_cast<unsigned>(N);
  if (vec) {
    rmsnorm_forward_kernel<8, FUSED><<<grid, threads, 0, stream>>>(sum, out, rstd, x, residual, w,
                                                                   C, eps);
  } else {
    rmsnorm_forward_kernel<1, FUSED><<<grid, threads, 0, stream>>>(sum, out, rstd, x, residual, w,
                                                                   C, eps);
  }
  GHT_CUDA_CHECK_LAUNCH();
}

template <typename DW>
void launch_backward(bf16* dx, DW* dw, const bf16* dout, const bf16* x, const bf16* w,
                     const float* rstd, std::int64_t N, int C, cudaStream_t stream) {
  check_sizes("rmsnorm_backward", N, C);
  if (N == 0) return;
  const int blocks = static_cast<int>(std::min<std::int64_t>(N, kBackwardBlocks));
  auto* partial = static_cast<float*>(
      stream_scratch(stream, static_cast<std::size_t>(blocks) * C * sizeof(float)));
  const bool vec = C % 8 == 0 && detail::aligned16(dx, dout, x, w);
  const int threads = threads_for(C, vec ? 8 : 1);
  const std::size_t smem = static_cast<std::size_t>(C) * sizeof(float);
  GHT_EXPECTS(smem <= 200 * 1024, "rmsnorm_backward: C=" + std::to_string(C) +
                                      " needs more shared memory than this kernel supports");
  auto kernel = vec ? rmsnorm_backward_kernel<8> : rmsnorm_backward_kernel<1>;
  if (smem > 48 * 1024) {
    GHT_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)));
  }
  kernel<<<blocks, threads, smem, stream>>>(dx, partial, dout, x, w, rstd, N, C);
  GHT_CUDA_CHECK_LAUNCH();
  detail::column_reduce_add_kernel<DW>
      <<<detail::grid_for(C, 256), 256, 0, stream>>>(dw, partial, blocks, C);
  GHT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void rmsnorm_forward(bf16* out, float* rstd, const bf16* x, const bf16* w, std::int64_t N, int C,
                     float eps, cudaStream_t stream) {
  check_sizes("rmsnorm_forward", N, C);
  launch_forward<false>(nullptr, out, rstd, x, nullptr, w, N, C, eps, stream);
}

void fused_residual_rmsnorm_forward(bf16* sum, bf16* out, float* rstd, const bf16* x,
                                    const bf16* residual, const bf16* w, std::int64_t N, int C,
                                    float eps, cudaStream_t stream) {
  check_sizes("fused_residual_rmsnorm_forward", N, C);
  launch_forward<true>(sum, out, rstd, x, residual, w, N, C, eps, stream);
}

void rmsnorm_backward(bf16* dx, float* dw, const bf16* dout, const bf16* x, const bf16* w,
                      const float* rstd, std::int64_t N, int C, cudaStream_t stream) {
  launch_backward(dx, dw, dout, x, w, rstd, N, C, stream);
}

void rmsnorm_backward(bf16* dx, bf16* dw, const bf16* dout, const bf16* x, const bf16* w,
                      const float* rstd, std::int64_t N, int C, cudaStream_t stream) {
  launch_backward(dx, dw, dout, x, w, rstd, N, C, stream);
}

}  // namespace ght::kernels::cuda
