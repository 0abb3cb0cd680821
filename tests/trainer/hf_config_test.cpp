// config.json for Qwen3MoeForCausalLM: field names and values, round trips of every preset, a
// real Qwen3-30B-A3B config, and clear errors for what the trainer cannot reproduce.
#include "trainer/hf_config.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "common/expect.hpp"
#include "tier/error.hpp"

namespace fs = std::filesystem;
using namespace ght::trainer;
using nlohmann::json;

namespace {

using ght::test::error_of;

void expect_same(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.d_model, b.d_model);
  EXPECT_EQ(a.layers, b.layers);
  EXPECT_EQ(a.heads, b.heads);
  EXPECT_EQ(a.kv_heads, b.kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.experts, b.experts);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.expert_ffn, b.expert_ffn);
  EXPECT_EQ(a.norm_topk_prob, b.norm_topk_prob);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.tied_embeddings, b.tied_embeddings);
  EXPECT_EQ(a.rms_eps, b.rms_eps);
  EXPECT_EQ(a.aux_loss_coef, b.aux_loss_coef);
  EXPECT_EQ(a.z_loss_coef, b.z_loss_coef);
  EXPECT_EQ(a.seq_len, b.seq_len);
  EXPECT_EQ(a.micro_batch, b.micro_batch);
  EXPECT_EQ(a.grad_accum, b.grad_accum);
}

// Qwen/Qwen3-30B-A3B's published config.json (transformers 4.51).
const char* kQwen3_30B = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
  "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [],
  "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": true,
  "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
  "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

json small_config() { return json(to_hf_config(preset("small"))); }

}  // namespace

TEST(HfConfig, WritesQwen3MoeFieldNames) {
  ModelConfig c = preset("small");
  c.rope_theta = 500000.0;
  c.aux_loss_coef = 0.02;
  const json j = json(to_hf_config(c, {.bos_token_id = 0, .eos_token_id = 0, .max_position_embeddings = 4096}));
  EXPECT_EQ(j["architectures"], json::array({"Qwen3MoeForCausalLM"}));
  EXPECT_EQ(j["model_type"], "qwen3_moe");
  EXPECT_EQ(j["hidden_size"], c.d_model);
  EXPECT_EQ(j["num_hidden_layers"], c.layers);
  EXPECT_EQ(j["num_attention_heads"], c.heads);
  EXPECT_EQ(j["num_key_value_heads"], c.kv_heads);
  EXPECT_EQ(j["head_dim"], c.head_dim);
  EXPECT_EQ(j["num_experts"], c.experts);
  EXPECT_EQ(j["num_experts_per_tok"], c.top_k);
  EXPECT_EQ(j["moe_intermediate_size"], c.expert_ffn);
  EXPECT_EQ(j["intermediate_size"], c.expert_ffn);
  EXPECT_EQ(j["norm_topk_prob"], c.norm_topk_prob);
  EXPECT_EQ(j["rope_theta"], 500000.0);
  EXPECT_EQ(j["rope_parameters"], (json{{"rope_type", "default"}, {"rope_theta", 500000.0}}));
  EXPECT_EQ(j["vocab_size"], 256);
  EXPECT_EQ(j["tie_word_embeddings"], c.tied_embeddings);
  EXPECT_EQ(j["rms_norm_eps"], c.rms_eps);
  EXPECT_EQ(j["router_aux_loss_coef"], 0.02);
  EXPECT_EQ(j["max_position_embeddings"], 4096);
  EXPECT_EQ(j["decoder_sparse_step"], 1);
  EXPECT_EQ(j["mlp_only_layers"], json::array());
  EXPECT_EQ(j["hidden_act"], "silu");
  EXPECT_EQ(j["attention_bias"], false);
  EXPECT_EQ(j["use_sliding_window"], false);
  EXPECT_EQ(j["torch_dtype"], "float32");
  EXPECT_EQ(j["bos_token_id"], 0);
  EXPECT_EQ(j["eos_token_id"], 0);
  // max_position_embeddings defaults to the training sequence length.
  EXPECT_EQ(to_hf_config(c)["max_position_embeddings"], c.seq_len);
}

