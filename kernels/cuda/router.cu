// MoE router: logits GEMM, softmax + top-k + renorm + loss partials, and the backward
// (see router.hpp).
#include "kernels/cuda/router.hpp"

#include <algorithm>
#include <climits>
#include <string>

#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/detail/counting_sort.cuh"
#include "kernels/cuda/gemm.hpp"
#include "kernels/cuda/scratch.hpp"
#include "tier/cuda_check.hpp"
#include "tier/error.hpp"

namespace ght::kernels::cuda {
namespace {

using detail::bf16;

constexpr int kWarps = 8;        // warps (tokens in flight) per block
constexpr int kMaxExperts = 256;
constexpr int kMaxBlocks = 256;  // fixed grid cap: the partial sums depend only on N

// Per-lane view of one token's logits: expert e = lane + 32·j lives in slot j of lane (e % 32).
template <int EPL>
__device__ __forceinline__ float token_lse(const float (&l)[EPL], int E) {
  const int lane = threadIdx.x % 32;
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < EPL; ++j)
    if (lane + 32 * j < E) mx = fmaxf(mx, l[j]);
  mx = detail::warp_max(mx);
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < EPL; ++j)
    if (lane + 32 * j < E) s += expf(l[j] - mx);
  s = detail::warp_sum(s);
  return mx + logf(s);
}

// Block b routes the contiguous tokens [b·tpb, min((b+1)·tpb, N)), one warp per token in turn:
// probs, top-k ids and weights. The block adds its tokens' probabilities per expert and lse² into
// one partial row each (fixed order), and counts its (t, k) selections per expert: tile_counts
// (blocks, E) is the tile histogram of the assignments [b·tpb·K, ...) that the permutation's
// scatter starts from.
template <int EPL>
__global__ void router_forward_kernel(const float* __restrict__ logits, float* __restrict__ probs,
                                      std::int32_t* __restrict__ topk_idx,
                                      float* __restrict__ topk_w, float* __restrict__ psum_part,
                                      float* __restrict__ z_part, int* __restrict__ tile_counts,
                                      std::int64_t N, std::int64_t tpb, int E, int K,
                                      bool norm_topk_prob) {
  __shared__ float sp[kWarps][kMaxExperts];
  __shared__ float sz[kWarps];
  __shared__ int sc[kMaxExperts];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int e = threadIdx.x; e < E; e += blockDim.x) sc[e] = 0;
  __syncthreads();
  float pacc[EPL];
#pragma unroll
  for (int j = 0; j < EPL; ++j) pacc[j] = 0.0f;
  float zacc = 0.0f;
  const std::int64_t t0 = static_cast<std::int64_t>(blockIdx.x) * tpb;
  const std::int64_t t1 = t0 + tpb < N ? t0 + tpb : N;
  for (std::int64_t t = t0 + warp; t < t1; t += kWarps) {
    float l[EPL], p[EPL], cand[EPL];
#pragma unroll
    for (int j = 0; j < EPL; ++j) {
      const int e = lane + 32 * j;
      l[j] = e < E ? logits[t * E + e] : 0.0f;
    }
    const float lse = token_lse<EPL>(l, E);
#pragma unroll
    for (int j = 0; j < EPL; ++j) {
      const int e = lane + 32 * j;
      p[j] = e < E ? expf(l[j] - lse) : 0.0f;
      cand[j] = e < E ? p[j] : -1.0f;  // probabilities are >= 0, so -1 marks "not a candidate"
      if (e < E) {
        probs[t * E + e] = p[j];
        pacc[j] += p[j];
      }
    }
    zacc += lse * lse;
    // Top-k by repeated arg-max; ties go to the lower expert index (as the CPU's strict '>').
    float sel_sum = 0.0f, my_w = 0.0f;
    int my_idx = 0;
    for (int k = 0; k < K; ++k) {
      float bv = -2.0f;
      int be = INT_MAX;
#pragma unroll
      for (int j = 0; j < EPL; ++j) {
        if (cand[j] > bv) {  // ascending e within the lane: strict '>' keeps the first
          bv = cand[j];
          be = lane + 32 * j;
        }
      }
#pragma unroll
      for (int o = 16; o > 0; o /= 2) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oe = __shfl_xor_sync(0xffffffffu, be, o);
        if (ov > bv || (ov == bv && oe < be)) {
          bv = ov;
          be = oe;
        }
      }
      if (be % 32 == lane) {
#pragma unroll
        for (int j = 0; j < EPL; ++j)
          if (lane + 32 * j == be) cand[j] = -1.0f;
      }
      if (lane == k) {
        my_w = bv;
        my_idx = be;
      }
      if (lane == 0) atomicAdd(&sc[be], 1);
      sel_sum += bv;
    }
    if (lane < K) {
      topk_idx[t * K + lane] = my_idx;
      topk_w[t * K + lane] = norm_topk_prob ? my_w / sel_sum : my_w;
    }
  }
