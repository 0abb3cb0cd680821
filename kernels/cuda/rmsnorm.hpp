#pragma once
/**
 * @file rmsnorm.hpp
 * @brief RMSNorm and the fused residual-add + RMSNorm on the GPU (bf16 storage, fp32 math);
 * mirrors kernels/cpu/rmsnorm.hpp: y = x·rsqrt(mean(x²) + eps)·w over the last dimension.
 *
 * rstd is kept in fp32. Weight gradients are reduced deterministically (fixed per-block partial
 * sums added in block order by a second kernel), never with floating-point atomics.
 *
 * FLOPs (forward) ≈ 4·N·C; bytes ≈ 2·(2·N·C) (+ 2·2·N·C for the fused residual).
 * FLOPs (backward) ≈ 10·N·C; bytes ≈ 2·(4·N·C) + partials.
 */
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ght::kernels::cuda {

/**
 * @brief out = rmsnorm(x)·w.
 * @param out (N, C) bf16, overwritten
 * @param rstd (N) fp32, overwritten (kept for the backward)
 * @param x (N, C)  @param w (C)
 * @throws ght::logic_error on bad sizes; ght::cuda_error when the launch fails
 */
void rmsnorm_forward(__nv_bfloat16* out, float* rstd, const __nv_bfloat16* x,
                     const __nv_bfloat16* w, std::int64_t N, int C, float eps,
                     cudaStream_t stream);

/**
 * @brief sum = x + residual (rounded to bf16), out = rmsnorm(sum)·w. The norm is taken of the
 * rounded sum, which is what the backward sees and what Hugging Face computes in bf16.
 * @param sum (N, C) overwritten; may alias `x` or `residual` (in-place residual update)
 */
void fused_residual_rmsnorm_forward(__nv_bfloat16* sum, __nv_bfloat16* out, float* rstd,
                                    const __nv_bfloat16* x, const __nv_bfloat16* residual,
                                    const __nv_bfloat16* w, std::int64_t N, int C, float eps,
                                    cudaStream_t stream);

/**
 * @brief Backward of rmsnorm_forward.
 * @param dx (N, C) ACCUMULATED (+=), like the CPU op (the residual-stream gradient flows into it)
 * @param dw (C) accumulated (+=), fp32 or bf16
 * @param dout (N, C)  @param x, w, rstd as in / saved by the forward
 */
void rmsnorm_backward(__nv_bfloat16* dx, float* dw, const __nv_bfloat16* dout,
                      const __nv_bfloat16* x, const __nv_bfloat16* w, const float* rstd,
                      std::int64_t N, int C, cudaStream_t stream);
void rmsnorm_backward(__nv_bfloat16* dx, __nv_bfloat16* dw, const __nv_bfloat16* dout,
                      const __nv_bfloat16* x, const __nv_bfloat16* w, const float* rstd,
                      std::int64_t N, int C, cudaStream_t stream);

/// Backward of fused_residual_rmsnorm_forward: dsum += the norm's gradient (then dsum is the
/// gradient of both x and residual). Same as rmsnorm_backward on `sum`.
inline void fused_residual_rmsnorm_backward(__nv_bfloat16* dsum, float* dw,
                                            const __nv_bfloat16* dout, const __nv_bfloat16* sum,
                                            const __nv_bfloat16* w, const float* rstd,
                                            std::int64_t N, int C, cudaStream_t stream) {
  rmsnorm_backward(dsum, dw, dout, sum, w, rstd, N, C, stream);
}
inline void fused_residual_rmsnorm_backward(__nv_bfloat16* dsum, __nv_bfloat16* dw,
                                            const __nv_bfloat16* dout, const __nv_bfloat16* sum,
                                            const __nv_bfloat16* w, const float* rstd,
                                            std::int64_t N, int C, cudaStream_t stream) {
  rmsnorm_backward(dsum, dw, dout, sum, w, rstd, N, C, stream);
}

}  // namespace ght::kernels::cuda
