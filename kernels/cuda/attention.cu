// Attention: dispatch between cuDNN SDPA (cudnn-frontend's nodes in cudnn_frontend/, the
// hand-written backend graph in attention_cudnn.cpp) and the straightforward fallback kernels
// below (see attention.hpp).
#include "kernels/cuda/attention.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/scratch.hpp"
#include "tier/cuda_check.hpp"
#include "tier/error.hpp"

namespace ght::kernels::cuda {
namespace {

using detail::bf16;

constexpr int kRowsPerBlock = 8;  // warps per block: queries (forward, dq) or keys (dk, dv)
constexpr int kTile = 32;         // keys (or queries) staged per shared-memory tile

struct Geometry {
  int T, H, KV, D;
  std::int64_t q_row, k_row, v_row, o_row;
  float scale;
};

// Shared-memory row stride of a staged bf16 tile: +2 elements so that lanes reading the same
// column of different rows hit different banks, while rows stay 4-byte aligned (bf16x2 reads).
__host__ __device__ constexpr int padded(int D) { return D + 2; }

__device__ __forceinline__ float dot_smem(const float* a, const bf16* b, int D) {
  float s = 0.0f;
  for (int d = 0; d < D; d += 2) {
    const float2 bv = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(b + d));
    s += a[d] * bv.x + a[d + 1] * bv.y;
  }
  return s;
}

// Cooperative copy of rows [r0, r0 + kTile) of a (T, ·) token-major tensor (head offset applied
// by the caller, row stride `row`) into smem with padded rows; rows >= T are zero.
__device__ void stage_rows(bf16* dst, const bf16* src, std::int64_t row, int r0, int T, int D) {
  const int pairs = D / 2;
  for (int idx = threadIdx.x; idx < kTile * pairs; idx += blockDim.x) {
    const int r = idx / pairs, d = (idx % pairs) * 2;
    __nv_bfloat162 v = __floats2bfloat162_rn(0.0f, 0.0f);
    if (r0 + r < T) v = *reinterpret_cast<const __nv_bfloat162*>(src + (r0 + r) * row + d);
    *reinterpret_cast<__nv_bfloat162*>(dst + r * padded(D) + d) = v;
  }
}

// ---- forward: warp per query ----------------------------------------------------------------
template <int DPL>  // head dims per lane: D <= 32·DPL
__global__ void attention_forward_kernel(bf16* __restrict__ out, float* __restrict__ lse,
                                         const bf16* __restrict__ q, const bf16* __restrict__ k,
                                         const bf16* __restrict__ v,
                                         const std::int32_t* __restrict__ doc, Geometry g) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int D = g.D;
  bf16* ks = reinterpret_cast<bf16*>(smem_raw);
  bf16* vs = ks + kTile * padded(D);
  float* qs = reinterpret_cast<float*>(vs + kTile * padded(D));  // (kRowsPerBlock, D)
  __shared__ std::int32_t kdoc[kTile];
  const int b = blockIdx.z, h = blockIdx.y, kvh = h / (g.H / g.KV);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int i0 = blockIdx.x * kRowsPerBlock, i = i0 + warp;
  const std::int64_t bT = static_cast<std::int64_t>(b) * g.T;
  const bf16* kb = k + bT * g.k_row + static_cast<std::int64_t>(kvh) * D;
  const bf16* vb = v + bT * g.v_row + static_cast<std::int64_t>(kvh) * D;
  if (i < g.T) {
    const bf16* qi = q + (bT + i) * g.q_row + static_cast<std::int64_t>(h) * D;
    for (int d = lane; d < D; d += 32) qs[warp * D + d] = __bfloat162float(qi[d]);
  }
  const std::int32_t my_doc = (doc != nullptr && i < g.T) ? doc[bT + i] : 0;
  float m = -INFINITY, l = 0.0f, o[DPL];
#pragma unroll
  for (int t = 0; t < DPL; ++t) o[t] = 0.0f;
  const int i_last = min(i0 + kRowsPerBlock, g.T) - 1;
  for (int j0 = 0; j0 <= i_last; j0 += kTile) {
    __syncthreads();
    stage_rows(ks, kb, g.k_row, j0, g.T, D);
    stage_rows(vs, vb, g.v_row, j0, g.T, D);
    if (threadIdx.x < kTile)
      kdoc[threadIdx.x] = (doc != nullptr && j0 + threadIdx.x < g.T) ? doc[bT + j0 + threadIdx.x] : 0;
    __syncthreads();
    if (i >= g.T) continue;  // warp-uniform; the warp still joins every __syncthreads
    const int j = j0 + lane;
    const bool valid = j <= i && (doc == nullptr || kdoc[lane] == my_doc);
    const float s = valid ? dot_smem(qs + warp * D, ks + lane * padded(D), D) * g.scale : -INFINITY;
    const float tmax = detail::warp_max(s);
    if (tmax == -INFINITY) continue;
    const float m_new = fmaxf(m, tmax);
    const float corr = expf(m - m_new);
    const float p = valid ? expf(s - m_new) : 0.0f;
    l = l * corr + detail::warp_sum(p);
#pragma unroll
    for (int t = 0; t < DPL; ++t) o[t] *= corr;
    for (int jj = 0; jj < kTile; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
      if (pj == 0.0f) continue;  // uniform across the warp
      const bf16* vr = vs + jj * padded(D);
#pragma unroll
      for (int t = 0; t < DPL; ++t) {
        const int d = lane + 32 * t;
        if (d < D) o[t] += pj * __bfloat162float(vr[d]);
      }
    }
    m = m_new;
  }
  if (i >= g.T) return;
  const float inv = 1.0f / l;
  bf16* oi = out + (bT + i) * g.o_row + static_cast<std::int64_t>(h) * D;
#pragma unroll
  for (int t = 0; t < DPL; ++t) {
    const int d = lane + 32 * t;
    if (d < D) oi[d] = __float2bfloat16(o[t] * inv);
  }
  if (lane == 0) lse[(static_cast<std::int64_t>(b) * g.H + h) * g.T + i] = m + logf(l);
}

