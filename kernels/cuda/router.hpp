#pragma once
/**
 * @file router.hpp
 * @brief MoE router on the GPU, mirroring kernels/cpu/router.hpp: logits = x·Wr^T (cuBLASLt,
 * fp32 output), fp32 softmax, top-k (descending probability, ties to the lower expert index),
 * optional renormalisation of the top-k weights, the load-balance (aux) loss
 * E·sum_e (c_e/N)·(P_e/N) and the z-loss mean_t lse_t², forward and backward.
 *
 * Nothing synchronises with the host: the two losses land in a device buffer. Blocks route
 * contiguous ranges of tokens; reductions over tokens use fixed per-block partial sums added in
 * block order (deterministic), and the counts c_e per-block integer histograms (exact). Supports
 * E <= 256 experts and 1 <= K <= min(E, 32).
 *
 * router_route_forward fuses router_forward with the permutation that follows it
 * (kernels/cuda/permute.hpp: moe_permute_plan and moe_permute_forward): the per-block histograms
 * are the tiles of the stable counting sort, one block scans them together with the losses, and
 * the scatter kernel gathers each row as it places it. Logits GEMM + 3 kernels instead of
 * GEMM + memset + 2 + 3 + 1; every output is bit-identical to the separate calls.
 *
 * The backward forms dlogits (N, E) in fp32 and rounds it to bf16 for the two cuBLASLt GEMMs
 * dx += dlogits·Wr and dWr += dlogits^T·x (bf16 inputs, fp32 accumulation).
 *
 * FLOPs: 2·N·C·E (logits) + ~(6 + 2K)·N·E; backward 4·N·C·E + ~8·N·E.
 * Bytes: 2·N·C + 2·E·C + 4·N·E·2 + 8·N·K (forward); the fused call adds the gather's
 * 2·(N·C + N·K·C) (none when RoutePermutation::xp is null) and 12·N·K for the plan, as the separate calls do, and saves re-reading
 * topk_idx (4·N·K twice) and the plan's tile histogram pass.
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

/// The permutation outputs of router_route_forward: moe_permute_plan's and moe_permute_forward's.
struct RoutePermutation {
  std::int32_t* expert_offsets = nullptr;  ///< (E+1) exclusive scan of the counts; [E] = N·K
  std::int32_t* src_token = nullptr;       ///< (N·K) permuted row -> source token
  std::int32_t* dst_row = nullptr;         ///< (N·K) assignment t·K + k -> permuted row
  /// (N·K, C) x gathered into expert order, or nullptr: no rows are gathered (the plan is still
  /// written), for a consumer that scatters x itself, e.g. quantize_fp8_rows_scatter
  /// (kernels/cuda/fp8_quant.hpp) for the FP8 experts.
  __nv_bfloat16* xp = nullptr;
};

/**
 * @brief router_forward, then moe_permute_plan(topk_idx) and moe_permute_forward(x), fused;
 * identical outputs (no expert_counts: expert_offsets holds them). Nothing syncs with the host.
 * With perm.xp == nullptr the gather is left out and every other output is the same.
 * @throws ght::logic_error on bad sizes (as router_forward; N·K must fit int32) or a null
 *         expert_offsets, src_token or dst_row
 */
void router_route_forward(float* logits, float* probs, std::int32_t* topk_idx, float* topk_w,
                          RouterLossesDevice* losses, const RoutePermutation& perm,
                          const __nv_bfloat16* x, const __nv_bfloat16* wr, std::int64_t N, int C,
                          int E, int K, bool norm_topk_prob, cudaStream_t stream);

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
