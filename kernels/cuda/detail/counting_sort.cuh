#pragma once
// The scan and the scatter of the MoE permutation's stable counting sort (internal; include only
// from .cu files): used by moe_permute_plan (permute.cu) and by the fused routing kernels
// (router.cu), so both place every assignment in the same row.
#include <cuda_runtime.h>

#include <cstdint>

namespace ght::kernels::cuda::detail {

/**
 * Called by every thread of one block with blockDim.x >= E; thread e < E holds `total`, the
 * number of assignments routed to expert e. Writes offsets (E+1), the exclusive scan of the
 * totals (Hillis-Steele over the experts), and replaces every tile_counts[t][e] (tiles, E) by
 * the first row of (tile t, expert e). `buf` is 2·blockDim.x ints of shared memory.
 */
__device__ __forceinline__ void scan_offsets(int total, int* tile_counts, int tiles, int E,
                                             std::int32_t* offsets, int* buf) {
  const int e = threadIdx.x, n = static_cast<int>(blockDim.x);
  int cur = 0;
  buf[e] = e < E ? total : 0;
  __syncthreads();
  for (int o = 1; o < n; o *= 2) {
    buf[(cur ^ 1) * n + e] = buf[cur * n + e] + (e >= o ? buf[cur * n + e - o] : 0);
    cur ^= 1;
    __syncthreads();
  }
  if (e < E) {
    const int incl = buf[cur * n + e];
    int run = incl - total;
    offsets[e] = run;
    for (int t = 0; t < tiles; ++t) {
      int* c = tile_counts + static_cast<std::int64_t>(t) * E + e;
      const int cnt = *c;
      *c = run;
      run += cnt;
    }
    if (e == E - 1) offsets[E] = incl;
  }
}

/**
 * Called by every thread of a THREADS-thread block for one round of THREADS consecutive
 * assignments of a tile (thread i holds the round's i-th assignment, routed to expert `e`, or
 * e = -1 for none). Returns that assignment's permuted row (-1 for none): the tile's next free
 * row of expert e (`running`, advanced by the round), plus the same expert in earlier warps and
 * earlier lanes of this warp (__match_any_sync). Rows within an expert therefore follow the
 * assignment order: stable. `warp_hist` is (THREADS/32, E) shared scratch.
 */
template <int THREADS>
__device__ __forceinline__ int stable_scatter_round(int e, int* running, int* warp_hist, int E) {
  constexpr int kWarps = THREADS / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int i = threadIdx.x; i < kWarps * E; i += THREADS) warp_hist[i] = 0;
  __syncthreads();
  const unsigned peers = __match_any_sync(0xffffffffu, e);
  const int rank = __popc(peers & ((1u << lane) - 1u));
  if (e >= 0 && rank == 0) warp_hist[warp * E + e] = __popc(peers);
  __syncthreads();
  int r = -1;
  if (e >= 0) {
    r = running[e] + rank;
    for (int w = 0; w < warp; ++w) r += warp_hist[w * E + e];
  }
  __syncthreads();
  for (int x = threadIdx.x; x < E; x += THREADS) {
    int s = 0;
    for (int w = 0; w < kWarps; ++w) s += warp_hist[w * E + x];
    running[x] += s;
  }
  __syncthreads();
  return r;
}

/**
 * One round of a tile for assignment a of this thread (a >= a_end: none): its expert from idx
 * (an id outside [0, E) is not placed), its row by stable_scatter_round, written to dst_row[a]
 * (-1 when not placed) and src_token[row] = a / K. Returns the row. Every thread must call it.
 */
template <int THREADS>
__device__ __forceinline__ int place_round(const std::int32_t* __restrict__ idx, std::int64_t a,
                                           std::int64_t a_end, int K, int E, int* running,
                                           int* warp_hist, std::int32_t* __restrict__ src_token,
                                           std::int32_t* __restrict__ dst_row) {
  int e = -1;
  if (a < a_end) {
    e = idx[a];
    if (e < 0 || e >= E) e = -1;
  }
  const int r = stable_scatter_round<THREADS>(e, running, warp_hist, E);
  if (a < a_end) {
    if (r >= 0) src_token[r] = static_cast<std::int32_t>(a / K);
    dst_row[a] = r;
  }
  return r;
}

}  // namespace ght::kernels::cuda::detail
