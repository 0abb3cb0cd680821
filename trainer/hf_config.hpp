#pragma once
/**
 * @file hf_config.hpp
 * @brief config.json for Hugging Face `Qwen3MoeForCausalLM` <-> ModelConfig.
 *
 * Field mapping (transformers' Qwen3MoeConfig):
 *   d_model -> hidden_size            layers -> num_hidden_layers
 *   heads -> num_attention_heads      kv_heads -> num_key_value_heads      head_dim -> head_dim
 *   experts -> num_experts            top_k -> num_experts_per_tok
 *   expert_ffn -> moe_intermediate_size (and intermediate_size, unused when every layer is MoE)
 *   norm_topk_prob, rope_theta (also as rope_parameters for transformers 5), vocab -> vocab_size,
 *   tied_embeddings -> tie_word_embeddings, rms_eps -> rms_norm_eps,
 *   aux_loss_coef -> router_aux_loss_coef
 * Fixed: decoder_sparse_step 1, mlp_only_layers [], hidden_act "silu", attention_bias false,
 * no sliding window. Fields transformers has no name for (z_loss_coef, seq_len, micro_batch,
 * grad_accum, name) travel in a "ghtier" object, which transformers keeps but ignores.
 */
#include <nlohmann/json.hpp>
#include <string>

#include "trainer/model_config.hpp"

namespace ght::trainer {

struct HfConfigOptions {
  int bos_token_id = 0;  ///< the byte tokenizer's EOT (byte 0) starts every document
  int eos_token_id = 0;
  int max_position_embeddings = 0;  ///< 0: the model's seq_len
  std::string torch_dtype = "float32";
};

/// @brief config.json contents for this model. @throws ght::logic_error if cfg is invalid
[[nodiscard]] nlohmann::ordered_json to_hf_config(const ModelConfig& cfg,
                                                  const HfConfigOptions& opt = {});
/// @brief Write `dir/config.json` atomically. @throws ght::io_error
void write_hf_config(const std::string& dir, const ModelConfig& cfg, const HfConfigOptions& opt = {});

/// @brief A ModelConfig from config.json contents.
/// @param source names the file in error messages
/// @throws ght::io_error naming source and the field: missing required fields, wrong types, and
///         anything this trainer cannot reproduce (another model_type, non-MoE layers, shared
///         experts, attention bias, sliding window, rope scaling, another activation)
[[nodiscard]] ModelConfig from_hf_config(const nlohmann::json& j, const std::string& source = "config.json");
/// @brief Read `path` (a config.json, or a directory holding one).
[[nodiscard]] ModelConfig read_hf_config(const std::string& path);

}  // namespace ght::trainer
