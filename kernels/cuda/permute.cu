// Token permutation by a stable counting sort, gather and combine (see permute.hpp).
#include "kernels/cuda/permute.hpp"

#include <string>

#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/detail/counting_sort.cuh"
#include "kernels/cuda/scratch.hpp"
#include "tier/cuda_check.hpp"
#include "tier/error.hpp"

namespace ght::kernels::cuda {
namespace {

using detail::bf16;

constexpr int kTileThreads = 256;             // 8 warps
constexpr int kTileWarps = kTileThreads / 32;
constexpr int kRounds = 4;                    // a tile is kRounds·256 consecutive assignments
constexpr int kTile = kTileThreads * kRounds;
constexpr int kMaxExperts = 1024;

// 1. counts[tile][e] = number of assignments of the tile routed to e (integer atomics: exact).
__global__ void tile_histogram_kernel(const std::int32_t* __restrict__ idx, std::int64_t A, int E,
                                      int* __restrict__ counts) {
  extern __shared__ int hist[];  // (E)
  for (int e = threadIdx.x; e < E; e += blockDim.x) hist[e] = 0;
  __syncthreads();
  const std::int64_t a0 = static_cast<std::int64_t>(blockIdx.x) * kTile;
  for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
    const std::int64_t a = a0 + i;
    if (a < A) {
      const int e = idx[a];
      if (e >= 0 && e < E) atomicAdd(&hist[e], 1);
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x)
    counts[static_cast<std::int64_t>(blockIdx.x) * E + e] = hist[e];
}

// 2. One block, thread e per expert (E <= 1024): offsets = exclusive scan of the totals over e;
// counts[tile][e] becomes the first row of (tile, e): offset_e + sum over earlier tiles.
__global__ void scan_kernel(int* __restrict__ counts, int tiles, int E,
                            std::int32_t* __restrict__ offsets) {
  __shared__ int buf[2 * kMaxExperts];
  const int e = threadIdx.x;
  int total = 0;
  if (e < E)
    for (int t = 0; t < tiles; ++t) total += counts[static_cast<std::int64_t>(t) * E + e];
  detail::scan_offsets(total, counts, tiles, E, offsets, buf);
}

// 3. Stable scatter: a tile walks its assignments in kRounds rounds of 256
// (detail::place_round), starting from the tile's first row per expert.
__global__ void scatter_kernel(const std::int32_t* __restrict__ idx, std::int64_t A, int K, int E,
                               const int* __restrict__ base, std::int32_t* __restrict__ src_token,
                               std::int32_t* __restrict__ dst_row) {
  extern __shared__ int smem[];
  int* running = smem;               // (E)
  int* warp_hist = smem + E;         // (kTileWarps, E)
  for (int e = threadIdx.x; e < E; e += blockDim.x)
    running[e] = base[static_cast<std::int64_t>(blockIdx.x) * E + e];
  for (int round = 0; round < kRounds; ++round) {
    const std::int64_t a = static_cast<std::int64_t>(blockIdx.x) * kTile + round * kTileThreads +
                           threadIdx.x;
    (void)detail::place_round<kTileThreads>(idx, a, A, K, E, running, warp_hist, src_token, dst_row);
  }
}

constexpr int kWarpsPerBlock = 8;

// Warp per permuted row: xp[r] = x[src_token[r]].
template <int VEC>
__global__ void gather_kernel(bf16* __restrict__ xp, const bf16* __restrict__ x,
                              const std::int32_t* __restrict__ src_token, std::int64_t rows, int C) {
  const std::int64_t r = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  detail::copy_row<VEC>(xp + r * C, x + static_cast<std::int64_t>(src_token[r]) * C, C);
}

// Warp per assignment, in assignment order: xp[dst_row[a]] = x[a / K] (unplaced ones skipped).
// The K warps that copy one token's row run side by side, so x is read about once from HBM; the
// gather by permuted row reads it K times, because one expert's rows come from tokens all over x.
// (A warp per token storing all K rows ran 4.7x slower than the gather on the H200: 16k warps
// with 32 KB each, against 64k warps with 8 KB, is too little in flight.)
template <int VEC>
__global__ void scatter_rows_kernel(bf16* __restrict__ xp, const bf16* __restrict__ x,
                                    const std::int32_t* __restrict__ dst_row, std::int64_t A,
                                    int K, int C) {
  const std::int64_t a = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (a >= A) return;
  const std::int32_t r = dst_row[a];
  if (r < 0) return;
  detail::copy_row<VEC>(xp + static_cast<std::int64_t>(r) * C, x + a / K * C, C);
}

// Warp per token: out[t] = sum_k (w ? w[t,k] : 1)·src[dst_row[t·K+k]], k in order, fp32.
template <int VEC, bool WEIGHTED>
__global__ void combine_kernel(bf16* __restrict__ out, const bf16* __restrict__ src,
                               const float* __restrict__ w, const std::int32_t* __restrict__ dst_row,
                               std::int64_t N, int K, int C) {
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (t >= N) return;
  const int lane = threadIdx.x % 32;
  for (int c = lane * VEC; c < C; c += 32 * VEC) {
    float acc[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[j] = 0.0f;
    for (int k = 0; k < K; ++k) {
      const std::int32_t r = dst_row[t * K + k];
      if (r < 0) continue;
      const float wk = WEIGHTED ? w[t * K + k] : 1.0f;
      float v[VEC];
      detail::load_vec<VEC>(src + static_cast<std::int64_t>(r) * C + c, v);
#pragma unroll
      for (int j = 0; j < VEC; ++j) acc[j] += wk * v[j];
    }
    detail::store_vec<VEC>(out + t * C + c, acc);
  }
}

// Warp per token: dyp[row_k] = w[t,k]·dout[t]; dtopk_w[t,k] = dot(dout[t], yp[row_k]).
template <int VEC>
__global__ void combine_backward_kernel(bf16* __restrict__ dyp, float* __restrict__ dtopk_w,
                                        const bf16* __restrict__ dout, const bf16* __restrict__ yp,
                                        const float* __restrict__ w,
                                        const std::int32_t* __restrict__ dst_row, std::int64_t N,
                                        int K, int C) {
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (t >= N) return;
  const int lane = threadIdx.x % 32;
  for (int k = 0; k < K; ++k) {
    const std::int32_t r = dst_row[t * K + k];
    if (r < 0) {
      if (lane == 0) dtopk_w[t * K + k] = 0.0f;
      continue;
    }
    const float wk = w[t * K + k];
    float dot = 0.0f;
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
      float g[VEC], y[VEC], d[VEC];
      detail::load_vec<VEC>(dout + t * C + c, g);
      detail::load_vec<VEC>(yp + static_cast<std::int64_t>(r) * C + c, y);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        dot += g[j] * y[j];
        d[j] = wk * g[j];
      }
      detail::store_vec<VEC>(dyp + static_cast<std::int64_t>(r) * C + c, d);
    }
    dot = detail::warp_sum(dot);
    if (lane == 0) dtopk_w[t * K + k] = dot;
  }
}

// combine_backward_kernel for K <= kRowsAtOnce and 8-wide rows: all K rows of yp are loaded
// before any row of dyp is stored, so a warp has K loads in flight instead of waiting on one row
// at a time; dout is read once per column chunk. Same sums in the same order: bit-identical.
constexpr int kRowsAtOnce = 8;
__global__ void combine_backward_rows_kernel(bf16* __restrict__ dyp, float* __restrict__ dtopk_w,
                                             const bf16* __restrict__ dout,
                                             const bf16* __restrict__ yp,
                                             const float* __restrict__ w,
                                             const std::int32_t* __restrict__ dst_row,
                                             std::int64_t N, int K, int C) {
  const std::int64_t t = static_cast<std::int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (t >= N) return;
  const int lane = threadIdx.x % 32;
  std::int32_t row[kRowsAtOnce];
  float wk[kRowsAtOnce], dot[kRowsAtOnce];
#pragma unroll
  for (int k = 0; k < kRowsAtOnce; ++k) {
    row[k] = k < K ? dst_row[t * K + k] : -1;
    wk[k] = row[k] >= 0 ? w[t * K + k] : 0.0f;
    dot[k] = 0.0f;
  }
  for (int c = lane * 8; c < C; c += 32 * 8) {
    detail::Bf16x8 y[kRowsAtOnce];
#pragma unroll
    for (int k = 0; k < kRowsAtOnce; ++k)
      if (row[k] >= 0) y[k] = *reinterpret_cast<const detail::Bf16x8*>(yp + static_cast<std::int64_t>(row[k]) * C + c);
    float g[8];
    detail::load8(dout + t * C + c, g);
#pragma unroll
    for (int k = 0; k < kRowsAtOnce; ++k) {
      if (row[k] < 0) continue;
      float d[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        dot[k] += g[j] * __bfloat162float(y[k].v[j]);
        d[j] = wk[k] * g[j];
      }
      detail::store8(dyp + static_cast<std::int64_t>(row[k]) * C + c, d);
    }
  }
#pragma unroll
  for (int k = 0; k < kRowsAtOnce; ++k) {
    if (k >= K) break;
    const float s = detail::warp_sum(dot[k]);  // row[k] is the same on every lane
    if (lane == 0) dtopk_w[t * K + k] = row[k] >= 0 ? s : 0.0f;
  }
}

void check(const char* op, std::int64_t N, int K, int C) {
  GHT_EXPECTS(N >= 0 && K >= 1 && C >= 1, std::string(op) + ": need N >= 0, K >= 1, C >= 1, got N=" +
                                              std::to_string(N) + " K=" + std::to_string(K) +
                                              " C=" + std::to_string(C));
  GHT_EXPECTS(N * K <= 0x7fffffff, std::string(op) + ": N·K=" + std::to_string(N * K) +
                                       " exceeds int32 row ids");
}

unsigned blocks_for_warps(std::int64_t n) {
  return static_cast<unsigned>(detail::ceil_div(n, kWarpsPerBlock));
}

}  // namespace