// ---- backward 1: dq (warp per query); also stores delta_i = dout_i·out_i ----------------------
template <int DPL>
__global__ void attention_backward_dq_kernel(bf16* __restrict__ dq, float* __restrict__ delta,
                                             const bf16* __restrict__ dout,
                                             const bf16* __restrict__ q, const bf16* __restrict__ k,
                                             const bf16* __restrict__ v,
                                             const bf16* __restrict__ out,
                                             const float* __restrict__ lse,
                                             const std::int32_t* __restrict__ doc, Geometry g) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int D = g.D;
  bf16* ks = reinterpret_cast<bf16*>(smem_raw);
  bf16* vs = ks + kTile * padded(D);
  float* qs = reinterpret_cast<float*>(vs + kTile * padded(D));  // (kRowsPerBlock, D)
  float* dos = qs + kRowsPerBlock * D;                           // (kRowsPerBlock, D)
  __shared__ std::int32_t kdoc[kTile];
  const int b = blockIdx.z, h = blockIdx.y, kvh = h / (g.H / g.KV);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int i0 = blockIdx.x * kRowsPerBlock, i = i0 + warp;
  const std::int64_t bT = static_cast<std::int64_t>(b) * g.T;
  const bf16* kb = k + bT * g.k_row + static_cast<std::int64_t>(kvh) * D;
  const bf16* vb = v + bT * g.v_row + static_cast<std::int64_t>(kvh) * D;
  float di = 0.0f, li = 0.0f;
  std::int32_t my_doc = 0;
  if (i < g.T) {
    const std::int64_t qo = (bT + i) * g.q_row + static_cast<std::int64_t>(h) * D;
    const std::int64_t oo = (bT + i) * g.o_row + static_cast<std::int64_t>(h) * D;
    float part = 0.0f;
    for (int d = lane; d < D; d += 32) {
      qs[warp * D + d] = __bfloat162float(q[qo + d]);
      const float gd = __bfloat162float(dout[oo + d]);
      dos[warp * D + d] = gd;
      part += gd * __bfloat162float(out[oo + d]);
    }
    di = detail::warp_sum(part);
    const std::int64_t li_idx = (static_cast<std::int64_t>(b) * g.H + h) * g.T + i;
    li = lse[li_idx];
    if (lane == 0) delta[li_idx] = di;
    my_doc = doc != nullptr ? doc[bT + i] : 0;
  }
  float acc[DPL];
