#pragma once
/**
 * @file swiglu.hpp
 * @brief SwiGLU activation on the gate/up halves of the fused gate_up projection, forward and
 * backward (bf16 storage, fp32 math). The expert MLP of kernels/cpu/swiglu_experts.hpp is
 *   gate_up(R, 2F) = xp · [Wg; Wu]^T   (one GEMM: an expert's gate_proj and up_proj are
 *                                       contiguous, so they form one (2F, C) matrix)
 *   act(R, F)      = silu(gate) · up   (this op)
 *   y(R, C)        = act · Wd^T
 * Gate and up are given as separate pointers with a shared row stride, so both the fused layout
 * (gate = gu, up = gu + F, ld = 2F) and separate (R, F) tensors (ld = F) work.
 *
 * FLOPs ≈ 5·R·F (forward), 10·R·F (backward); bytes 3·2·R·F (forward), 5·2·R·F (backward).
 * swiglu_forward_fp8 adds the e4m3 quantisation of act for the FP8 down GEMM: FLOPs ≈ 8·R·F;
 * bytes 3·2·R·F + R·F codes + 4·R·ceil(F/128) scales, where swiglu_forward then
 * quantize_fp8_rows move 2·R·F more (act read back).
 */
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ght::kernels::cuda {

/**
 * @brief act[r, f] = silu(gate[r, f]) · up[r, f], silu(g) = g·σ(g).
 * @param act (R, F) with row stride ld_act
 * @param gate, up (R, F) each, row stride ld_in
 * @throws ght::logic_error on bad sizes/strides; ght::cuda_error when the launch fails
 */
void swiglu_forward(__nv_bfloat16* act, std::int64_t ld_act, const __nv_bfloat16* gate,
                    const __nv_bfloat16* up, std::int64_t ld_in, std::int64_t R, int F,
                    cudaStream_t stream);

/**
 * @brief swiglu_forward and quantize_fp8_rows(act) (kernels/cuda/fp8_quant.hpp), fused: the same
 * bf16 act, and codes/scales bit-identical to quantising that act (the bf16-rounded values) in
 * 1 x 128 tiles. F need not be a multiple of 128 (the last tile of a row is partial).
 * @param act (R, F) with row stride ld_act, overwritten
 * @param codes (R, F) e4m3, packed, overwritten
 * @param scales (R, ceil(F/128)) fp32, overwritten
 * @param gate, up (R, F) each, row stride ld_in
 * @throws ght::logic_error on bad sizes/strides or a null pointer; ght::cuda_error when the
 *         launch fails
 */
void swiglu_forward_fp8(__nv_bfloat16* act, std::int64_t ld_act, __nv_fp8_e4m3* codes,
                        float* scales, const __nv_bfloat16* gate, const __nv_bfloat16* up,
                        std::int64_t ld_in, std::int64_t R, int F, cudaStream_t stream);

/**
 * @brief dgate = dact·up·silu'(gate), dup = dact·silu(gate), with
 * silu'(g) = σ(g)·(1 + g·(1 − σ(g))). Overwrites dgate/dup. They may alias gate/up exactly
 * (in place, same pointers and strides): each element is read before it is written by the same
 * thread.
 * @param dgate, dup (R, F), row stride ld_dgu   @param dact (R, F), row stride ld_dact
 */
void swiglu_backward(__nv_bfloat16* dgate, __nv_bfloat16* dup, std::int64_t ld_dgu,
                     const __nv_bfloat16* dact, std::int64_t ld_dact, const __nv_bfloat16* gate,
                     const __nv_bfloat16* up, std::int64_t ld_in, std::int64_t R, int F,
                     cudaStream_t stream);

}  // namespace ght::kernels::cuda