void moe_permute_plan(std::int32_t* expert_offsets, std::int32_t* src_token, std::int32_t* dst_row,
                      const std::int32_t* topk_idx, std::int64_t N, int K, int E,
                      cudaStream_t stream) {
  check("moe_permute_plan", N, K, 1);
  GHT_EXPECTS(E >= 1 && E <= kMaxExperts, "moe_permute_plan: experts E=" + std::to_string(E) +
                                              " must be in [1, " + std::to_string(kMaxExperts) + "]");
  const std::int64_t A = N * K;
  if (A == 0) {
    GHT_CUDA_TRY(cudaMemsetAsync(expert_offsets, 0, (static_cast<std::size_t>(E) + 1) * sizeof(std::int32_t), stream));
    return;
  }
  const int tiles = static_cast<int>(detail::ceil_div(A, kTile));
  auto* counts = static_cast<int*>(
      stream_scratch(stream, static_cast<std::size_t>(tiles) * E * sizeof(int)));
  tile_histogram_kernel<<<tiles, kTileThreads, E * sizeof(int), stream>>>(topk_idx, A, E, counts);
  GHT_CUDA_CHECK_LAUNCH();
  const int scan_threads = static_cast<int>(detail::ceil_div(E, 32) * 32);
  scan_kernel<<<1, scan_threads, 0, stream>>>(counts, tiles, E, expert_offsets);
  GHT_CUDA_CHECK_LAUNCH();
  const std::size_t smem = static_cast<std::size_t>(E) * (1 + kTileWarps) * sizeof(int);
  if (smem > 48 * 1024) {
    GHT_CUDA_TRY(cudaFuncSetAttribute(scatter_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)));
  }
  scatter_kernel<<<tiles, kTileThreads, smem, stream>>>(topk_idx, A, K, E, counts, src_token,
                                                        dst_row);
  GHT_CUDA_CHECK_LAUNCH();
}

