#pragma once
/**
 * @file permute.hpp
 * @brief Token permutation for the experts: a counting sort of the N·K (token, slot) assignments
 * by expert (histogram, exclusive scan, stable scatter), the gather into expert order and the
 * weighted un-permute (combine) back to token order.
 *
 * Permuted row r holds assignment a = t·K + k. Within one expert, rows are in increasing a
 * (stable), so expert e owns rows [expert_offsets[e], expert_offsets[e+1]).
 */
#include <cstdint>

namespace ght::kernels::cpu {

/**
 * @brief Build the routing plan.
 * @param expert_offsets (E+1) overwritten: exclusive scan of the per-expert counts; [E] = N·K
 * @param src_token (N·K) overwritten: permuted row -> source token t
 * @param dst_row (N·K) overwritten: assignment t·K + k -> permuted row
 * @param topk_idx (N, K) expert ids in [0, E)
 * @throws ght::logic_error when an expert id is out of range
 */
void moe_permute_plan(std::int32_t* expert_offsets, std::int32_t* src_token, std::int32_t* dst_row,
                      const std::int32_t* topk_idx, std::int64_t N, int K, int E);

/**
 * @brief Gather: xp[r, :] = x[src_token[r], :].
 * @param xp (N·K, C) overwritten
 * @param x (N, C)
 */
template <class T>
void moe_permute_forward(T* xp, const T* x, const std::int32_t* src_token, std::int64_t N, int K,
                         int C);

/**
 * @brief Backward of the gather: dx[t, :] = sum_k dxp[dst_row[t·K+k], :] (k in order).
 * @param dx (N, C) overwritten
 * @param dxp (N·K, C)
 */
template <class T>
void moe_permute_backward(T* dx, const T* dxp, const std::int32_t* dst_row, std::int64_t N, int K,
                          int C);

/**
 * @brief Combine: out[t, :] = sum_k topk_w[t, k] · yp[dst_row[t·K+k], :].
 * @param out (N, C) overwritten
 * @param yp (N·K, C) expert outputs in permuted order
 * @param topk_w (N, K)
 */
template <class T>
void moe_unpermute_forward(T* out, const T* yp, const T* topk_w, const std::int32_t* dst_row,
                           std::int64_t N, int K, int C);

/**
 * @brief Backward of the combine.
 * @param dyp (N·K, C) overwritten: dyp[dst_row[t·K+k]] = topk_w[t,k]·dout[t]
 * @param dtopk_w (N, K) overwritten: dot(dout[t], yp[dst_row[t·K+k]])
 * @param dout (N, C)
 */
template <class T>
void moe_unpermute_backward(T* dyp, T* dtopk_w, const T* dout, const T* yp, const T* topk_w,
                            const std::int32_t* dst_row, std::int64_t N, int K, int C);

}  // namespace ght::kernels::cpu
