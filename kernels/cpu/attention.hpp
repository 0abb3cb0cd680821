#pragma once
/**
 * @file attention.hpp
 * @brief Causal grouped-query attention with optional document masking (CPU reference).
 *
 * Query head h uses key/value head h / (H/KV) (HF repeat_kv). Scale 1/sqrt(D). Query (b, i)
 * attends key (b, j) iff j <= i and, when doc_ids is given, doc_ids[b, j] == doc_ids[b, i].
 * The softmax logsumexp of the scaled scores is saved for the backward (flash-attention style:
 * the backward recomputes the probabilities instead of storing (T, T) matrices).
 */
#include <cstdint>

namespace ght::kernels::cpu {

/**
 * @param out (B, T, H, D) overwritten
 * @param lse (B, H, T) overwritten: logsumexp over j of scale·q_i·k_j
 * @param q (B, T, H, D)
 * @param k, v (B, T, KV, D)
 * @param doc_ids (B, T) or nullptr (plain causal)
 */
template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v,
                       const std::int32_t* doc_ids, int B, int T_, int H, int KV, int D);

/**
 * @brief Backward of attention_forward. All of dq, dk, dv are overwritten. Deterministic: each
 * (batch, kv head) is processed by one thread in a fixed order.
 * @param dq (B, T, H, D), dk, dv (B, T, KV, D)
 * @param dout (B, T, H, D)
 * @param out, lse as produced by the forward
 */
template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                        const T* out, const T* lse, const std::int32_t* doc_ids, int B, int T_,
                        int H, int KV, int D);

}  // namespace ght::kernels::cpu
