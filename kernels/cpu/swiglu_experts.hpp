#pragma once
/**
 * @file swiglu_experts.hpp
 * @brief SwiGLU expert MLPs over permuted tokens: y = down(silu(gate(x)) · up(x)) per expert,
 * HF Qwen3-MoE layout: gate_proj (F, C), up_proj (F, C), down_proj (C, F), silu(g) = g·σ(g).
 *
 * Expert e's weights are at w_gate + e·expert_stride, w_up + e·expert_stride and
 * w_down + e·expert_stride. With the model's flat layout (per expert: gate, up, down, contiguous)
 * expert_stride = 3·F·C and the three pointers are expert 0's tensors; a stacked (E, F, C)
 * layout uses expert_stride = F·C. Gradients use the same stride.
 */
#include <cstdint>

namespace ght::kernels::cpu {

/**
 * @param y (R, C) overwritten, R = expert_offsets[E]
 * @param gate (R, F) overwritten: xp·Wg^T, kept for the backward
 * @param up (R, F) overwritten: xp·Wu^T, kept for the backward
 * @param act (R, F) overwritten: silu(gate)·up, kept for the backward (down_proj's input)
 * @param xp (R, C) tokens in expert order (permute.hpp)
 * @param expert_offsets (E+1) expert e owns rows [off[e], off[e+1])
 */
template <class T>
void swiglu_experts_forward(T* y, T* gate, T* up, T* act, const T* xp, const T* w_gate,
                            const T* w_up, const T* w_down, std::int64_t expert_stride,
                            const std::int32_t* expert_offsets, int E, int C, int F);

/**
 * @param dxp (R, C) overwritten
 * @param dw_gate, dw_up, dw_down accumulated (+=), laid out like the weights (same stride)
 * @param dy (R, C)
 */
template <class T>
void swiglu_experts_backward(T* dxp, T* dw_gate, T* dw_up, T* dw_down, const T* dy, const T* xp,
                             const T* gate, const T* up, const T* act, const T* w_gate,
                             const T* w_up, const T* w_down, std::int64_t expert_stride,
                             const std::int32_t* expert_offsets, int E, int C, int F);

}  // namespace ght::kernels::cpu
