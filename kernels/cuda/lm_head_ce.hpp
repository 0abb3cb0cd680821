#pragma once
/**
 * @file lm_head_ce.hpp
 * @brief LM head (logits = x·W^T, W (V, C)) fused with cross-entropy, chunked over rows so that
 * the logits of more rows than one chunk never exist; mirrors kernels/cpu/lm_head_ce.hpp.
 *
 * Per chunk of `chunk_rows` rows (the workspace holds one bf16 (chunk_rows, V) logits chunk):
 *   1. logits = x_chunk·W^T                      (cuBLASLt, bf16 out, fp32 accumulation)
 *   2. one block per row: lse (fp32), the row's loss lse − logit[target], and, in the training
 *      variant, dlogits = (softmax − onehot)·dloss/n_valid written IN PLACE over the logits
 *   3. dx_chunk = dlogits·W;  dW += dlogits^T·x_chunk   (training variant)
 * The logits are bf16, as in Hugging Face (which also computes bf16 logits and upcasts them for
 * the loss); everything downstream of them is fp32. The number of valid rows and the mean loss
 * are reduced on the device in a fixed order (deterministic) and never synchronise with the host.
 *
 * Targets equal to ignore_index contribute nothing (their dx rows are zero). A target outside
 * [0, V) that is not ignore_index is treated like ignore_index (a kernel cannot throw); use
 * lm_head_ce_check_targets() to turn it into an exception.
 *
 * FLOPs: 2·N·V·C forward; 6·N·V·C forward + backward. Bytes per chunk: 2·rows·V written and
 * read twice (plus written once more as dlogits), + the GEMM operands, and in training the
 * whole dW read and written once (2·sizeof(dW)·V·C: 5 GB in fp32 at V = 151,936, C = 4096).
 * That last term is why fewer, larger chunks are faster: at rows ≲ 8·ceiling FLOP/s / (2·HBM
 * B/s) (≈ 700 on an H200) the dW GEMM moves more time's worth of bytes than it computes. One
 * chunk of all N rows accumulates dW once (trainer/regions.hpp: default_ce_chunk_rows).
 */
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ght::kernels::cuda {

/// Hugging Face / PyTorch default ignore index (same as cpu::kIgnoreIndex).
inline constexpr std::int32_t kCeIgnoreIndex = -100;

/// Bytes of workspace needed for `chunk_rows` rows of a vocabulary of V.
[[nodiscard]] std::size_t lm_head_ce_workspace_bytes(std::int64_t chunk_rows, int V);

/// Device outputs of the loss (each pointer may be null to skip it).
struct CeOutputs {
  float* loss = nullptr;          ///< device scalar: mean CE over valid rows (0 when none)
  std::int32_t* valid = nullptr;  ///< device scalar: rows whose target is not ignored
  float* lse = nullptr;           ///< (N) logsumexp of each row's logits
};

/**
 * @brief Evaluation: loss (and lse) only.
 * @param x (N, C) final-norm output   @param w (V, C) lm_head (or tied embedding) weight
 * @param targets (N) device ids   @param workspace at least lm_head_ce_workspace_bytes(chunk_rows, V)
 * @throws ght::logic_error on bad sizes or a small workspace
 */
void lm_head_ce_forward(const CeOutputs& out, const __nv_bfloat16* x, const __nv_bfloat16* w,
                        const std::int32_t* targets, std::int64_t N, int C, int V,
                        std::int32_t ignore_index, std::int64_t chunk_rows, void* workspace,
                        std::size_t workspace_bytes, cudaStream_t stream);

/**
 * @brief Training: loss plus gradients in one pass over the chunks (no logits recompute).
 * @param dx (N, C) overwritten   @param dw (V, C) accumulated (+=), fp32 or bf16 (fp32 advised:
 *        a bf16 accumulator rounds once per chunk)
 * @param dloss gradient of the loss w.r.t. the mean CE (e.g. the loss scale); dlogits carry
 *        dloss / n_valid
 * @param dw_beta 1: dW += the gradient; 0: dW = the gradient (dW is never read, so it may hold
 *        anything, NaN included: the first chunk's GEMM writes with beta 0)
 * @throws ght::logic_error unless dw_beta is 0 or 1
 */
void lm_head_ce_forward_backward(const CeOutputs& out, __nv_bfloat16* dx, float* dw,
                                 const __nv_bfloat16* x, const __nv_bfloat16* w,
                                 const std::int32_t* targets, std::int64_t N, int C, int V,
                                 float dloss, std::int32_t ignore_index, std::int64_t chunk_rows,
                                 void* workspace, std::size_t workspace_bytes,
                                 cudaStream_t stream, float dw_beta = 1.0f);
void lm_head_ce_forward_backward(const CeOutputs& out, __nv_bfloat16* dx, __nv_bfloat16* dw,
                                 const __nv_bfloat16* x, const __nv_bfloat16* w,
                                 const std::int32_t* targets, std::int64_t N, int C, int V,
                                 float dloss, std::int32_t ignore_index, std::int64_t chunk_rows,
                                 void* workspace, std::size_t workspace_bytes,
                                 cudaStream_t stream, float dw_beta = 1.0f);

/// Throw ght::logic_error naming the first row whose target is outside [0, V) and not
/// ignore_index (like the CPU op). Synchronises `stream`: a debugging and test aid.
void lm_head_ce_check_targets(const std::int32_t* targets, std::int64_t N, int V,
                              std::int32_t ignore_index, cudaStream_t stream);

}  // namespace ght::kernels::cuda
