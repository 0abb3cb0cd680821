#pragma once
/**
 * @file fp8_experts.hpp
 * @brief GHT_FP8: the MoE experts' forward in block-scaled FP8, as the CUDA model runs it and as
 * the plan counts it. One place for its sizes and its time.
 *
 * With GHT_FP8=experts the two grouped GEMMs of each layer's experts (gate/up: (R, d) x (2F, d)^T,
 * down: (R, F) x (d, F)^T, R = tokens x top_k routed rows) run in e4m3 with fp32 accumulation
 * (kernels/cuda/expert_gemm_fp8.hpp):
 *   - weights: quantised once per step, at the first forward of each layer after the weights
 *     changed, per 128 x 128 block, into FP8 copies that every layer keeps in HBM until the next
 *     update (1 B per expert weight, 4 B per block scale);
 *   - activations: per 1 x 128 tile, into one shared buffer (its largest use: R x max(d, F) codes),
 *     by the kernels that make them: the permutation scatters each token's codes to its K rows
 *     (no bf16 copy in expert order: the backward gathers its own), and SwiGLU writes its output's
 *     codes beside the bf16 one that the backward keeps.
 * The backward is unchanged: bf16 GEMMs on the bf16 weights and the saved bf16 activations.
 */
#include <cstddef>
#include <cstdint>
#include <string>

#include "tier/plan.hpp"
#include "trainer/model_config.hpp"

namespace ght::trainer {

/// Which GEMMs run in FP8 (GHT_FP8).
enum class Fp8Gemms { off, experts };
[[nodiscard]] Fp8Gemms fp8_gemms_from_config();

/// Why the FP8 expert GEMMs cannot take this model's shapes (the grouped GEMM reads e4m3 rows in
/// 16-byte units: d_model and expert_ffn must be multiples of 16), naming the field; empty when
/// they can.
[[nodiscard]] std::string fp8_shape_refusal(const ModelConfig& cfg);

/// Why this process cannot run the FP8 expert GEMMs (a build without CUDA or CUTLASS, no CUDA
/// device, a device that is not sm_90); empty when it can.
[[nodiscard]] std::string fp8_unavailable_here();

/// Device bytes of the FP8 expert forward for micro-batches of `tokens` tokens (0 =
/// cfg.micro_batch x cfg.seq_len).
struct Fp8ExpertSizes {
  std::size_t weight_codes = 0;   ///< every layer's experts: layers x experts x 3 x d x F
  std::size_t weight_scales = 0;  ///< fp32, per expert ceil(2F/128)·ceil(d/128) + ceil(d/128)·ceil(F/128)
  std::size_t act_codes = 0;      ///< R x max(d, F)
  std::size_t act_scales = 0;     ///< fp32, R x ceil(max(d, F) / 128)
  [[nodiscard]] std::size_t total() const { return weight_codes + weight_scales + act_codes + act_scales; }
};
[[nodiscard]] Fp8ExpertSizes fp8_expert_sizes(const ModelConfig& cfg, std::int64_t tokens = 0);

/// Per-expert scale counts of one layer's gate/up and down weights (128 x 128 blocks).
[[nodiscard]] std::size_t fp8_gate_up_scales(const ModelConfig& cfg);
[[nodiscard]] std::size_t fp8_down_scales(const ModelConfig& cfg);

/// The experts' forward FLOPs per step: 2 x 3·d·F per routed row, tokens_per_step x top_k rows in
/// each layer.
[[nodiscard]] double fp8_expert_forward_flops(const ModelConfig& cfg);

/**
 * @brief Forward seconds per step that FP8 experts save: their FLOPs at `assumed_tflops` less the
 * same at `speedup` times that rate, less one pass over the weights per step (2 B read, 1 B and
 * the scales written) at `hbm_bps`. Negative where the quantisation costs more than it saves.
 */
[[nodiscard]] double fp8_saved_seconds(const ModelConfig& cfg, double assumed_tflops, double speedup,
                                       double hbm_bps);

/// Sets options.fp8_hbm_bytes and options.fp8_saved_seconds from GHT_FP8 and
/// GHT_ASSUMED_FP8_GEMM (both 0 with GHT_FP8=off or without a GPU link).
void add_fp8_reservation(tier::PlanOptions& options, const ModelConfig& cfg);

}  // namespace ght::trainer
