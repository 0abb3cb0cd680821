#pragma once
/**
 * @file gemm.hpp
 * @brief Plain row-major GEMM helpers (CPU reference, OpenMP) and the Linear layer built on them.
 *
 * Every output element is computed by one thread in a fixed k order, so results do not depend on
 * the thread count (needed for bit-exact resume). Explicitly instantiated for float and double.
 * Shapes are row-major; `accumulate` selects C = ... (false) or C += ... (true).
 */
#include <cstdint>

namespace ght::kernels::cpu {

/// @brief C (M, N) = A (M, K) · B (N, K)^T. This is y = x·W^T for a weight W (out, in).
template <class T>
void matmul_nt(T* C, const T* A, const T* B, std::int64_t M, std::int64_t N, std::int64_t K,
               bool accumulate = false);

/// @brief C (M, N) = A (M, K) · B (K, N). This is dx = dy·W for a weight W (out, in).
template <class T>
void matmul_nn(T* C, const T* A, const T* B, std::int64_t M, std::int64_t N, std::int64_t K,
               bool accumulate = false);

/// @brief C (M, N) = A (K, M)^T · B (K, N). This is dW = dy^T·x (weight gradients).
template <class T>
void matmul_tn(T* C, const T* A, const T* B, std::int64_t M, std::int64_t N, std::int64_t K,
               bool accumulate = false);

/**
 * @brief Bias-free Linear layer, y = x·W^T (Hugging Face nn.Linear layout).
 * @param out (N, OC)  overwritten
 * @param inp (N, IC)
 * @param weight (OC, IC)
 */
template <class T>
void linear_forward(T* out, const T* inp, const T* weight, std::int64_t N, int IC, int OC);

/**
 * @brief Backward of linear_forward.
 * @param dinp (N, IC) overwritten when accumulate_dinp is false, else += (may be nullptr: skipped)
 * @param dweight (OC, IC) always accumulated (+=)
 * @param dout (N, OC)
 */
template <class T>
void linear_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                     std::int64_t N, int IC, int OC, bool accumulate_dinp = false);

}  // namespace ght::kernels::cpu
