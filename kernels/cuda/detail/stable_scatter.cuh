#pragma once
// One round of the stable counting-sort scatter of the MoE permutation (internal; include only
// from .cu files): used by moe_permute_plan (permute.cu) and by the fused routing kernel
// (router.cu), so both place every assignment in the same row.
#include <cuda_runtime.h>

namespace ght::kernels::cuda::detail {

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

}  // namespace ght::kernels::cuda::detail