#pragma unroll
  for (int j = 0; j < EPL; ++j)
    if (lane + 32 * j < E) sp[warp][lane + 32 * j] = pacc[j];
  if (lane == 0) sz[warp] = zacc;
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    float s = 0.0f;
    for (int w = 0; w < kWarps; ++w) s += sp[w][e];
    psum_part[static_cast<std::int64_t>(blockIdx.x) * E + e] = s;
    tile_counts[static_cast<std::int64_t>(blockIdx.x) * E + e] = sc[e];
  }
  if (threadIdx.x == 0) {
    float s = 0.0f;
    for (int w = 0; w < kWarps; ++w) s += sz[w];
    z_part[blockIdx.x] = s;
  }
}

// One block, thread e per expert (blockDim = E rounded up to 32): c_e and P_e summed over the
// blocks in order, aux = E·sum_e (c_e/N)·(P_e/N), z = sum_b z_part[b] / N; optionally the counts
// c_e and, with `offsets`, the permutation plan's exclusive scan: offsets (E+1), and every
// tile_counts[b][e] replaced by the first row of (tile b, expert e).
__global__ void router_finish_kernel(RouterLossesDevice* __restrict__ losses,
                                     const float* __restrict__ psum_part,
                                     const float* __restrict__ z_part, int* __restrict__ tile_counts,
                                     int blocks, std::int64_t N, int E,
                                     std::int32_t* __restrict__ expert_counts,
                                     std::int32_t* __restrict__ offsets) {
  __shared__ float red[32];
  __shared__ int scan[2][kMaxExperts];
  const int e = threadIdx.x;
  const float n = static_cast<float>(N);
  int total = 0;
  float P = 0.0f;
  if (e < E) {
    for (int b = 0; b < blocks; ++b) {
      total += tile_counts[static_cast<std::int64_t>(b) * E + e];
      P += psum_part[static_cast<std::int64_t>(b) * E + e];
    }
  }
  const float term = e < E ? (static_cast<float>(total) / n) * (P / n) : 0.0f;
  const float aux = detail::block_sum(term, red);
  if (threadIdx.x == 0) {
    float z = 0.0f;
    for (int b = 0; b < blocks; ++b) z += z_part[b];
    losses->aux = static_cast<float>(E) * aux;
    losses->z = z / n;
  }
  if (expert_counts != nullptr && e < E) expert_counts[e] = total;
  if (offsets == nullptr) return;
  detail::scan_offsets(total, tile_counts, blocks, E, offsets, &scan[0][0]);
}

// 16 warps: with at most 256 tiles, enough rows in flight for the gather.
constexpr int kScatterThreads = 512;