void moe_permute_forward(bf16* xp, const bf16* x, const std::int32_t* src_token, std::int64_t N,
                         int K, int C, cudaStream_t stream) {
  check("moe_permute_forward", N, K, C);
  const std::int64_t rows = N * K;
  if (rows == 0) return;
  if (C % 8 == 0 && detail::aligned16(xp, x)) {
    gather_kernel<8><<<blocks_for_warps(rows), kWarpsPerBlock * 32, 0, stream>>>(xp, x, src_token, rows, C);
  } else {
    gather_kernel<1><<<blocks_for_warps(rows), kWarpsPerBlock * 32, 0, stream>>>(xp, x, src_token, rows, C);
  }
  GHT_CUDA_CHECK_LAUNCH();
}

void moe_permute_forward_by_token(bf16* xp, const bf16* x, const std::int32_t* dst_row,
                                  std::int64_t N, int K, int C, cudaStream_t stream) {
  check("moe_permute_forward_by_token", N, K, C);
  const std::int64_t A = N * K;
  if (A == 0) return;
  if (C % 8 == 0 && detail::aligned16(xp, x)) {
    scatter_rows_kernel<8><<<blocks_for_warps(A), kWarpsPerBlock * 32, 0, stream>>>(xp, x, dst_row, A, K, C);
  } else {
    scatter_rows_kernel<1><<<blocks_for_warps(A), kWarpsPerBlock * 32, 0, stream>>>(xp, x, dst_row, A, K, C);
  }
  GHT_CUDA_CHECK_LAUNCH();
}

