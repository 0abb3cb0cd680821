#pragma once
/**
 * @file router.hpp
 * @brief MoE router: logits = x·Wr^T, softmax, top-k, optional top-k renormalisation, the
 * load-balance (aux) loss and the router z-loss, forward and backward.
 *
 * The router is never computed below fp32: in the float instantiation everything is fp32 (as HF
 * does its softmax in fp32); the double instantiation exists for finite-difference tests.
 *
 * Top-k: experts sorted by probability, descending; ties go to the lower expert index.
 * Combine weights: topk_w[t,k] = p[t, idx[t,k]], divided by sum_k p[t, idx[t,k]] when
 * norm_topk_prob (HF Qwen3-MoE `norm_topk_prob`).
 *
 * Aux loss of one layer, over its N tokens, exactly HF `load_balancing_loss_func` for a single
 * layer's logits without attention mask:
 *   c_e  = number of (t, k) with idx[t,k] == e           (so sum_e c_e = N·K)
 *   P_e  = (1/N) sum_t p[t, e]                          (full softmax, not the renormalised w)
 *   aux  = E · sum_e (c_e / N) · P_e
 * (HF: tokens_per_expert = mean over tokens of one_hot(idx) with shape (K, E); the loss is
 * E·sum(tokens_per_expert · P)). A perfectly uniform router gives aux = K. HF concatenates every
 * layer's logits before computing one aux; we compute it per layer and the model sums the layers
 * (Megatron/Switch style). The two agree for one layer; see trainer/model.hpp.
 *
 * Z-loss of one layer (ST-MoE, Megatron): z = (1/N) sum_t logsumexp_e(logits[t, e])².
 *
 * Backward treats the top-k selection (idx and the counts c_e) as constants.
 */
#include <cstdint>

namespace ght::kernels::cpu {

/// Per-layer router losses (accumulated in double for both instantiations).
struct RouterLosses {
  double aux = 0;  ///< load-balance loss, E·sum_e f_e·P_e
  double z = 0;    ///< z-loss, mean_t logsumexp(logits_t)²
};

/**
 * @param logits (N, E) overwritten
 * @param probs (N, E) overwritten, softmax(logits)
 * @param topk_idx (N, K) overwritten, expert ids, descending probability
 * @param topk_w (N, K) overwritten, combine weights (renormalised when norm_topk_prob)
 * @param x (N, C) the post-attention-layernorm hidden states
 * @param wr (E, C) `mlp.gate.weight`
 * @return the layer's aux and z losses
 */
template <class T>
RouterLosses router_forward(T* logits, T* probs, std::int32_t* topk_idx, T* topk_w, const T* x,
                            const T* wr, std::int64_t N, int C, int E, int K,
                            bool norm_topk_prob);

/**
 * @brief Backward through combine weights, aux loss and z-loss into x and Wr.
 * @param dx (N, C) ACCUMULATED (+=) (x also feeds the experts, whose gradient is written first)
 * @param dwr (E, C) accumulated (+=)
 * @param dtopk_w (N, K) gradient of the loss with respect to topk_w (nullptr: zero)
 * @param aux_grad d loss / d aux for this layer (e.g. aux_loss_coef · loss_scale)
 * @param z_grad d loss / d z for this layer (e.g. z_loss_coef · loss_scale)
 * @param logits, probs, topk_idx, topk_w, x, wr as in / produced by the forward
 */
template <class T>
void router_backward(T* dx, T* dwr, const T* dtopk_w, T aux_grad, T z_grad, const T* logits,
                     const T* probs, const std::int32_t* topk_idx, const T* topk_w, const T* x,
                     const T* wr, std::int64_t N, int C, int E, int K, bool norm_topk_prob);

}  // namespace ght::kernels::cpu
