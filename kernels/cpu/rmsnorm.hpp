#pragma once
/**
 * @file rmsnorm.hpp
 * @brief RMSNorm with Hugging Face Qwen3 semantics, y = x·rsqrt(mean(x²) + eps)·w, computed in T,
 * and the fused residual-add variant used between sub-layers (out = rmsnorm(x + residual)).
 */
#include <cstdint>

namespace ght::kernels::cpu {

/**
 * @brief RMSNorm over the last dimension.
 * @param out (N, C) overwritten
 * @param rstd (N) overwritten: 1/sqrt(mean(x²)+eps), kept for the backward
 * @param x (N, C)
 * @param w (C)
 */
template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, std::int64_t N, int C, double eps);

/**
 * @brief Backward of rmsnorm_forward.
 * @param dx (N, C) ACCUMULATED (+=), so the residual-stream gradient can flow into it directly
 * @param dw (C) accumulated (+=); the sum over rows is deterministic for any thread count
 * @param dout (N, C)
 * @param x, w, rstd the forward's inputs and its saved rstd
 */
template <class T>
void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd,
                      std::int64_t N, int C);

/**
 * @brief Fused residual add + RMSNorm: sum = x + residual; out = rmsnorm(sum).
 * @param sum (N, C) overwritten; the new residual stream, also the input saved for the backward
 * @param out (N, C) overwritten
 * @param rstd (N) overwritten
 * @param x, residual (N, C); `sum` may alias `residual` or `x` (in-place residual update)
 */
template <class T>
void fused_residual_rmsnorm_forward(T* sum, T* out, T* rstd, const T* x, const T* residual,
                                    const T* w, std::int64_t N, int C, double eps);

/**
 * @brief Backward of fused_residual_rmsnorm_forward.
 *
 * Since d(sum)/dx = d(sum)/d(residual) = I, both inputs receive the same gradient, dsum.
 * @param dsum (N, C) in/out: on entry the gradient that reaches `sum` through its other use (the
 *        residual stream); on exit += the norm's contribution. It is then the gradient of both
 *        `x` and `residual`.
 * @param dw (C) accumulated
 * @param dout (N, C) gradient of `out`
 * @param sum, w, rstd as saved by the forward
 */
template <class T>
void fused_residual_rmsnorm_backward(T* dsum, T* dw, const T* dout, const T* sum, const T* w,
                                     const T* rstd, std::int64_t N, int C);

}  // namespace ght::kernels::cpu