void moe_permute_backward(bf16* dx, const bf16* dxp, const std::int32_t* dst_row, std::int64_t N,
                          int K, int C, cudaStream_t stream) {
  check("moe_permute_backward", N, K, C);
  if (N == 0) return;
  if (C % 8 == 0 && detail::aligned16(dx, dxp)) {
    combine_kernel<8, false><<<blocks_for_warps(N), kWarpsPerBlock * 32, 0, stream>>>(dx, dxp, nullptr, dst_row, N, K, C);
  } else {
    combine_kernel<1, false><<<blocks_for_warps(N), kWarpsPerBlock * 32, 0, stream>>>(dx, dxp, nullptr, dst_row, N, K, C);
  }
  GHT_CUDA_CHECK_LAUNCH();
}

void moe_unpermute_forward(bf16* out, const bf16* yp, const float* topk_w,
                           const std::int32_t* dst_row, std::int64_t N, int K, int C,
                           cudaStream_t stream) {
  check("moe_unpermute_forward", N, K, C);
  if (N == 0) return;
  if (C % 8 == 0 && detail::aligned16(out, yp)) {
    combine_kernel<8, true><<<blocks_for_warps(N), kWarpsPerBlock * 32, 0, stream>>>(out, yp, topk_w, dst_row, N, K, C);
  } else {
    combine_kernel<1, true><<<blocks_for_warps(N), kWarpsPerBlock * 32, 0, stream>>>(out, yp, topk_w, dst_row, N, K, C);
  }
  GHT_CUDA_CHECK_LAUNCH();
}

void moe_unpermute_backward(bf16* dyp, float* dtopk_w, const bf16* dout, const bf16* yp,
                            const float* topk_w, const std::int32_t* dst_row, std::int64_t N, int K,
                            int C, cudaStream_t stream) {
  check("moe_unpermute_backward", N, K, C);
  if (N == 0) return;
  if (K <= kRowsAtOnce && C % 8 == 0 && detail::aligned16(dyp, dout, yp)) {
    combine_backward_rows_kernel<<<blocks_for_warps(N), kWarpsPerBlock * 32, 0, stream>>>(dyp, dtopk_w, dout, yp, topk_w, dst_row, N, K, C);
  } else if (C % 8 == 0 && detail::aligned16(dyp, dout, yp)) {
    combine_backward_kernel<8><<<blocks_for_warps(N), kWarpsPerBlock * 32, 0, stream>>>(dyp, dtopk_w, dout, yp, topk_w, dst_row, N, K, C);
  } else {
    combine_backward_kernel<1><<<blocks_for_warps(N), kWarpsPerBlock * 32, 0, stream>>>(dyp, dtopk_w, dout, yp, topk_w, dst_row, N, K, C);
  }
  GHT_CUDA_CHECK_LAUNCH();
}

}  // namespace ght::kernels::cuda