// Block b places the assignments of its tokens [b·tpb, ...) (detail::place_round, in
// rounds of 512 from the tile's first rows) and gathers their rows: xp[r] = x[t], warp per row
// (no gather when xp is null).
template <int VEC>
__global__ void route_scatter_gather_kernel(const std::int32_t* __restrict__ idx, std::int64_t N,
                                            std::int64_t tpb, int K, int E,
                                            const int* __restrict__ base,
                                            std::int32_t* __restrict__ src_token,
                                            std::int32_t* __restrict__ dst_row,
                                            bf16* __restrict__ xp, const bf16* __restrict__ x,
                                            int C) {
  extern __shared__ int smem[];
  int* running = smem;                                 // (E)
  int* warp_hist = smem + E;                           // (kScatterThreads / 32, E)
  int* round_row = warp_hist + (kScatterThreads / 32) * E;  // (kScatterThreads)
  const int warp = threadIdx.x / 32;
  for (int e = threadIdx.x; e < E; e += blockDim.x)
    running[e] = base[static_cast<std::int64_t>(blockIdx.x) * E + e];
  const std::int64_t t0 = static_cast<std::int64_t>(blockIdx.x) * tpb;
  const std::int64_t a0 = t0 * K, a1 = (t0 + tpb < N ? t0 + tpb : N) * K;
  for (std::int64_t r0 = a0; r0 < a1; r0 += kScatterThreads) {
    const int row = detail::place_round<kScatterThreads>(idx, r0 + threadIdx.x, a1, K, E, running,
                                                         warp_hist, src_token, dst_row);
    if (xp == nullptr) continue;  // the same for the whole block: its barriers stay matched
    round_row[threadIdx.x] = row;
    __syncthreads();
    const int in_round = static_cast<int>(a1 - r0 < kScatterThreads ? a1 - r0 : kScatterThreads);
    for (int i = warp; i < in_round; i += kScatterThreads / 32) {
      const int row = round_row[i];
      if (row >= 0) detail::copy_row<VEC>(xp + static_cast<std::int64_t>(row) * C, x + (r0 + i) / K * C, C);
    }
    __syncthreads();  // round_row is rewritten by the next round
  }
}

__global__ void count_experts_kernel(const std::int32_t* __restrict__ idx, std::int64_t n, int E,
                                     int* __restrict__ counts) {
  __shared__ int sc[kMaxExperts];
  for (int e = threadIdx.x; e < E; e += blockDim.x) sc[e] = 0;
  __syncthreads();
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const int e = idx[i];
    if (e >= 0 && e < E) atomicAdd(&sc[e], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x)
    if (sc[e] != 0) atomicAdd(&counts[e], sc[e]);
}

// One warp per token: dlogits = p·(dp − p·dp) + z_grad·2·lse/N·p with
// dp_e = aux_grad·E·c_e/N² + (top-k contribution).
template <int EPL>
__global__ void router_backward_kernel(bf16* __restrict__ dlogits, const float* __restrict__ dtopk_w,
                                       float aux_grad, float z_grad,
                                       const float* __restrict__ logits,
                                       const float* __restrict__ probs,
                                       const std::int32_t* __restrict__ topk_idx,
                                       const float* __restrict__ topk_w,
                                       const int* __restrict__ counts, std::int64_t N, int E, int K,
                                       bool norm_topk_prob) {
  __shared__ float sdp[kWarps][kMaxExperts];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * kWarps + warp;
  if (t >= N) return;
  const float n = static_cast<float>(N);
  float l[EPL], p[EPL];
#pragma unroll
  for (int j = 0; j < EPL; ++j) {
    const int e = lane + 32 * j;
    l[j] = e < E ? logits[t * E + e] : 0.0f;
    p[j] = e < E ? probs[t * E + e] : 0.0f;
    if (e < E) sdp[warp][e] = aux_grad * static_cast<float>(E) * static_cast<float>(counts[e]) / (n * n);
  }
  __syncwarp();
  if (dtopk_w != nullptr) {
    float g = 0.0f, w = 0.0f, ps = 0.0f;
    int e = 0;
    if (lane < K) {
      g = dtopk_w[t * K + lane];
      e = topk_idx[t * K + lane];
      w = topk_w[t * K + lane];
      ps = probs[t * E + e];
    }
    if (norm_topk_prob) {
      // w_k = p_k / S with S = sum of the selected p: dp_k = (g_k − sum_j g_j·w_j) / S
      const float s = detail::warp_sum(ps);
      const float gw = detail::warp_sum(g * w);
      if (lane < K) sdp[warp][e] += (g - gw) / s;  // top-k ids are distinct: no conflicts
    } else {
      if (lane < K) sdp[warp][e] += g;
    }
  }
  __syncwarp();
  float dp[EPL];
  float pdp = 0.0f;
#pragma unroll
  for (int j = 0; j < EPL; ++j) {
    const int e = lane + 32 * j;
    dp[j] = e < E ? sdp[warp][e] : 0.0f;
    pdp += p[j] * dp[j];
  }
  pdp = detail::warp_sum(pdp);
  const float lse = token_lse<EPL>(l, E);
  const float zc = z_grad * 2.0f * lse / n;
#pragma unroll
  for (int j = 0; j < EPL; ++j) {
    const int e = lane + 32 * j;
    if (e < E) dlogits[t * E + e] = __float2bfloat16(p[j] * (dp[j] - pdp) + zc * p[j]);
  }
}

