#pragma once
/**
 * @file model_config.hpp
 * @brief The MoE model configuration (Qwen3-MoE compatible) and its presets.
 *
 * Presets: tiny (trains on 2 CPU cores in minutes), small (HF parity and GPU learning checks),
 * bench-h200 (the seed's per-layer shape with 10 layers and 48 experts, 5.85B parameters: the model
 * of configs/bench-h200.toml and bench/train_gpu.sh), bench-h200-14l (the same with 14 layers,
 * 7.94B, fp32 master/m/v 88.7 GiB on the host) and seed-21b (30 layers, 64 experts, top-4, tied vocab 151,936:
 * 21.0B total / 3.36B active parameters counting embeddings in both, as the seed's author does).
 */
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ght::trainer {

struct ModelConfig {
  std::string name = "custom";
  // ---- architecture ----
  int d_model = 64;
  int layers = 2;
  int heads = 4;          ///< query heads
  int kv_heads = 2;       ///< GQA key/value heads (heads % kv_heads == 0)
  int head_dim = 16;
  int experts = 4;
  int top_k = 2;
  int expert_ffn = 64;    ///< SwiGLU hidden size per expert
  bool norm_topk_prob = true;
  double rope_theta = 10000.0;
  int vocab = 256;
  bool tied_embeddings = true;
  double rms_eps = 1e-6;
  double aux_loss_coef = 0.01;   ///< load-balance loss coefficient
  double z_loss_coef = 0.001;    ///< router z-loss coefficient
  // ---- training shape ----
  int seq_len = 128;
  int micro_batch = 8;
  int grad_accum = 1;
  /// micro_batch was set by a file or an override (not only by the preset): the plan keeps it.
  /// Unset, the plan on a GPU machine may fold accumulation steps into larger micro-batches at the
  /// same tokens per step (trainer/plan_decide.hpp). Not part of the configuration's JSON.
  bool micro_batch_pinned = false;

  /// Throws ght::logic_error naming the field (and its valid range) when a value is out of range,
  /// not finite, or the shape is inconsistent.
  void validate() const;

  // ---- parameter counts ----
  [[nodiscard]] std::int64_t embedding_params() const;  ///< vocab·d (once if tied, twice if not)
  [[nodiscard]] std::int64_t attention_params_per_layer() const;  ///< q,k,v,o + q/k norms
  [[nodiscard]] std::int64_t expert_params() const;  ///< one SwiGLU expert: 3·d·ffn
  [[nodiscard]] std::int64_t layer_dense_params() const;  ///< attention + router + 2 norms
  [[nodiscard]] std::int64_t total_params() const;  ///< everything, embeddings included
  /// Parameters touched per token: embeddings + dense + top_k experts per layer + final norm.
  [[nodiscard]] std::int64_t active_params() const;
  /// Active parameters excluding embeddings and LM head (the N in the MFU formula).
  [[nodiscard]] std::int64_t active_nonembedding_params() const;
  /// Training FLOPs per token: 6·N_active_nonembedding + 12·L·H·d_head·T (DESIGN.md).
  [[nodiscard]] double flops_per_token() const;
  /// The seed's counting, reported beside the strict one so that comparisons with it are direct:
  /// 6·N_active with the embeddings (and an untied LM head) + 12·L·T·d_model.
  [[nodiscard]] double seed_flops_per_token() const;
  [[nodiscard]] std::int64_t tokens_per_step() const {
    return static_cast<std::int64_t>(seq_len) * micro_batch * grad_accum;
  }
};

/// The valid range of an integer ModelConfig field, by member name ("d_model").
struct IntFieldRange {
  std::string_view field;
  std::int64_t lo, hi;
};
/// Every integer field of ModelConfig with its range; validate() enforces them, and the TOML and
/// override parsers check values against them before narrowing to int.
[[nodiscard]] const std::vector<IntFieldRange>& model_int_ranges();
/// The range of integer field `field`; nullptr when it is not an integer field.
[[nodiscard]] const IntFieldRange* model_int_range(std::string_view field);

/// Names of the built-in presets.
[[nodiscard]] const std::vector<std::string>& preset_names();
/// A built-in preset; throws ght::logic_error listing the valid names for an unknown one.
[[nodiscard]] ModelConfig preset(std::string_view name);

}  // namespace ght::trainer