#pragma unroll
  for (int t = 0; t < DPL; ++t) acc[t] = 0.0f;
  const int i_last = min(i0 + kRowsPerBlock, g.T) - 1;
  for (int j0 = 0; j0 <= i_last; j0 += kTile) {
    __syncthreads();
    stage_rows(ks, kb, g.k_row, j0, g.T, D);
    stage_rows(vs, vb, g.v_row, j0, g.T, D);
    if (threadIdx.x < kTile)
      kdoc[threadIdx.x] = (doc != nullptr && j0 + threadIdx.x < g.T) ? doc[bT + j0 + threadIdx.x] : 0;
    __syncthreads();
    if (i >= g.T) continue;
    const int j = j0 + lane;
    const bool valid = j <= i && (doc == nullptr || kdoc[lane] == my_doc);
    float ds = 0.0f;
    if (valid) {
      const float s = dot_smem(qs + warp * D, ks + lane * padded(D), D) * g.scale;
      const float dp = dot_smem(dos + warp * D, vs + lane * padded(D), D);
      ds = expf(s - li) * (dp - di) * g.scale;
    }
    for (int jj = 0; jj < kTile; ++jj) {
      const float dsj = __shfl_sync(0xffffffffu, ds, jj);
      if (dsj == 0.0f) continue;
      const bf16* kr = ks + jj * padded(D);
#pragma unroll
      for (int t = 0; t < DPL; ++t) {
        const int d = lane + 32 * t;
        if (d < D) acc[t] += dsj * __bfloat162float(kr[d]);
      }
    }
  }
  if (i >= g.T) return;
  bf16* dqi = dq + (bT + i) * g.q_row + static_cast<std::int64_t>(h) * D;
#pragma unroll
  for (int t = 0; t < DPL; ++t) {
    const int d = lane + 32 * t;
    if (d < D) dqi[d] = __float2bfloat16(acc[t]);
  }
}

// ---- backward 2: dk, dv (warp per key, summed over the kv head's query heads in order) ---------
template <int DPL>
__global__ void attention_backward_dkv_kernel(bf16* __restrict__ dk, bf16* __restrict__ dv,
                                              const bf16* __restrict__ dout,
                                              const bf16* __restrict__ q,
                                              const bf16* __restrict__ k,
                                              const bf16* __restrict__ v,
                                              const float* __restrict__ lse,
                                              const float* __restrict__ delta,
                                              const std::int32_t* __restrict__ doc, Geometry g) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int D = g.D;
  bf16* qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* dos = qs + kTile * padded(D);
  float* kf = reinterpret_cast<float*>(dos + kTile * padded(D));  // (kRowsPerBlock, D)
  float* vf = kf + kRowsPerBlock * D;                             // (kRowsPerBlock, D)
  __shared__ std::int32_t qdoc[kTile];
  __shared__ float qlse[kTile], qdelta[kTile];
  const int b = blockIdx.z, kvh = blockIdx.y, rep = g.H / g.KV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int j0 = blockIdx.x * kRowsPerBlock, j = j0 + warp;
  const std::int64_t bT = static_cast<std::int64_t>(b) * g.T;
  std::int32_t my_doc = 0;
  if (j < g.T) {
    const std::int64_t ko = (bT + j) * g.k_row + static_cast<std::int64_t>(kvh) * D;
    const std::int64_t vo = (bT + j) * g.v_row + static_cast<std::int64_t>(kvh) * D;
    for (int d = lane; d < D; d += 32) {
      kf[warp * D + d] = __bfloat162float(k[ko + d]);
      vf[warp * D + d] = __bfloat162float(v[vo + d]);
    }
    my_doc = doc != nullptr ? doc[bT + j] : 0;
  }
  float ak[DPL], av[DPL];