void check(const char* op, std::int64_t N, int C, int E, int K) {
  GHT_EXPECTS(N >= 0 && C > 0, std::string(op) + ": need N >= 0 and C > 0, got N=" +
                                   std::to_string(N) + " C=" + std::to_string(C));
  GHT_EXPECTS(E >= 1 && E <= kMaxExperts, std::string(op) + ": experts E=" + std::to_string(E) +
                                              " must be in [1, " + std::to_string(kMaxExperts) + "]");
  GHT_EXPECTS(K >= 1 && K <= std::min(E, 32), std::string(op) + ": top_k (" + std::to_string(K) +
                                                  ") must be in [1, min(experts, 32)]");
}

int experts_per_lane(int E) {
  const int epl = static_cast<int>(detail::ceil_div(E, 32));
  return epl <= 1 ? 1 : epl <= 2 ? 2 : epl <= 4 ? 4 : 8;
}

template <typename DW>
void backward_impl(bf16* dx, DW* dwr, const float* dtopk_w, float aux_grad, float z_grad,
                   const float* logits, const float* probs, const std::int32_t* topk_idx,
                   const float* topk_w, const bf16* x, const bf16* wr, std::int64_t N, int C,
                   int E, int K, bool norm_topk_prob, cudaStream_t stream) {
  check("router_backward", N, C, E, K);
  if (N == 0) return;
  const std::size_t counts_bytes = scratch_align(static_cast<std::size_t>(E) * sizeof(int));
  auto* base = static_cast<char*>(
      stream_scratch(stream, counts_bytes + static_cast<std::size_t>(N) * E * sizeof(bf16)));
  auto* counts = reinterpret_cast<int*>(base);
  auto* dlogits = reinterpret_cast<bf16*>(base + counts_bytes);
  GHT_CUDA_TRY(cudaMemsetAsync(counts, 0, static_cast<std::size_t>(E) * sizeof(int), stream));
  count_experts_kernel<<<detail::grid_for(N * K, 256, 256), 256, 0, stream>>>(topk_idx, N * K, E,
                                                                              counts);
  GHT_CUDA_CHECK_LAUNCH();
  const auto grid = static_cast<unsigned>(detail::ceil_div(N, kWarps));
  switch (experts_per_lane(E)) {
    case 1:
      router_backward_kernel<1><<<grid, kWarps * 32, 0, stream>>>(dlogits, dtopk_w, aux_grad, z_grad, logits, probs, topk_idx, topk_w, counts, N, E, K, norm_topk_prob);
      break;
    case 2:
      router_backward_kernel<2><<<grid, kWarps * 32, 0, stream>>>(dlogits, dtopk_w, aux_grad, z_grad, logits, probs, topk_idx, topk_w, counts, N, E, K, norm_topk_prob);
      break;
    case 4:
      router_backward_kernel<4><<<grid, kWarps * 32, 0, stream>>>(dlogits, dtopk_w, aux_grad, z_grad, logits, probs, topk_idx, topk_w, counts, N, E, K, norm_topk_prob);
      break;
    default:
      router_backward_kernel<8><<<grid, kWarps * 32, 0, stream>>>(dlogits, dtopk_w, aux_grad, z_grad, logits, probs, topk_idx, topk_w, counts, N, E, K, norm_topk_prob);
      break;
  }
  GHT_CUDA_CHECK_LAUNCH();
  // dx (N, C) += dlogits (N, E) · Wr (E, C)
  GemmArgs g;
  g.m = N;
  g.n = C;
  g.k = E;
  g.a = dlogits;
  g.b = wr;
  g.c = dx;
  g.c_type = DType::bf16;
  g.beta = 1.0f;
  gemm(g, stream);
  // dWr (E, C) += dlogits^T (E, N) · x (N, C)
  GemmArgs h;
  h.m = E;
  h.n = C;
  h.k = N;
  h.a = dlogits;
  h.trans_a = true;
  h.b = x;
  h.c = dwr;
  h.c_type = sizeof(DW) == 4 ? DType::f32 : DType::bf16;
  h.beta = 1.0f;
  gemm(h, stream);
}