TEST(HfConfig, EveryPresetRoundTrips) {
  for (const auto& name : preset_names()) {
    SCOPED_TRACE(name);
    ModelConfig c = preset(name);
    c.norm_topk_prob = !c.norm_topk_prob;  // a non-default value must survive too
    c.z_loss_coef = 0.0025;
    expect_same(from_hf_config(json(to_hf_config(c))), c);
  }
}

TEST(HfConfig, WriteAndReadAFile) {
  std::string t = (fs::temp_directory_path() / "ght_hf_test_XXXXXX").string();
  const fs::path dir = ::mkdtemp(t.data());
  ModelConfig c = preset("tiny");
  c.tied_embeddings = false;
  write_hf_config(dir.string(), c);
  expect_same(read_hf_config(dir.string()), c);
  expect_same(read_hf_config((dir / "config.json").string()), c);
  fs::remove_all(dir);
  EXPECT_CONTAINS(error_of<ght::io_error>([&] { (void)read_hf_config((dir / "config.json").string()); }),
                  "config.json");
}

TEST(HfConfig, ReadsThePublishedQwen3_30B_A3B) {
  const ModelConfig c = from_hf_config(json::parse(kQwen3_30B));
  EXPECT_EQ(c.d_model, 2048);
  EXPECT_EQ(c.layers, 48);
  EXPECT_EQ(c.heads, 32);
  EXPECT_EQ(c.kv_heads, 4);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.experts, 128);
  EXPECT_EQ(c.top_k, 8);
  EXPECT_EQ(c.expert_ffn, 768);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_EQ(c.vocab, 151936);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_EQ(c.rms_eps, 1e-6);
  EXPECT_EQ(c.aux_loss_coef, 0.001);
}

TEST(HfConfig, DefaultsFollowTransformers) {
  json j = json::parse(kQwen3_30B);
  for (const char* k : {"head_dim", "num_key_value_heads", "norm_topk_prob", "tie_word_embeddings", "rope_theta"}) {
    j.erase(k);
  }
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 250000.0}};  // transformers 5 style
  const ModelConfig c = from_hf_config(j);
  EXPECT_EQ(c.head_dim, 2048 / 32);
  EXPECT_EQ(c.kv_heads, 32);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_EQ(c.rope_theta, 250000.0);
  j.erase("num_experts");
  j["num_local_experts"] = 64;
  EXPECT_EQ(from_hf_config(j).experts, 64);
}

TEST(HfConfig, ErrorsNameTheFileAndField) {
  auto err = [](json j) { return error_of<ght::io_error>([&] { (void)from_hf_config(j, "/x/config.json"); }); };
  json j = small_config();
  j.erase("hidden_size");
  std::string m = err(j);
  EXPECT_CONTAINS(m, "/x/config.json");
  EXPECT_CONTAINS(m, "missing required field \"hidden_size\"");

  j = small_config();
  j["hidden_size"] = "256";
  EXPECT_CONTAINS(err(j), "\"hidden_size\" must be an integer");

  j = small_config();
  j["model_type"] = "qwen2_moe";
  EXPECT_CONTAINS(err(j), "qwen2_moe");

  j = small_config();
  j["architectures"] = {"LlamaForCausalLM"};
  EXPECT_CONTAINS(err(j), "LlamaForCausalLM");

  j = small_config();
  j["mlp_only_layers"] = {0, 2};
  EXPECT_CONTAINS(err(j), "mlp_only_layers");

  j = small_config();
  j["decoder_sparse_step"] = 2;
  EXPECT_CONTAINS(err(j), "decoder_sparse_step is 2");

  j = small_config();
  j["shared_expert_intermediate_size"] = 512;
  EXPECT_CONTAINS(err(j), "shared experts");

  j = small_config();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_CONTAINS(err(j), "yarn");

  j = small_config();
  j["hidden_act"] = "gelu";
  EXPECT_CONTAINS(err(j), "gelu");

  j = small_config();
  j["attention_bias"] = true;
  EXPECT_CONTAINS(err(j), "attention_bias");

  j = small_config();
  j["use_sliding_window"] = true;
  EXPECT_CONTAINS(err(j), "sliding");

  j = small_config();
  j["num_experts_per_tok"] = 99;  // more than the experts: ModelConfig::validate's message
  EXPECT_CONTAINS(err(j), "top_k");

  EXPECT_CONTAINS(err(json::array()), "not a JSON object");
}
