#pragma once
/**
 * @file attention.hpp
 * @brief Causal grouped-query attention on the GPU, forward and backward; mirrors
 * kernels/cpu/attention.hpp (scale 1/sqrt(D), query head h uses kv head h / (H/KV), query i sees
 * key j iff j <= i and, with doc_ids, doc_ids[b, j] == doc_ids[b, i]; lse saved for the backward).
 *
 * Three implementations behind one call:
 *   cudnn          cuDNN's fused flash attention (SDPA) through cudnn-frontend's graph API
 *                  (cudnn_frontend/attention_sdpa.cpp; builds that found the nvidia-cudnn-frontend
 *                  headers): the frontend's sdpa / sdpa_backward nodes, bf16 I/O, fp32 stats,
 *                  one built graph cached per shape. A build without cudnn-frontend runs
 *                  cudnn_backend for this request (and reports cudnn_backend as what ran).
 *   cudnn_backend  the same fused SDPA through cuDNN's backend descriptors, the operation graph
 *                  written out by hand (attention_cudnn.cpp), execution plans cached by shape.
 *   fallback       straightforward CUDA kernels (attention.cu): warp per query (forward, dq) or
 *                  per key (dk, dv), keys/queries staged through shared memory in tiles of 32,
 *                  fp32 math, online softmax; any even D <= 256, doc_ids supported. Correct, not
 *                  fast. Deterministic (no atomics).
 *   automatic      cudnn, then cudnn_backend, then fallback: the first whose shape is supported
 *                  and for which cuDNN builds a plan.
 * Both cuDNN paths need plain causal masking (no doc_ids), head_dim <= 128 and a multiple of 8,
 * row strides multiples of 8.
 *
 * Tensors are token-major: q/out (B, T, H, D), k/v (B, T, KV, D). Row strides (elements between
 * consecutive tokens; 0 = packed H·D or KV·D) let q, k, v be slices of a fused qkv projection.
 * lse is (B, H, T) fp32 natural-log logsumexp of the scaled scores, as the CPU op saves it.
 *
 * FLOPs (causal): forward 2·B·H·T²·D (≈ 4·B·H·D·T²/2), backward 2.5x that. Bytes: forward
 * 2·(2·B·T·H·D + 2·B·T·KV·D) + 4·B·H·T.
 */
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ght::kernels::cuda {

enum class AttentionImpl : int { automatic = 0, cudnn = 1, fallback = 2, cudnn_backend = 3 };

[[nodiscard]] std::string_view to_string(AttentionImpl impl) noexcept;

struct AttentionShape {
  int B = 0, T = 0, H = 0, KV = 0, D = 0;
  /// Row strides in elements (0 = packed): q_row/o_row for (B,T,H,D) tensors, k_row/v_row for
  /// (B,T,KV,D). The same strides apply to the gradients (dq, dout like q/out; dk, dv like k, v).
  std::int64_t q_row = 0, k_row = 0, v_row = 0, o_row = 0;
};

/**
 * @brief out, lse = attention(q, k, v).
 * @param out (B, T, H, D) overwritten   @param lse (B, H, T) fp32 overwritten
 * @param doc_ids (B, T) device ids or nullptr (plain causal; cuDNN needs nullptr)
 * @return the implementation that ran (never automatic)
 * @throws ght::logic_error on bad shapes or when `impl` = cudnn/cudnn_backend cannot run this case;
 *         ght::cuda_error on CUDA/cuDNN failures
 */
AttentionImpl attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q,
                                const __nv_bfloat16* k, const __nv_bfloat16* v,
                                const std::int32_t* doc_ids, const AttentionShape& shape,
                                AttentionImpl impl, cudaStream_t stream);

/**
 * @brief Backward of attention_forward; dq, dk, dv are overwritten. Use the same implementation
 * as the forward (the lse of every implementation agrees, so mixing is allowed but pointless).
 * @param dout (B, T, H, D)   @param out, lse as produced by the forward
 */
