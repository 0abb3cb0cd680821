// QK-RMSNorm fused with RoPE, forward and backward (see qk_norm_rope.hpp).
#include "kernels/cuda/qk_norm_rope.hpp"

#include <algorithm>
#include <string>

#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/scratch.hpp"
#include "tier/cuda_check.hpp"
#include "tier/error.hpp"

namespace ght::kernels::cuda {
namespace {

using detail::bf16;

constexpr int kWarpsPerBlock = 8;

__global__ void make_positions_kernel(std::int32_t* __restrict__ pos,
                                      const std::int32_t* __restrict__ doc_ids, int B, int T) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  int start = 0;
  for (int t = 0; t < T; ++t) {
    const std::int64_t i = static_cast<std::int64_t>(b) * T + t;
    if (doc_ids != nullptr && t > 0 && doc_ids[i] != doc_ids[i - 1]) start = t;
    pos[i] = t - start;
  }
}

// Lane `lane` owns rotation pairs i = lane + 32·p (p < PAIRS, i < D/2): elements i and i + D/2.
// cos/sin as the CPU forms them: angle in double, rounded to float.
template <int PAIRS>
__device__ __forceinline__ void rope_cos_sin(float (&cs)[PAIRS], float (&sn)[PAIRS], int pos,
                                             int D, double theta) {
  const int lane = threadIdx.x % 32, half = D / 2;
#pragma unroll
  for (int p = 0; p < PAIRS; ++p) {
    const int i = lane + 32 * p;
    cs[p] = 1.0f;
    sn[p] = 0.0f;
    if (i < half) {
      const double inv_freq = 1.0 / pow(theta, static_cast<double>(2 * i) / D);
      double s = 0.0, c = 1.0;
      sincos(static_cast<double>(pos) * inv_freq, &s, &c);
      cs[p] = static_cast<float>(c);
      sn[p] = static_cast<float>(s);
    }
  }
}

// One warp per token; it loops over the H heads, reusing the token's cos/sin. No __restrict__
// on x/out: they may be the same buffer (every lane reads its elements before writing them).
template <int PAIRS>
__global__ void qk_norm_rope_forward_kernel(bf16* out, std::int64_t ld_out, float* __restrict__ rstd,
                                            const bf16* x, std::int64_t ld_x,
                                            const bf16* __restrict__ w,
                                            const std::int32_t* __restrict__ pos, std::int64_t N,
                                            int H, int D, float eps, double theta) {
  const std::int64_t t = blockIdx.x * static_cast<std::int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  if (t >= N) return;
  const int lane = threadIdx.x % 32, half = D / 2;
  float cs[PAIRS], sn[PAIRS], wl[PAIRS], wh[PAIRS];
  rope_cos_sin<PAIRS>(cs, sn, pos[t], D, theta);
#pragma unroll
  for (int p = 0; p < PAIRS; ++p) {
    const int i = lane + 32 * p;
    wl[p] = i < half ? detail::to_float(w[i]) : 0.0f;
    wh[p] = i < half ? detail::to_float(w[i + half]) : 0.0f;
  }
  for (int h = 0; h < H; ++h) {
    const bf16* xi = x + t * ld_x + static_cast<std::int64_t>(h) * D;
    float lo[PAIRS], hi[PAIRS];
    float ss = 0.0f;
#pragma unroll
    for (int p = 0; p < PAIRS; ++p) {
      const int i = lane + 32 * p;
      lo[p] = i < half ? detail::to_float(xi[i]) : 0.0f;
      hi[p] = i < half ? detail::to_float(xi[i + half]) : 0.0f;
      ss += lo[p] * lo[p] + hi[p] * hi[p];
    }
    ss = detail::warp_sum(ss);
    const float r = rsqrtf(ss / static_cast<float>(D) + eps);
    if (lane == 0) rstd[t * H + h] = r;
    bf16* oi = out + t * ld_out + static_cast<std::int64_t>(h) * D;
#pragma unroll
    for (int p = 0; p < PAIRS; ++p) {
      const int i = lane + 32 * p;
      if (i < half) {
        const float nl = lo[p] * r * wl[p], nh = hi[p] * r * wh[p];
        oi[i] = __float2bfloat16(nl * cs[p] - nh * sn[p]);
        oi[i + half] = __float2bfloat16(nh * cs[p] + nl * sn[p]);
      }
    }
  }
}

// Warps stride over tokens on a fixed grid; each lane keeps its elements' dw partial in registers
// and the warp writes one (D) partial row, reduced in order by column_reduce_add_kernel.
template <int PAIRS>
__global__ void qk_norm_rope_backward_kernel(bf16* dx, std::int64_t ld_dx, float* __restrict__ partial,
                                             const bf16* dout, std::int64_t ld_dout,
                                             const bf16* __restrict__ x, std::int64_t ld_x,
                                             const bf16* __restrict__ w,
                                             const float* __restrict__ rstd,
                                             const std::int32_t* __restrict__ pos, std::int64_t N,
                                             int H, int D, double theta, int warps_total) {
  const int gw = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (gw >= warps_total) return;
  const int lane = threadIdx.x % 32, half = D / 2;
  float wl[PAIRS], wh[PAIRS], pl[PAIRS], ph[PAIRS];
#pragma unroll
  for (int p = 0; p < PAIRS; ++p) {
    const int i = lane + 32 * p;
    wl[p] = i < half ? detail::to_float(w[i]) : 0.0f;
    wh[p] = i < half ? detail::to_float(w[i + half]) : 0.0f;
    pl[p] = ph[p] = 0.0f;
  }
  for (std::int64_t t = gw; t < N; t += warps_total) {
    float cs[PAIRS], sn[PAIRS];
    rope_cos_sin<PAIRS>(cs, sn, pos[t], D, theta);
    for (int h = 0; h < H; ++h) {
      const bf16* go = dout + t * ld_dout + static_cast<std::int64_t>(h) * D;
      const bf16* xi = x + t * ld_x + static_cast<std::int64_t>(h) * D;
      const float r = rstd[t * H + h];
      float gl[PAIRS], gh[PAIRS], xl[PAIRS], xh[PAIRS];
      float dot = 0.0f;
#pragma unroll
      for (int p = 0; p < PAIRS; ++p) {
        const int i = lane + 32 * p;
        gl[p] = gh[p] = xl[p] = xh[p] = 0.0f;
        if (i < half) {
          // The rotation is orthogonal: its backward is the transposed rotation.
          const float dl = detail::to_float(go[i]), dh = detail::to_float(go[i + half]);
          gl[p] = dl * cs[p] + dh * sn[p];
          gh[p] = dh * cs[p] - dl * sn[p];
          xl[p] = detail::to_float(xi[i]);
          xh[p] = detail::to_float(xi[i + half]);
        }
        dot += gl[p] * wl[p] * xl[p] + gh[p] * wh[p] * xh[p];
      }
      dot = detail::warp_sum(dot);
      const float k = r * r * dot / static_cast<float>(D);
      bf16* di = dx + t * ld_dx + static_cast<std::int64_t>(h) * D;
#pragma unroll
      for (int p = 0; p < PAIRS; ++p) {
        const int i = lane + 32 * p;
        if (i < half) {
          di[i] = __float2bfloat16(r * (gl[p] * wl[p] - xl[p] * k));
          di[i + half] = __float2bfloat16(r * (gh[p] * wh[p] - xh[p] * k));
          pl[p] += gl[p] * xl[p] * r;
          ph[p] += gh[p] * xh[p] * r;
        }
      }
    }
  }
  float* row = partial + static_cast<std::int64_t>(gw) * D;
#pragma unroll
  for (int p = 0; p < PAIRS; ++p) {
    const int i = lane + 32 * p;
    if (i < half) {
      row[i] = pl[p];
      row[i + half] = ph[p];
    }
  }
}

void check(const char* op, std::int64_t N, int H, int D, std::int64_t ld_a, std::int64_t ld_b) {
  GHT_EXPECTS(N >= 0 && H > 0 && D > 0, std::string(op) + ": need N >= 0, H > 0, D > 0, got N=" +
                                            std::to_string(N) + " H=" + std::to_string(H) +
                                            " D=" + std::to_string(D));
  GHT_EXPECTS(D % 2 == 0 && D <= 256,
              std::string(op) + ": head_dim D=" + std::to_string(D) + " must be even and <= 256");
  const std::int64_t hd = static_cast<std::int64_t>(H) * D;
  GHT_EXPECTS(ld_a >= hd && ld_b >= hd, std::string(op) + ": row strides must be >= H·D=" +
                                            std::to_string(hd));
}

// Fixed, device-independent number of warps in the backward, so dw's rounding depends only on N.
constexpr std::int64_t kBackwardWarps = 1024;

template <typename DW>
void backward_impl(bf16* dx, std::int64_t ld_dx, DW* dw, const bf16* dout, std::int64_t ld_dout,
                   const bf16* x, std::int64_t ld_x, const bf16* w, const float* rstd,
                   const std::int32_t* pos, std::int64_t N, int H, int D, double theta,
                   cudaStream_t stream) {
  const std::int64_t hd = static_cast<std::int64_t>(H) * D;
  if (ld_dx == 0) ld_dx = hd;
  if (ld_dout == 0) ld_dout = hd;
  if (ld_x == 0) ld_x = hd;
  check("qk_norm_rope_backward", N, H, D, ld_dx, std::min(ld_dout, ld_x));
  if (N == 0) return;
  const int warps = static_cast<int>(std::min(N, kBackwardWarps));
  auto* partial = static_cast<float*>(
      stream_scratch(stream, static_cast<std::size_t>(warps) * D * sizeof(float)));
  const unsigned grid = static_cast<unsigned>(detail::ceil_div(warps, kWarpsPerBlock));
  const int pairs = static_cast<int>(detail::ceil_div(D / 2, 32));
  const int threads = kWarpsPerBlock * 32;
  if (pairs == 1) {
    qk_norm_rope_backward_kernel<1><<<grid, threads, 0, stream>>>(
        dx, ld_dx, partial, dout, ld_dout, x, ld_x, w, rstd, pos, N, H, D, theta, warps);
  } else if (pairs == 2) {
    qk_norm_rope_backward_kernel<2><<<grid, threads, 0, stream>>>(
        dx, ld_dx, partial, dout, ld_dout, x, ld_x, w, rstd, pos, N, H, D, theta, warps);
  } else {
    qk_norm_rope_backward_kernel<4><<<grid, threads, 0, stream>>>(
        dx, ld_dx, partial, dout, ld_dout, x, ld_x, w, rstd, pos, N, H, D, theta, warps);
  }
  GHT_CUDA_CHECK_LAUNCH();
  detail::column_reduce_add_kernel<DW><<<detail::grid_for(D, 256), 256, 0, stream>>>(dw, partial,
                                                                                   warps, D);
  GHT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void make_positions(std::int32_t* pos, const std::int32_t* doc_ids, int B, int T,
                    cudaStream_t stream) {
  GHT_EXPECTS(B >= 0 && T >= 0, "make_positions: need B >= 0 and T >= 0, got B=" +
                                    std::to_string(B) + " T=" + std::to_string(T));
  if (B == 0 || T == 0) return;
  make_positions_kernel<<<detail::grid_for(B, 128), 128, 0, stream>>>(pos, doc_ids, B, T);
  GHT_CUDA_CHECK_LAUNCH();
}

void qk_norm_rope_forward(bf16* out, std::int64_t ld_out, float* rstd, const bf16* x,
                          std::int64_t ld_x, const bf16* w, const std::int32_t* pos,
                          std::int64_t N, int H, int D, float eps, double theta,
                          cudaStream_t stream) {
  const std::int64_t hd = static_cast<std::int64_t>(H) * D;
  if (ld_out == 0) ld_out = hd;
  if (ld_x == 0) ld_x = hd;
  check("qk_norm_rope_forward", N, H, D, ld_out, ld_x);
  if (N == 0) return;
  const unsigned grid = static_cast<unsigned>(detail::ceil_div(N, kWarpsPerBlock));
  const int threads = kWarpsPerBlock * 32;
  const int pairs = static_cast<int>(detail::ceil_div(D / 2, 32));
  if (pairs == 1) {
    qk_norm_rope_forward_kernel<1><<<grid, threads, 0, stream>>>(out, ld_out, rstd, x, ld_x, w,
                                                                 pos, N, H, D, eps, theta);
  } else if (pairs == 2) {
    qk_norm_rope_forward_kernel<2><<<grid, threads, 0, stream>>>(out, ld_out, rstd, x, ld_x, w,
                                                                 pos, N, H, D, eps, theta);
  } else {
    qk_norm_rope_forward_kernel<4><<<grid, threads, 0, stream>>>(out, ld_out, rstd, x, ld_x, w,
                                                                 pos, N, H, D, eps, theta);
  }
  GHT_CUDA_CHECK_LAUNCH();
}

void qk_norm_rope_backward(bf16* dx, std::int64_t ld_dx, float* dw, const bf16* dout,
                           std::int64_t ld_dout, const bf16* x, std::int64_t ld_x, const bf16* w,
                           const float* rstd, const std::int32_t* pos, std::int64_t N, int H,
                           int D, double theta, cudaStream_t stream) {
  backward_impl(dx, ld_dx, dw, dout, ld_dout, x, ld_x, w, rstd, pos, N, H, D, theta, stream);
}

void qk_norm_rope_backward(bf16* dx, std::int64_t ld_dx, bf16* dw, const bf16* dout,
                           std::int64_t ld_dout, const bf16* x, std::int64_t ld_x, const bf16* w,
                           const float* rstd, const std::int32_t* pos, std::int64_t N, int H,
                           int D, double theta, cudaStream_t stream) {
  backward_impl(dx, ld_dx, dw, dout, ld_dout, x, ld_x, w, rstd, pos, N, H, D, theta, stream);
}

}  // namespace ght::kernels::cuda
