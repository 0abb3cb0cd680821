#pragma once
/**
 * @file embedding.hpp
 * @brief Token embedding lookup (model.embed_tokens) and its backward.
 */
#include <cstdint>

namespace ght::kernels::cpu {

/**
 * @brief out[i, :] = wte[tokens[i], :].
 * @param out (N, C)
 * @param tokens (N) token ids
 * @param wte (V, C)
 * @throws ght::logic_error naming the position and id when a token id is outside [0, V).
 */
template <class T>
void embedding_forward(T* out, const std::int32_t* tokens, const T* wte, std::int64_t N, int C,
                       int V);

/**
 * @brief dwte[tokens[i], :] += dout[i, :]. Deterministic: rows are summed in token order.
 * @param dwte (V, C) accumulated
 * @param dout (N, C)
 * Token ids are not re-checked (forward checked them).
 */
template <class T>
void embedding_backward(T* dwte, const T* dout, const std::int32_t* tokens, std::int64_t N, int C,
                        int V);

}  // namespace ght::kernels::cpu
