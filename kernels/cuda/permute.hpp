#pragma once
/**
 * @file permute.hpp
 * @brief Token permutation for the experts on the GPU, mirroring kernels/cpu/permute.hpp: a
 * stable counting sort of the N·K (token, slot) assignments by expert (histogram per tile,
 * exclusive scan, stable scatter), the gather into expert order, and the weighted un-permute
 * (combine) back to token order, with their backwards.
 *
 * Entirely on the device with no host synchronisation: expert_offsets (E+1) stays in device
 * memory for the grouped expert GEMMs (kernels/cuda/expert_gemm.hpp); a consumer that needs the
 * counts on the host copies them itself (one sync, its choice).
 *
 * Permuted row r holds assignment a = t·K + k; within an expert rows are in increasing a (stable,
 * identical to the CPU plan). Sums over k run in k order in fp32: deterministic.
 *
 * Bytes: plan ≈ 4·3·N·K; gather/combine ≈ 2·(N + N·K)·C (+4·N·K for the weights).
 */
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ght::kernels::cuda {

/**
 * @brief Build the routing plan (3 kernels, no host sync).
 * @param expert_offsets (E+1) overwritten: exclusive scan of the counts; [E] = number placed
 * @param src_token (N·K) overwritten: permuted row -> source token
 * @param dst_row (N·K) overwritten: assignment t·K + k -> permuted row
 * @param topk_idx (N, K) expert ids. The kernel cannot throw: an id outside [0, E) is not placed
 *        (its dst_row is -1 and expert_offsets[E] < N·K); the router never produces one.
 * @throws ght::logic_error on bad sizes (E must be in [1, 1024])
 */
void moe_permute_plan(std::int32_t* expert_offsets, std::int32_t* src_token,
                      std::int32_t* dst_row, const std::int32_t* topk_idx, std::int64_t N, int K,
                      int E, cudaStream_t stream);

/// Gather: xp[r, :] = x[src_token[r], :]. xp (N·K, C) overwritten, x (N, C).
void moe_permute_forward(__nv_bfloat16* xp, const __nv_bfloat16* x, const std::int32_t* src_token,
                         std::int64_t N, int K, int C, cudaStream_t stream);

/// The same xp as moe_permute_forward, written in token order: xp[dst_row[t·K+k], :] = x[t, :]
/// (assignments that moe_permute_plan did not place are skipped). It reads each row of x once,
/// where the gather reads it K times; use it wherever dst_row is at hand.
void moe_permute_forward_by_token(__nv_bfloat16* xp, const __nv_bfloat16* x,
                                  const std::int32_t* dst_row, std::int64_t N, int K, int C,
                                  cudaStream_t stream);

/// Backward of the gather: dx[t, :] = sum_k dxp[dst_row[t·K+k], :]. dx (N, C) overwritten.
void moe_permute_backward(__nv_bfloat16* dx, const __nv_bfloat16* dxp, const std::int32_t* dst_row,
                          std::int64_t N, int K, int C, cudaStream_t stream);

/// Combine: out[t, :] = sum_k topk_w[t, k]·yp[dst_row[t·K+k], :]. out (N, C) overwritten,
/// yp (N·K, C) in expert order, topk_w (N, K) fp32.
void moe_unpermute_forward(__nv_bfloat16* out, const __nv_bfloat16* yp, const float* topk_w,
                           const std::int32_t* dst_row, std::int64_t N, int K, int C,
                           cudaStream_t stream);

/**
 * @brief Backward of the combine.
 * @param dyp (N·K, C) overwritten: dyp[dst_row[t·K+k]] = topk_w[t,k]·dout[t]
 * @param dtopk_w (N, K) fp32 overwritten: dot(dout[t], yp[dst_row[t·K+k]])
 */
void moe_unpermute_backward(__nv_bfloat16* dyp, float* dtopk_w, const __nv_bfloat16* dout,
                            const __nv_bfloat16* yp, const float* topk_w,
                            const std::int32_t* dst_row, std::int64_t N, int K, int C,
                            cudaStream_t stream);

}  // namespace ght::kernels::cuda
