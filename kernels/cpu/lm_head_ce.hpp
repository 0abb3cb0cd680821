#pragma once
/**
 * @file lm_head_ce.hpp
 * @brief LM head (logits = x·W^T, W (V, C): lm_head.weight or the tied embed_tokens.weight)
 * fused with cross-entropy, processed in row chunks so the (N, V) logits never exist at once.
 *
 * loss = (1/n_valid) sum over rows with targets[i] != ignore_index of lse_i − logit_i[target_i].
 * The backward recomputes each chunk's logits and forms dlogits = (softmax − onehot)·dloss/n_valid
 * per chunk.
 */
#include <cstdint>

namespace ght::kernels::cpu {

/// Hugging Face / PyTorch default ignore index.
inline constexpr std::int32_t kIgnoreIndex = -100;

struct CrossEntropyResult {
  double loss = 0;          ///< mean over valid rows (0 when there are none)
  std::int64_t valid = 0;   ///< rows whose target is not ignore_index
};

/**
 * @param lse (N) overwritten: logsumexp of each row's logits (kept for the backward); ignored
 *        rows get it too
 * @param x (N, C) final-norm output
 * @param w (V, C)
 * @param targets (N); each must be in [0, V) or equal ignore_index
 * @param chunk_rows rows per chunk (>0); scratch is chunk_rows·V elements
 * @throws ght::logic_error naming the row when a target is out of range
 */
template <class T>
CrossEntropyResult lm_head_ce_forward(T* lse, const T* x, const T* w, const std::int32_t* targets,
                                      std::int64_t N, int C, int V,
                                      std::int32_t ignore_index = kIgnoreIndex,
                                      std::int64_t chunk_rows = 256);

/**
 * @param dx (N, C) overwritten (rows with ignored targets get zeros)
 * @param dw (V, C) accumulated (+=)
 * @param dloss gradient of the loss with respect to the mean CE (e.g. loss_scale)
 * @param valid the forward's CrossEntropyResult::valid
 */
template <class T>
void lm_head_ce_backward(T* dx, T* dw, const T* x, const T* w, const std::int32_t* targets,
                         const T* lse, std::int64_t N, int C, int V, T dloss, std::int64_t valid,
                         std::int32_t ignore_index = kIgnoreIndex,
                         std::int64_t chunk_rows = 256);

}  // namespace ght::kernels::cpu
