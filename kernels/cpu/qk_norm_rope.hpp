#pragma once
/**
 * @file qk_norm_rope.hpp
 * @brief Qwen3 QK-RMSNorm (per head over head_dim, one weight of shape (D) shared by all heads)
 * fused with RoPE in the Hugging Face rotate_half convention.
 *
 * For head vector x (D), after n = rmsnorm(x)·w, with half = D/2 and i < half:
 *   inv_freq_i = theta^(-2i/D), a = pos·inv_freq_i   (angles computed in double, cos/sin cast to T)
 *   out[i]        = n[i]·cos a − n[i+half]·sin a
 *   out[i+half]   = n[i+half]·cos a + n[i]·sin a
 * which is HF's q·cos + rotate_half(q)·sin with cos/sin = cat(freqs, freqs).
 */
#include <cstdint>

namespace ght::kernels::cpu {

/**
 * @brief Position ids for a (B, T) batch.
 * @param pos (B*T) overwritten: t, or t minus the start of its document when doc_ids is given
 * @param doc_ids (B, T) or nullptr; a document is a run of equal ids within one row
 */
void make_positions(std::int32_t* pos, const std::int32_t* doc_ids, int B, int T);

/**
 * @brief out = rope(rmsnorm_per_head(x)·w).
 * @param out (N, H, D) overwritten
 * @param rstd (N, H) overwritten, kept for the backward
 * @param x (N, H, D) the q_proj or k_proj output
 * @param w (D) q_norm or k_norm weight
 * @param pos (N) position ids (see make_positions)
 */
template <class T>
void qk_norm_rope_forward(T* out, T* rstd, const T* x, const T* w, const std::int32_t* pos,
                          std::int64_t N, int H, int D, double eps, double theta);

/**
 * @brief Backward of qk_norm_rope_forward.
 * @param dx (N, H, D) overwritten
 * @param dw (D) accumulated (+=), deterministic for any thread count
 * @param dout (N, H, D)
 */
template <class T>
void qk_norm_rope_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd,
                           const std::int32_t* pos, std::int64_t N, int H, int D, double theta);

}  // namespace ght::kernels::cpu