// The routing grid: blocks of kWarps warps over contiguous ranges of tpb tokens. Both depend
// only on N, and so do the partial sums (deterministic).
struct RouteGrid {
  int blocks;
  std::int64_t tpb;
};
RouteGrid route_grid(std::int64_t N) {
  const std::int64_t b = std::min<std::int64_t>(detail::ceil_div(N, kWarps), kMaxBlocks);
  const std::int64_t tpb = detail::ceil_div(N, b);
  return {static_cast<int>(detail::ceil_div(N, tpb)), tpb};
}

// The logits GEMM, router_forward_kernel and router_finish_kernel (N > 0). Returns the tile
// histogram, or with `offsets` the tiles' first rows, in the stream scratch (valid until the
// next scratch request on `stream`).
const int* route(float* logits, float* probs, std::int32_t* topk_idx, float* topk_w,
                 RouterLossesDevice* losses, std::int32_t* expert_counts, std::int32_t* offsets,
                 const bf16* x, const bf16* wr, std::int64_t N, int C, int E, int K,
                 bool norm_topk_prob, const RouteGrid& grid, cudaStream_t stream) {
  // logits (N, E) = x (N, C) · Wr (E, C)^T, fp32 output
  GemmArgs g;
  g.m = N;
  g.n = E;
  g.k = C;
  g.a = x;
  g.b = wr;
  g.trans_b = true;
  g.c = logits;
  g.c_type = DType::f32;
  gemm(g, stream);

  const int blocks = grid.blocks;
  const std::size_t part_bytes = scratch_align(static_cast<std::size_t>(blocks) * E * sizeof(float));
  const std::size_t z_bytes = scratch_align(static_cast<std::size_t>(blocks) * sizeof(float));
  const std::size_t cnt_bytes = scratch_align(static_cast<std::size_t>(blocks) * E * sizeof(int));
  auto* base = static_cast<char*>(stream_scratch(stream, part_bytes + z_bytes + cnt_bytes));
  auto* psum_part = reinterpret_cast<float*>(base);
  auto* z_part = reinterpret_cast<float*>(base + part_bytes);
  auto* tile_counts = reinterpret_cast<int*>(base + part_bytes + z_bytes);
  const std::int64_t tpb = grid.tpb;
  switch (experts_per_lane(E)) {
    case 1:
      router_forward_kernel<1><<<blocks, kWarps * 32, 0, stream>>>(logits, probs, topk_idx, topk_w, psum_part, z_part, tile_counts, N, tpb, E, K, norm_topk_prob);
      break;
    case 2:
      router_forward_kernel<2><<<blocks, kWarps * 32, 0, stream>>>(logits, probs, topk_idx, topk_w, psum_part, z_part, tile_counts, N, tpb, E, K, norm_topk_prob);
      break;
    case 4:
      router_forward_kernel<4><<<blocks, kWarps * 32, 0, stream>>>(logits, probs, topk_idx, topk_w, psum_part, z_part, tile_counts, N, tpb, E, K, norm_topk_prob);
      break;
    default:
      router_forward_kernel<8><<<blocks, kWarps * 32, 0, stream>>>(logits, probs, topk_idx, topk_w, psum_part, z_part, tile_counts, N, tpb, E, K, norm_topk_prob);
      break;
  }
  GHT_CUDA_CHECK_LAUNCH();
  const int threads = static_cast<int>(detail::ceil_div(E, 32) * 32);
  router_finish_kernel<<<1, threads, 0, stream>>>(losses, psum_part, z_part, tile_counts, blocks, N,
                                                  E, expert_counts, offsets);
  GHT_CUDA_CHECK_LAUNCH();
  return tile_counts;
}

}  // namespace