AttentionImpl attention_backward(__nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv,
                                 const __nv_bfloat16* dout, const __nv_bfloat16* q,
                                 const __nv_bfloat16* k, const __nv_bfloat16* v,
                                 const __nv_bfloat16* out, const float* lse,
                                 const std::int32_t* doc_ids, const AttentionShape& shape,
                                 AttentionImpl impl, cudaStream_t stream);

/// Whether this build has cuDNN and the shape/layout is one the cuDNN paths accept (they may still
/// fail to find an engine at run time; automatic then falls back).
[[nodiscard]] bool cudnn_attention_supported(const AttentionShape& shape, bool has_doc_ids);

/// Drop cached cuDNN plans and handles (tests and shutdown; no attention may be in flight).
void release_attention_resources();

namespace detail {
// The backend-descriptor path: attention_cudnn.cpp (or throwing stubs when cuDNN is absent).
bool cudnn_attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q,
                             const __nv_bfloat16* k, const __nv_bfloat16* v,
                             const AttentionShape& s, cudaStream_t stream, bool throw_on_failure);
bool cudnn_attention_backward(__nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv,
                              const __nv_bfloat16* dout, const __nv_bfloat16* q,
                              const __nv_bfloat16* k, const __nv_bfloat16* v,
                              const __nv_bfloat16* out, const float* lse,
                              const AttentionShape& s, cudaStream_t stream, bool throw_on_failure);
void cudnn_attention_release();  ///< both cuDNN paths' plans and the handles
bool cudnn_attention_compiled();  ///< false when built without cuDNN headers
// The cudnn-frontend path: cudnn_frontend/attention_sdpa.cpp (stubs in attention_cudnn.cpp when
// the build has no cudnn-frontend). Same contract as the two above.
bool cudnn_frontend_attention_forward(__nv_bfloat16* out, float* lse, const __nv_bfloat16* q,
                                      const __nv_bfloat16* k, const __nv_bfloat16* v,
                                      const AttentionShape& s, cudaStream_t stream,
                                      bool throw_on_failure);
bool cudnn_frontend_attention_backward(__nv_bfloat16* dq, __nv_bfloat16* dk, __nv_bfloat16* dv,
                                       const __nv_bfloat16* dout, const __nv_bfloat16* q,
                                       const __nv_bfloat16* k, const __nv_bfloat16* v,
                                       const __nv_bfloat16* out, const float* lse,
                                       const AttentionShape& s, cudaStream_t stream,
                                       bool throw_on_failure);
void cudnn_frontend_attention_release_locked();  ///< with detail::cudnn_attention_mutex() held
bool cudnn_frontend_attention_compiled();         ///< false when built without cudnn-frontend

/// The buffers of one attention call, forward (q, k, v, out, lse) or backward (all of them).
struct AttentionTensors {
  const __nv_bfloat16 *q = nullptr, *k = nullptr, *v = nullptr;
  __nv_bfloat16* out = nullptr;
  float* lse = nullptr;
  const __nv_bfloat16* dout = nullptr;
  __nv_bfloat16 *dq = nullptr, *dk = nullptr, *dv = nullptr;
};
/// One engine configuration of a survey: cuDNN's name for it (engine and knobs) and its median
/// time, or ms < 0 with `error` when it did not build or run.
struct CudnnPlanTiming {
  std::string name, error;
  double ms = -1;
};
/**
 * @brief A measurement aid (bench/kernels/bench_attention_plans.cpp): every engine
 * configuration cudnn-frontend offers for the forward or backward of `s` (heuristics mode A,
 * BuildPlanPolicy_t::ALL, in the heuristics' order: index 0 is the one the cudnn path runs),
 * each run on `t` and timed (median of `iters` after a warm-up). Synchronises `stream`.
 * @throws ght::logic_error in a build without cudnn-frontend; ght::cuda_error when no
 *         configuration builds
 */
std::vector<CudnnPlanTiming> cudnn_frontend_attention_plan_times(bool backward, const AttentionTensors& t,
                                                                 const AttentionShape& s, int iters,
                                                                 cudaStream_t stream);
}  // namespace detail

}  // namespace ght::kernels::cuda
