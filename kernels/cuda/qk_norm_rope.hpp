#pragma once
/**
 * @file qk_norm_rope.hpp
 * @brief Qwen3 QK-RMSNorm (per head over head_dim, one (D) weight shared by all heads) fused with
 * RoPE (Hugging Face rotate_half convention), forward and backward; mirrors
 * kernels/cpu/qk_norm_rope.hpp. bf16 storage, fp32 math; the rotation angles pos·theta^(-2i/D)
 * are formed in double and their cos/sin rounded to fp32, like the CPU op.
 *
 * Row strides let q and k be read from and written to slices of a fused qkv buffer: token t's
 * head h starts at x + t·ld_x + h·D.
 *
 * The _qk variants run a layer's q heads and k heads (two sets, each with its own weight, rows
 * and rstd) in one launch each way, sharing every token's cos/sin: bit-identical to one call per
 * set. The backward runs blocks of 16 warps over contiguous token ranges (a grid that depends
 * only on N) and reduces dw per block, then over the blocks in order: deterministic.
 *
 * FLOPs ≈ 12·N·H·D forward, 20·N·H·D backward; bytes 2·2·N·H·D forward, 2·4·N·H·D backward.
 */
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ght::kernels::cuda {

/**
 * @brief pos[b·T + t] = t, or t minus the start of its document when doc_ids is given (a
 * document is a run of equal ids within one row). Device version of cpu::make_positions.
 * @param pos (B·T) overwritten   @param doc_ids (B, T) or nullptr
 */
void make_positions(std::int32_t* pos, const std::int32_t* doc_ids, int B, int T,
                    cudaStream_t stream);

/**
 * @brief out = rope(rmsnorm_per_head(x)·w).
 * @param out (N, H, D) with row stride ld_out (elements between tokens; 0 = H·D); may equal x
 *        with the same stride (in place)
 * @param rstd (N, H) fp32, overwritten
 * @param x (N, H, D) with row stride ld_x (0 = H·D)   @param w (D)   @param pos (N)
 * @throws ght::logic_error unless D is even and D <= 256
 */
void qk_norm_rope_forward(__nv_bfloat16* out, std::int64_t ld_out, float* rstd,
                          const __nv_bfloat16* x, std::int64_t ld_x, const __nv_bfloat16* w,
                          const std::int32_t* pos, std::int64_t N, int H, int D, float eps,
                          double theta, cudaStream_t stream);

/// One head set (a layer's q or its k) of qk_norm_rope_forward_qk; fields as in
/// qk_norm_rope_forward. heads = 0: no set.
struct QkNormRopeHeads {
  __nv_bfloat16* out = nullptr;
  std::int64_t ld_out = 0;
  float* rstd = nullptr;
  const __nv_bfloat16* x = nullptr;
  std::int64_t ld_x = 0;
  const __nv_bfloat16* w = nullptr;
  int heads = 0;
};

/// qk_norm_rope_forward of both sets in one launch. @throws ght::logic_error as the single call
void qk_norm_rope_forward_qk(const QkNormRopeHeads& q, const QkNormRopeHeads& k,
                             const std::int32_t* pos, std::int64_t N, int D, float eps,
                             double theta, cudaStream_t stream);

/**
 * @brief Backward of qk_norm_rope_forward.
 * @param dx (N, H, D) OVERWRITTEN (like the CPU op), row stride ld_dx; may equal dout (in place)
 * @param dw (D) accumulated (+=), fp32 or bf16, deterministic
 * @param dout (N, H, D), row stride ld_dout   @param x, w, rstd, pos as in the forward
 */
void qk_norm_rope_backward(__nv_bfloat16* dx, std::int64_t ld_dx, float* dw,
                           const __nv_bfloat16* dout, std::int64_t ld_dout,
                           const __nv_bfloat16* x, std::int64_t ld_x, const __nv_bfloat16* w,
                           const float* rstd, const std::int32_t* pos, std::int64_t N, int H,
                           int D, double theta, cudaStream_t stream);
void qk_norm_rope_backward(__nv_bfloat16* dx, std::int64_t ld_dx, __nv_bfloat16* dw,
                           const __nv_bfloat16* dout, std::int64_t ld_dout,
                           const __nv_bfloat16* x, std::int64_t ld_x, const __nv_bfloat16* w,
                           const float* rstd, const std::int32_t* pos, std::int64_t N, int H,
                           int D, double theta, cudaStream_t stream);

/// One head set of qk_norm_rope_backward_qk; fields as in qk_norm_rope_backward. heads = 0: none.
template <class DW>
struct QkNormRopeGradHeads {
  __nv_bfloat16* dx = nullptr;
  std::int64_t ld_dx = 0;
  DW* dw = nullptr;
  const __nv_bfloat16* dout = nullptr;
  std::int64_t ld_dout = 0;
  const __nv_bfloat16* x = nullptr;
  std::int64_t ld_x = 0;
  const __nv_bfloat16* w = nullptr;
  const float* rstd = nullptr;
  int heads = 0;
};

/// qk_norm_rope_backward of both sets in one launch (plus one dw reduction per set).
void qk_norm_rope_backward_qk(const QkNormRopeGradHeads<float>& q,
                              const QkNormRopeGradHeads<float>& k, const std::int32_t* pos,
                              std::int64_t N, int D, double theta, cudaStream_t stream);
void qk_norm_rope_backward_qk(const QkNormRopeGradHeads<__nv_bfloat16>& q,
                              const QkNormRopeGradHeads<__nv_bfloat16>& k,
                              const std::int32_t* pos, std::int64_t N, int D, double theta,
                              cudaStream_t stream);

}  // namespace ght::kernels::cuda
