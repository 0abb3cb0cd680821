#pragma once
/**
 * @file router.hpp
 * @brief MoE router on the GPU, mirroring kernels/cpu/router.hpp: logits = x·Wr^T (cuBLASLt,
 * fp32 output), fp32 softmax, top-k (descending probability, ties to the lower expert index),
 * optional renormalisation of the top-k weights, the load-balance (aux) loss
 * E·sum_e (c_e/N)·(P_e/N) and the z-loss mean_t lse_t², forward and backward.
 *
 * Nothing synchronises with the host: the two losses land in a device buffer. Reductions over
 * tokens use fixed per-block partial sums added in block order (deterministic); the counts c_e
 * are integer atomics (exact). Supports E <= 256 experts and 1 <= K <= min(E, 32).
 *
 * The backward forms dlogits (N, E) in fp32 and rounds it to bf16 for the two cuBLASLt GEMMs
 * dx += dlogits·Wr and dWr += dlogits^T·x (bf16 inputs, fp32 accumulation).
 *
 * FLOPs: 2·N·C·E (logits) + ~(6 + 2K)·N·E; backward 4·N·C·E + ~8·N·E.
 * Bytes: 2·N·C + 2·E·C + 4·N·E·2 + 8·N·K (forward).
 */
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace ght::kernels::cuda {

/// Device-side router losses of one layer, written by router_forward.
struct RouterLossesDevice {
  float aux;  ///< load-balance loss, E·sum_e f_e·P_e
  float z;    ///< z-loss, mean_t logsumexp(logits_t)²
};

/**
 * @param logits (N, E) fp32, overwritten   @param probs (N, E) fp32, overwritten
 * @param topk_idx (N, K) overwritten       @param topk_w (N, K) fp32, overwritten
 * @param losses one device RouterLossesDevice, overwritten
 * @param expert_counts optional (E) device int32: c_e, the number of (t, k) routed to e; nullptr
 *        skips it
 * @param x (N, C)   @param wr (E, C) `mlp.gate.weight`
 * @throws ght::logic_error on bad sizes (E > 256, K outside [1, min(E, 32)])
 */
void router_forward(float* logits, float* probs, std::int32_t* topk_idx, float* topk_w,
                    RouterLossesDevice* losses, std::int32_t* expert_counts,
                    const __nv_bfloat16* x, const __nv_bfloat16* wr, std::int64_t N, int C, int E,
                    int K, bool norm_topk_prob, cudaStream_t stream);

/**
 * @brief Backward through the combine weights, the aux loss and the z-loss into x and Wr.
 * @param dx (N, C) ACCUMULATED (+=)   @param dwr (E, C) accumulated (+=), fp32 or bf16
 * @param dtopk_w (N, K) fp32 gradient of the loss w.r.t. topk_w, or nullptr (zero)
 * @param aux_grad, z_grad d loss / d aux and d loss / d z of this layer (host scalars)
 * @param logits, probs, topk_idx, topk_w, x, wr as in / produced by the forward
 */
void router_backward(__nv_bfloat16* dx, float* dwr, const float* dtopk_w, float aux_grad,
                     float z_grad, const float* logits, const float* probs,
                     const std::int32_t* topk_idx, const float* topk_w, const __nv_bfloat16* x,
                     const __nv_bfloat16* wr, std::int64_t N, int C, int E, int K,
                     bool norm_topk_prob, cudaStream_t stream);
void router_backward(__nv_bfloat16* dx, __nv_bfloat16* dwr, const float* dtopk_w, float aux_grad,
                     float z_grad, const float* logits, const float* probs,
                     const std::int32_t* topk_idx, const float* topk_w, const __nv_bfloat16* x,
                     const __nv_bfloat16* wr, std::int64_t N, int C, int E, int K,
                     bool norm_topk_prob, cudaStream_t stream);

}  // namespace ght::kernels::cuda