#pragma unroll
  for (int t = 0; t < DPL; ++t) ak[t] = av[t] = 0.0f;
  const int first = (j0 / kTile) * kTile;  // queries before the block's first key see none of it
  for (int h = kvh * rep; h < (kvh + 1) * rep; ++h) {
    const bf16* qb = q + bT * g.q_row + static_cast<std::int64_t>(h) * D;
    const bf16* gb = dout + bT * g.o_row + static_cast<std::int64_t>(h) * D;
    const std::int64_t stat = (static_cast<std::int64_t>(b) * g.H + h) * g.T;
    for (int i0 = first; i0 < g.T; i0 += kTile) {
      __syncthreads();
      stage_rows(qs, qb, g.q_row, i0, g.T, D);
      stage_rows(dos, gb, g.o_row, i0, g.T, D);
      if (threadIdx.x < kTile) {
        const int ii = i0 + threadIdx.x;
        qdoc[threadIdx.x] = (doc != nullptr && ii < g.T) ? doc[bT + ii] : 0;
        qlse[threadIdx.x] = ii < g.T ? lse[stat + ii] : 0.0f;
        qdelta[threadIdx.x] = ii < g.T ? delta[stat + ii] : 0.0f;
      }
      __syncthreads();
      if (j >= g.T) continue;
      const int i = i0 + lane;
      const bool valid = i >= j && i < g.T && (doc == nullptr || qdoc[lane] == my_doc);
      float p = 0.0f, ds = 0.0f;
      if (valid) {
        const float s = dot_smem(kf + warp * D, qs + lane * padded(D), D) * g.scale;
        const float dp = dot_smem(vf + warp * D, dos + lane * padded(D), D);
        p = expf(s - qlse[lane]);
        ds = p * (dp - qdelta[lane]) * g.scale;
      }
      for (int ii = 0; ii < kTile; ++ii) {
        const float pi = __shfl_sync(0xffffffffu, p, ii);
        const float dsi = __shfl_sync(0xffffffffu, ds, ii);
        if (pi == 0.0f && dsi == 0.0f) continue;
        const bf16* qr = qs + ii * padded(D);
        const bf16* gr = dos + ii * padded(D);
#pragma unroll
        for (int t = 0; t < DPL; ++t) {
          const int d = lane + 32 * t;
          if (d < D) {
            av[t] += pi * __bfloat162float(gr[d]);
            ak[t] += dsi * __bfloat162float(qr[d]);
          }
        }
      }
    }
  }
  if (j >= g.T) return;
  bf16* dkj = dk + (bT + j) * g.k_row + static_cast<std::int64_t>(kvh) * D;
  bf16* dvj = dv + (bT + j) * g.v_row + static_cast<std::int64_t>(kvh) * D;
#pragma unroll
  for (int t = 0; t < DPL; ++t) {
    const int d = lane + 32 * t;
    if (d < D) {
      dkj[d] = __float2bfloat16(ak[t]);
      dvj[d] = __float2bfloat16(av[t]);
    }
  }
}

AttentionShape normalised(const AttentionShape& s) {
  AttentionShape n = s;
  const std::int64_t qd = static_cast<std::int64_t>(s.H) * s.D, kd = static_cast<std::int64_t>(s.KV) * s.D;
  if (n.q_row == 0) n.q_row = qd;
  if (n.o_row == 0) n.o_row = qd;
  if (n.k_row == 0) n.k_row = kd;
  if (n.v_row == 0) n.v_row = kd;
  return n;
}

void check(const AttentionShape& s, const char* op) {
  GHT_EXPECTS(s.B >= 0 && s.T >= 0 && s.H > 0 && s.KV > 0 && s.D > 0,
              std::string(op) + ": need B, T >= 0 and H, KV, D > 0, got B=" + std::to_string(s.B) +
                  " T=" + std::to_string(s.T) + " H=" + std::to_string(s.H) + " KV=" +
                  std::to_string(s.KV) + " D=" + std::to_string(s.D));
  GHT_EXPECTS(s.H % s.KV == 0, std::string(op) + ": H=" + std::to_string(s.H) +
                                   " is not a multiple of KV=" + std::to_string(s.KV));
  const std::int64_t qd = static_cast<std::int64_t>(s.H) * s.D, kd = static_cast<std::int64_t>(s.KV) * s.D;
  GHT_EXPECTS(s.q_row >= qd && s.o_row >= qd && s.k_row >= kd && s.v_row >= kd,
              std::string(op) + ": a row stride is smaller than the packed row");
}

