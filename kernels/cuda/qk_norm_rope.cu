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
constexpr int kMaxD = 256;

// The backward's view of one head set: dw's per-block partial rows instead of dw.
struct QkNormRopeBackwardSet {
  bf16* dx;
  std::int64_t ld_dx;
  float* partial;  // (blocks, D)
  const bf16* dout;
  std::int64_t ld_dout;
  const bf16* x;
  std::int64_t ld_x;
  const bf16* w;
  const float* rstd;
  int heads;
};

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

// Heads a warp of the backward works on at once: their loads go out together. (The forward
// keeps one head at a time: four in flight measured 6.3 -> 11.4 ms per step at bench-h200 mb4.)
constexpr int kHeadsInFlight = 4;

// One warp per token; it loops over the heads of both sets (q's, then k's), reusing the token's
// cos/sin. No __restrict__ on x/out: they may be the same buffer (every lane reads its elements
// before writing them).
template <int PAIRS>
__global__ void qk_norm_rope_forward_kernel(QkNormRopeHeads q, QkNormRopeHeads k,
                                            const std::int32_t* __restrict__ pos, std::int64_t N,
                                            int D, float eps, double theta) {
  const std::int64_t t = blockIdx.x * static_cast<std::int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  if (t >= N) return;
  const int lane = threadIdx.x % 32, half = D / 2;
  float cs[PAIRS], sn[PAIRS];
  rope_cos_sin<PAIRS>(cs, sn, pos[t], D, theta);
  for (int set = 0; set < 2; ++set) {
    const QkNormRopeHeads& a = set == 0 ? q : k;
    float wl[PAIRS], wh[PAIRS];
#pragma unroll
    for (int p = 0; p < PAIRS; ++p) {
      const int i = lane + 32 * p;
      wl[p] = i < half && a.heads > 0 ? detail::to_float(a.w[i]) : 0.0f;
      wh[p] = i < half && a.heads > 0 ? detail::to_float(a.w[i + half]) : 0.0f;
    }
    for (int h = 0; h < a.heads; ++h) {
      const bf16* xi = a.x + t * a.ld_x + static_cast<std::int64_t>(h) * D;
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
      if (lane == 0) a.rstd[t * a.heads + h] = r;
      bf16* oi = a.out + t * a.ld_out + static_cast<std::int64_t>(h) * D;
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
}

constexpr int kBackwardWarpsPerBlock = 16;

// Block b takes the contiguous tokens [b·tpb, ...), warp w the tokens t0 + w, t0 + w + 16, ...,
// each through the heads of both sets. Every lane keeps its elements' dw partial per set in
// registers; the block adds its warps' partials in warp order into one (D) row per set,
// partial_s[b], reduced over the blocks in order by column_reduce_add_kernel.
template <int PAIRS>
__global__ void qk_norm_rope_backward_kernel(QkNormRopeBackwardSet q, QkNormRopeBackwardSet k,
                                             const std::int32_t* __restrict__ pos, std::int64_t N,
                                             std::int64_t tpb, int D, double theta) {
  __shared__ float red[kBackwardWarpsPerBlock][kMaxD];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, half = D / 2;
  float pl[2][PAIRS], ph[2][PAIRS];
#pragma unroll
  for (int p = 0; p < PAIRS; ++p) pl[0][p] = ph[0][p] = pl[1][p] = ph[1][p] = 0.0f;
  const std::int64_t t0 = static_cast<std::int64_t>(blockIdx.x) * tpb;
  const std::int64_t t1 = t0 + tpb < N ? t0 + tpb : N;
  for (std::int64_t t = t0 + warp; t < t1; t += kBackwardWarpsPerBlock) {
    float cs[PAIRS], sn[PAIRS];
    rope_cos_sin<PAIRS>(cs, sn, pos[t], D, theta);
#pragma unroll
    for (int set = 0; set < 2; ++set) {
      const QkNormRopeBackwardSet& a = set == 0 ? q : k;
      float wl[PAIRS], wh[PAIRS];
#pragma unroll
      for (int p = 0; p < PAIRS; ++p) {
        const int i = lane + 32 * p;
        wl[p] = i < half && a.heads > 0 ? detail::to_float(a.w[i]) : 0.0f;
        wh[p] = i < half && a.heads > 0 ? detail::to_float(a.w[i + half]) : 0.0f;
      }
      // kHeadsInFlight heads at a time: their loads are issued together and their warp sums
      // interleave, so a warp keeps several heads' memory requests in flight instead of one
      // head's load-reduce-store chain at a time (the kernel was latency-bound at ~40% of HBM).
      // Each head's arithmetic, and the order its dw terms are added in, is unchanged.
      for (int h0 = 0; h0 < a.heads; h0 += kHeadsInFlight) {
        float gl[kHeadsInFlight][PAIRS], gh[kHeadsInFlight][PAIRS], xl[kHeadsInFlight][PAIRS],
            xh[kHeadsInFlight][PAIRS], dot[kHeadsInFlight], r[kHeadsInFlight];
#pragma unroll
        for (int u = 0; u < kHeadsInFlight; ++u) {
          const int h = h0 + u;
          const bool live = h < a.heads;
          const bf16* go = a.dout + t * a.ld_dout + static_cast<std::int64_t>(h) * D;
          const bf16* xi = a.x + t * a.ld_x + static_cast<std::int64_t>(h) * D;
          r[u] = live ? a.rstd[t * a.heads + h] : 0.0f;
          dot[u] = 0.0f;
#pragma unroll
          for (int p = 0; p < PAIRS; ++p) {
            const int i = lane + 32 * p;
            gl[u][p] = gh[u][p] = xl[u][p] = xh[u][p] = 0.0f;
            if (live && i < half) {
              // The rotation is orthogonal: its backward is the transposed rotation.
              const float dl = detail::to_float(go[i]), dh = detail::to_float(go[i + half]);
              gl[u][p] = dl * cs[p] + dh * sn[p];
              gh[u][p] = dh * cs[p] - dl * sn[p];
              xl[u][p] = detail::to_float(xi[i]);
              xh[u][p] = detail::to_float(xi[i + half]);
            }
            dot[u] += gl[u][p] * wl[p] * xl[u][p] + gh[u][p] * wh[p] * xh[u][p];
          }
        }
#pragma unroll
        for (int u = 0; u < kHeadsInFlight; ++u) dot[u] = detail::warp_sum(dot[u]);
#pragma unroll
        for (int u = 0; u < kHeadsInFlight; ++u) {
          const int h = h0 + u;
          if (h >= a.heads) break;
          const float kk = r[u] * r[u] * dot[u] / static_cast<float>(D);
          bf16* di = a.dx + t * a.ld_dx + static_cast<std::int64_t>(h) * D;
#pragma unroll
          for (int p = 0; p < PAIRS; ++p) {
            const int i = lane + 32 * p;
            if (i < half) {
              di[i] = __float2bfloat16(r[u] * (gl[u][p] * wl[p] - xl[u][p] * kk));
              di[i + half] = __float2bfloat16(r[u] * (gh[u][p] * wh[p] - xh[u][p] * kk));
              pl[set][p] += gl[u][p] * xl[u][p] * r[u];
              ph[set][p] += gh[u][p] * xh[u][p] * r[u];
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int set = 0; set < 2; ++set) {
    const QkNormRopeBackwardSet& a = set == 0 ? q : k;
    if (a.heads == 0) continue;  // uniform over the block
#pragma unroll
    for (int p = 0; p < PAIRS; ++p) {
      const int i = lane + 32 * p;
      if (i < half) {
        red[warp][i] = pl[set][p];
        red[warp][i + half] = ph[set][p];
      }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
      float s = 0.0f;
      for (int w = 0; w < kBackwardWarpsPerBlock; ++w) s += red[w][c];
      a.partial[static_cast<std::int64_t>(blockIdx.x) * D + c] = s;
    }
    __syncthreads();
  }
}

void check(const char* op, std::int64_t N, int H, int D, std::int64_t ld_a, std::int64_t ld_b) {
  GHT_EXPECTS(N >= 0 && H >= 0 && D > 0, std::string(op) + ": need N >= 0, heads >= 0, D > 0, got N=" +
                                             std::to_string(N) + " heads=" + std::to_string(H) +
                                             " D=" + std::to_string(D));
  GHT_EXPECTS(D % 2 == 0 && D <= kMaxD,
              std::string(op) + ": head_dim D=" + std::to_string(D) + " must be even and <= 256");
  const std::int64_t hd = static_cast<std::int64_t>(H) * D;
  GHT_EXPECTS(ld_a >= hd && ld_b >= hd, std::string(op) + ": row strides must be >= heads·D=" +
                                            std::to_string(hd));
}

// Row strides of 0 mean packed (heads·D).
std::int64_t row(std::int64_t ld, int heads, int D) {
  return ld == 0 ? static_cast<std::int64_t>(heads) * D : ld;
}

int pairs_of(int D) { return static_cast<int>(detail::ceil_div(D / 2, 32)); }

// The backward's grid: blocks of 16 warps over contiguous ranges of tpb tokens, at most 512
// blocks. Both depend only on N, so dw's rounding does too (any GPU, fused or not).
struct BackwardGrid {
  int blocks;
  std::int64_t tpb;
};
BackwardGrid backward_grid(std::int64_t N) {
  const std::int64_t b = std::min<std::int64_t>(detail::ceil_div(N, kBackwardWarpsPerBlock), 512);
  const std::int64_t tpb = detail::ceil_div(N, b);
  return {static_cast<int>(detail::ceil_div(N, tpb)), tpb};
}

void forward_impl(QkNormRopeHeads q, QkNormRopeHeads k, const std::int32_t* pos, std::int64_t N,
                  int D, float eps, double theta, cudaStream_t stream) {
  for (QkNormRopeHeads* a : {&q, &k}) {
    a->ld_out = row(a->ld_out, a->heads, D);
    a->ld_x = row(a->ld_x, a->heads, D);
    check("qk_norm_rope_forward", N, a->heads, D, a->ld_out, a->ld_x);
  }
  if (N == 0 || q.heads + k.heads == 0) return;
  const unsigned grid = static_cast<unsigned>(detail::ceil_div(N, kWarpsPerBlock));
  const int threads = kWarpsPerBlock * 32;
  switch (pairs_of(D)) {
    case 1: qk_norm_rope_forward_kernel<1><<<grid, threads, 0, stream>>>(q, k, pos, N, D, eps, theta); break;
    case 2: qk_norm_rope_forward_kernel<2><<<grid, threads, 0, stream>>>(q, k, pos, N, D, eps, theta); break;
    default: qk_norm_rope_forward_kernel<4><<<grid, threads, 0, stream>>>(q, k, pos, N, D, eps, theta); break;
  }
  GHT_CUDA_CHECK_LAUNCH();
}

template <typename DW>
void backward_impl(const QkNormRopeGradHeads<DW>& q, const QkNormRopeGradHeads<DW>& k,
                   const std::int32_t* pos, std::int64_t N, int D, double theta,
                   cudaStream_t stream) {
  QkNormRopeBackwardSet set[2];
  const QkNormRopeGradHeads<DW>* in[2] = {&q, &k};
  for (int i = 0; i < 2; ++i) {
    const auto& a = *in[i];
    set[i] = {a.dx, row(a.ld_dx, a.heads, D), nullptr, a.dout, row(a.ld_dout, a.heads, D),
              a.x, row(a.ld_x, a.heads, D), a.w, a.rstd, a.heads};
    check("qk_norm_rope_backward", N, a.heads, D, set[i].ld_dx,
          std::min(set[i].ld_dout, set[i].ld_x));
  }
  if (N == 0 || q.heads + k.heads == 0) return;
  const BackwardGrid grid = backward_grid(N);
  const std::size_t rows = scratch_align(static_cast<std::size_t>(grid.blocks) * D * sizeof(float));
  auto* partial = static_cast<char*>(stream_scratch(stream, 2 * rows));
  set[0].partial = reinterpret_cast<float*>(partial);
  set[1].partial = reinterpret_cast<float*>(partial + rows);
  const int threads = kBackwardWarpsPerBlock * 32;
  switch (pairs_of(D)) {
    case 1: qk_norm_rope_backward_kernel<1><<<grid.blocks, threads, 0, stream>>>(set[0], set[1], pos, N, grid.tpb, D, theta); break;
    case 2: qk_norm_rope_backward_kernel<2><<<grid.blocks, threads, 0, stream>>>(set[0], set[1], pos, N, grid.tpb, D, theta); break;
    default: qk_norm_rope_backward_kernel<4><<<grid.blocks, threads, 0, stream>>>(set[0], set[1], pos, N, grid.tpb, D, theta); break;
  }
  GHT_CUDA_CHECK_LAUNCH();
  for (int i = 0; i < 2; ++i) {
    if (in[i]->heads == 0) continue;
    detail::column_reduce_add_kernel<DW><<<detail::grid_for(D, 256), 256, 0, stream>>>(
        in[i]->dw, set[i].partial, grid.blocks, D);
    GHT_CUDA_CHECK_LAUNCH();
  }
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
  GHT_EXPECTS(H > 0, "qk_norm_rope_forward: need H > 0, got H=" + std::to_string(H));
  forward_impl({out, ld_out, rstd, x, ld_x, w, H}, {}, pos, N, D, eps, theta, stream);
}

void qk_norm_rope_forward_qk(const QkNormRopeHeads& q, const QkNormRopeHeads& k,
                             const std::int32_t* pos, std::int64_t N, int D, float eps,
                             double theta, cudaStream_t stream) {
  forward_impl(q, k, pos, N, D, eps, theta, stream);
}

void qk_norm_rope_backward(bf16* dx, std::int64_t ld_dx, float* dw, const bf16* dout,
                           std::int64_t ld_dout, const bf16* x, std::int64_t ld_x, const bf16* w,
                           const float* rstd, const std::int32_t* pos, std::int64_t N, int H,
                           int D, double theta, cudaStream_t stream) {
  GHT_EXPECTS(H > 0, "qk_norm_rope_backward: need H > 0, got H=" + std::to_string(H));
  backward_impl<float>({dx, ld_dx, dw, dout, ld_dout, x, ld_x, w, rstd, H}, {}, pos, N, D, theta,
                       stream);
}

void qk_norm_rope_backward(bf16* dx, std::int64_t ld_dx, bf16* dw, const bf16* dout,
                           std::int64_t ld_dout, const bf16* x, std::int64_t ld_x, const bf16* w,
                           const float* rstd, const std::int32_t* pos, std::int64_t N, int H,
                           int D, double theta, cudaStream_t stream) {
  GHT_EXPECTS(H > 0, "qk_norm_rope_backward: need H > 0, got H=" + std::to_string(H));
  backward_impl<bf16>({dx, ld_dx, dw, dout, ld_dout, x, ld_x, w, rstd, H}, {}, pos, N, D, theta,
                      stream);
}

void qk_norm_rope_backward_qk(const QkNormRopeGradHeads<float>& q,
                              const QkNormRopeGradHeads<float>& k, const std::int32_t* pos,
                              std::int64_t N, int D, double theta, cudaStream_t stream) {
  backward_impl(q, k, pos, N, D, theta, stream);
}
void qk_norm_rope_backward_qk(const QkNormRopeGradHeads<bf16>& q,
                              const QkNormRopeGradHeads<bf16>& k, const std::int32_t* pos,
                              std::int64_t N, int D, double theta, cudaStream_t stream) {
  backward_impl(q, k, pos, N, D, theta, stream);
}

}  // namespace ght::kernels::cuda
