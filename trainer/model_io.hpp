#pragma once
/**
 * @file model_io.hpp
 * @brief Moving a model between checkpoints, Hugging Face directories and memory.
 *
 * Hugging Face export writes config.json (Qwen3MoeForCausalLM) and model.safetensors in fp32
 * (sharded with model.safetensors.index.json when larger than the shard limit), with the exact
 * HF tensor names; lm_head.weight is written only for untied embeddings.
 */
#include <string>

#include "trainer/model.hpp"
#include "trainer/train_config.hpp"

namespace ght::trainer {

/// The model stored in a checkpoint (weights and its resolved config): `ckpt_or_run` is a
/// checkpoint directory, or a run directory (its newest checkpoint that loads). Only the weights
/// and JSON files are read. @throws ght::io_error when nothing loadable is found
[[nodiscard]] MoEModel<float> load_model_from_checkpoint(const std::string& ckpt_or_run,
                                                         TrainConfig* cfg_out = nullptr);

/// Write config.json + safetensors for Qwen3MoeForCausalLM.
void export_hf(const MoEModel<float>& model, const std::string& dir);

/// Read config.json + safetensors; every tensor must be present with the right shape.
/// @throws ght::io_error naming the directory and the tensor
[[nodiscard]] MoEModel<float> import_hf(const std::string& dir);

}  // namespace ght::trainer