void check_fallback(const AttentionShape& s, const char* op) {
  GHT_EXPECTS(s.D % 2 == 0 && s.D <= 256, std::string(op) + " (fallback): head_dim D=" +
                                              std::to_string(s.D) + " must be even and <= 256");
  GHT_EXPECTS(s.q_row % 2 == 0 && s.k_row % 2 == 0 && s.v_row % 2 == 0 && s.o_row % 2 == 0,
              std::string(op) + " (fallback): row strides must be even (bf16x2 loads)");
}

Geometry geometry(const AttentionShape& s) {
  return Geometry{s.T, s.H, s.KV, s.D, s.q_row, s.k_row, s.v_row, s.o_row,
                  1.0f / std::sqrt(static_cast<float>(s.D))};
}

template <typename Kernel>
void set_smem(Kernel kernel, std::size_t bytes) {
  if (bytes > 48 * 1024) {
    GHT_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(bytes)));
  }
}

template <int DPL>
void fallback_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                      const std::int32_t* doc, const AttentionShape& s, cudaStream_t stream) {
  const Geometry g = geometry(s);
  const std::size_t smem = 2 * kTile * padded(s.D) * sizeof(bf16) + kRowsPerBlock * s.D * sizeof(float);
  set_smem(attention_forward_kernel<DPL>, smem);
  const dim3 grid(static_cast<unsigned>(detail::ceil_div(s.T, kRowsPerBlock)), s.H, s.B);
  attention_forward_kernel<DPL><<<grid, kRowsPerBlock * 32, smem, stream>>>(out, lse, q, k, v, doc, g);
  GHT_CUDA_CHECK_LAUNCH();
}

template <int DPL>
void fallback_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q,
                       const bf16* k, const bf16* v, const bf16* out, const float* lse,
                       const std::int32_t* doc, const AttentionShape& s, cudaStream_t stream) {
  const Geometry g = geometry(s);
  auto* delta = static_cast<float*>(stream_scratch(
      stream, static_cast<std::size_t>(s.B) * s.H * s.T * sizeof(float)));
  const std::size_t smem = 2 * kTile * padded(s.D) * sizeof(bf16) + 2 * kRowsPerBlock * s.D * sizeof(float);
  set_smem(attention_backward_dq_kernel<DPL>, smem);
  set_smem(attention_backward_dkv_kernel<DPL>, smem);
  const unsigned tiles = static_cast<unsigned>(detail::ceil_div(s.T, kRowsPerBlock));
  attention_backward_dq_kernel<DPL><<<dim3(tiles, s.H, s.B), kRowsPerBlock * 32, smem, stream>>>(
      dq, delta, dout, q, k, v, out, lse, doc, g);
  GHT_CUDA_CHECK_LAUNCH();
  attention_backward_dkv_kernel<DPL><<<dim3(tiles, s.KV, s.B), kRowsPerBlock * 32, smem, stream>>>(
      dk, dv, dout, q, k, v, lse, delta, doc, g);
  GHT_CUDA_CHECK_LAUNCH();
}

// The cuDNN paths `impl` asks for, in order: cudnn-frontend (cudnn, automatic; when built), then
// the backend graph. fe(throw)/be(throw) run one path and say whether it ran. Returns the path
// that ran, or fallback when none did (only for automatic: a requested path throws instead).
template <class Frontend, class Backend>
AttentionImpl run_cudnn(AttentionImpl impl, Frontend&& fe, Backend&& be) {
  const bool frontend = impl != AttentionImpl::cudnn_backend && detail::cudnn_frontend_attention_compiled();
  if (frontend && fe(impl == AttentionImpl::cudnn)) return AttentionImpl::cudnn;
  if (be(impl != AttentionImpl::automatic)) return AttentionImpl::cudnn_backend;
  return AttentionImpl::fallback;
}

void require_cudnn_shape(bool ok, AttentionImpl impl, const AttentionShape& s, const char* op) {
  GHT_EXPECTS(ok || impl == AttentionImpl::automatic,
              std::string(op) + ": the cuDNN paths need no doc_ids, D <= 128 and D, row strides "
                                "multiples of 8 (D=" + std::to_string(s.D) + ")");
}

int dims_per_lane(int D) {
  const int dpl = static_cast<int>(detail::ceil_div(D, 32));
  return dpl <= 1 ? 1 : dpl <= 2 ? 2 : dpl <= 4 ? 4 : 8;
}

}  // namespace