void router_forward(float* logits, float* probs, std::int32_t* topk_idx, float* topk_w,
                    RouterLossesDevice* losses, std::int32_t* expert_counts, const bf16* x,
                    const bf16* wr, std::int64_t N, int C, int E, int K, bool norm_topk_prob,
                    cudaStream_t stream) {
  check("router_forward", N, C, E, K);
  if (N == 0) {
    GHT_CUDA_TRY(cudaMemsetAsync(losses, 0, sizeof(RouterLossesDevice), stream));
    if (expert_counts != nullptr)
      GHT_CUDA_TRY(cudaMemsetAsync(expert_counts, 0, static_cast<std::size_t>(E) * sizeof(int), stream));
    return;
  }
  (void)route(logits, probs, topk_idx, topk_w, losses, expert_counts, nullptr, x, wr, N, C, E, K,
              norm_topk_prob, route_grid(N), stream);
}

void router_route_forward(float* logits, float* probs, std::int32_t* topk_idx, float* topk_w,
                          RouterLossesDevice* losses, const RoutePermutation& perm, const bf16* x,
                          const bf16* wr, std::int64_t N, int C, int E, int K, bool norm_topk_prob,
                          cudaStream_t stream) {
  check("router_route_forward", N, C, E, K);
  GHT_EXPECTS(N * K <= 0x7fffffff, "router_route_forward: N·K=" + std::to_string(N * K) +
                                       " exceeds int32 row ids");
  GHT_EXPECTS(perm.expert_offsets != nullptr && perm.src_token != nullptr && perm.dst_row != nullptr,
              "router_route_forward: expert_offsets, src_token and dst_row are required");
  if (N == 0) {
    GHT_CUDA_TRY(cudaMemsetAsync(losses, 0, sizeof(RouterLossesDevice), stream));
    GHT_CUDA_TRY(cudaMemsetAsync(perm.expert_offsets, 0,
                                 (static_cast<std::size_t>(E) + 1) * sizeof(std::int32_t), stream));
    return;
  }
  const RouteGrid grid = route_grid(N);
  const int* bases = route(logits, probs, topk_idx, topk_w, losses, nullptr, perm.expert_offsets,
                           x, wr, N, C, E, K, norm_topk_prob, grid, stream);
  const std::size_t smem =
      (static_cast<std::size_t>(E) * (1 + kScatterThreads / 32) + kScatterThreads) * sizeof(int);
  if (C % 8 == 0 && detail::aligned16(x, perm.xp)) {
    route_scatter_gather_kernel<8><<<grid.blocks, kScatterThreads, smem, stream>>>(
        topk_idx, N, grid.tpb, K, E, bases, perm.src_token, perm.dst_row, perm.xp, x, C);
  } else {
    route_scatter_gather_kernel<1><<<grid.blocks, kScatterThreads, smem, stream>>>(
        topk_idx, N, grid.tpb, K, E, bases, perm.src_token, perm.dst_row, perm.xp, x, C);
  }
  GHT_CUDA_CHECK_LAUNCH();
}

void router_backward(bf16* dx, float* dwr, const float* dtopk_w, float aux_grad, float z_grad,
                     const float* logits, const float* probs, const std::int32_t* topk_idx,
                     const float* topk_w, const bf16* x, const bf16* wr, std::int64_t N, int C,
                     int E, int K, bool norm_topk_prob, cudaStream_t stream) {
  backward_impl(dx, dwr, dtopk_w, aux_grad, z_grad, logits, probs, topk_idx, topk_w, x, wr, N, C,
                E, K, norm_topk_prob, stream);
}

void router_backward(bf16* dx, bf16* dwr, const float* dtopk_w, float aux_grad, float z_grad,
                     const float* logits, const float* probs, const std::int32_t* topk_idx,
                     const float* topk_w, const bf16* x, const bf16* wr, std::int64_t N, int C,
                     int E, int K, bool norm_topk_prob, cudaStream_t stream) {
  backward_impl(dx, dwr, dtopk_w, aux_grad, z_grad, logits, probs, topk_idx, topk_w, x, wr, N, C,
                E, K, norm_topk_prob, stream);
}

}  // namespace ght::kernels::cuda