std::string_view to_string(AttentionImpl impl) noexcept {
  switch (impl) {
    case AttentionImpl::automatic: return "automatic";
    case AttentionImpl::cudnn: return "cudnn";
    case AttentionImpl::fallback: return "fallback";
    case AttentionImpl::cudnn_backend: return "cudnn_backend";
  }
  return "?";
}

bool cudnn_attention_supported(const AttentionShape& shape, bool has_doc_ids) {
  const AttentionShape s = normalised(shape);
  return detail::cudnn_attention_compiled() && !has_doc_ids && s.D % 8 == 0 && s.D <= 128 &&
         s.q_row % 8 == 0 && s.k_row % 8 == 0 && s.v_row % 8 == 0 && s.o_row % 8 == 0 &&
         s.T > 0 && s.B > 0;
}

AttentionImpl attention_forward(bf16* out, float* lse, const bf16* q, const bf16* k, const bf16* v,
                                const std::int32_t* doc_ids, const AttentionShape& shape,
                                AttentionImpl impl, cudaStream_t stream) {
  const AttentionShape s = normalised(shape);
  check(s, "attention_forward");
  if (s.B == 0 || s.T == 0) return impl == AttentionImpl::automatic ? AttentionImpl::fallback : impl;
  if (impl != AttentionImpl::fallback) {
    const bool ok = cudnn_attention_supported(s, doc_ids != nullptr);
    require_cudnn_shape(ok, impl, s, "attention_forward");
    if (ok) {
      const AttentionImpl ran = run_cudnn(
          impl,
          [&](bool t) { return detail::cudnn_frontend_attention_forward(out, lse, q, k, v, s, stream, t); },
          [&](bool t) { return detail::cudnn_attention_forward(out, lse, q, k, v, s, stream, t); });
      if (ran != AttentionImpl::fallback) return ran;
    }
  }
  check_fallback(s, "attention_forward");
  switch (dims_per_lane(s.D)) {
    case 1: fallback_forward<1>(out, lse, q, k, v, doc_ids, s, stream); break;
    case 2: fallback_forward<2>(out, lse, q, k, v, doc_ids, s, stream); break;
    case 4: fallback_forward<4>(out, lse, q, k, v, doc_ids, s, stream); break;
    default: fallback_forward<8>(out, lse, q, k, v, doc_ids, s, stream); break;
  }
  return AttentionImpl::fallback;
}

AttentionImpl attention_backward(bf16* dq, bf16* dk, bf16* dv, const bf16* dout, const bf16* q,
                                 const bf16* k, const bf16* v, const bf16* out, const float* lse,
                                 const std::int32_t* doc_ids, const AttentionShape& shape,
                                 AttentionImpl impl, cudaStream_t stream) {
  const AttentionShape s = normalised(shape);
  check(s, "attention_backward");
  if (s.B == 0 || s.T == 0) return impl == AttentionImpl::automatic ? AttentionImpl::fallback : impl;
  if (impl != AttentionImpl::fallback) {
    const bool ok = cudnn_attention_supported(s, doc_ids != nullptr);
    require_cudnn_shape(ok, impl, s, "attention_backward");
    if (ok) {
      const AttentionImpl ran = run_cudnn(
          impl,
          [&](bool t) {
            return detail::cudnn_frontend_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s,
                                                             stream, t);
          },
          [&](bool t) {
            return detail::cudnn_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, s, stream, t);
          });
      if (ran != AttentionImpl::fallback) return ran;
    }
  }
  check_fallback(s, "attention_backward");
  switch (dims_per_lane(s.D)) {
    case 1: fallback_backward<1>(dq, dk, dv, dout, q, k, v, out, lse, doc_ids, s, stream); break;
    case 2: fallback_backward<2>(dq, dk, dv, dout, q, k, v, out, lse, doc_ids, s, stream); break;
    case 4: fallback_backward<4>(dq, dk, dv, dout, q, k, v, out, lse, doc_ids, s, stream); break;
    default: fallback_backward<8>(dq, dk, dv, dout, q, k, v, out, lse, doc_ids, s, stream); break;
  }
  return AttentionImpl::fallback;
}

void release_attention_resources() { detail::cudnn_attention_release(); }

}  // namespace ght::kernels::cuda
