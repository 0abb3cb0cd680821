#include "trainer/model_config.hpp"

#include <algorithm>

#include "tier/error.hpp"

namespace ght::trainer {

namespace {
void expect_positive(int v, const char* field) {
  GHT_EXPECTS(v > 0, std::string("model config: ") + field + " must be > 0, got " + std::to_string(v));
}
}  // namespace

void ModelConfig::validate() const {
  expect_positive(d_model, "d_model");
  expect_positive(layers, "layers");
  expect_positive(heads, "heads");
  expect_positive(kv_heads, "kv_heads");
  expect_positive(head_dim, "head_dim");
  expect_positive(experts, "experts");
  expect_positive(top_k, "top_k");
  expect_positive(expert_ffn, "expert_ffn");
  expect_positive(vocab, "vocab");
  expect_positive(seq_len, "seq_len");
  expect_positive(micro_batch, "micro_batch");
  expect_positive(grad_accum, "grad_accum");
  GHT_EXPECTS(heads % kv_heads == 0, "model config: heads (" + std::to_string(heads) +
                                         ") must be a multiple of kv_heads (" +
                                         std::to_string(kv_heads) + ")");
  GHT_EXPECTS(top_k <= experts, "model config: top_k (" + std::to_string(top_k) +
                                    ") must be <= experts (" + std::to_string(experts) + ")");
  GHT_EXPECTS(head_dim % 2 == 0, "model config: head_dim must be even for RoPE, got " +
                                     std::to_string(head_dim));
  GHT_EXPECTS(rope_theta > 0 && rms_eps > 0 && aux_loss_coef >= 0 && z_loss_coef >= 0,
              "model config: rope_theta and rms_eps must be > 0, loss coefficients >= 0");
}

std::int64_t ModelConfig::embedding_params() const {
  const std::int64_t e = static_cast<std::int64_t>(vocab) * d_model;
  return tied_embeddings ? e : 2 * e;
}

std::int64_t ModelConfig::attention_params_per_layer() const {
  const std::int64_t d = d_model, q = static_cast<std::int64_t>(heads) * head_dim,
                     kv = static_cast<std::int64_t>(kv_heads) * head_dim;
  return d * q + 2 * d * kv + q * d + 2 * head_dim;  // q,k,v,o projections + q_norm, k_norm
}

std::int64_t ModelConfig::expert_params() const {
  return 3LL * d_model * expert_ffn;  // gate, up, down
}

std::int64_t ModelConfig::layer_dense_params() const {
  return attention_params_per_layer() + static_cast<std::int64_t>(d_model) * experts  // router
         + 2LL * d_model;                                                              // 2 norms
}

std::int64_t ModelConfig::total_params() const {
  return embedding_params() + layers * (layer_dense_params() + experts * expert_params()) + d_model;
}

std::int64_t ModelConfig::active_params() const {
  return embedding_params() + active_nonembedding_params();
}

std::int64_t ModelConfig::active_nonembedding_params() const {
  return layers * (layer_dense_params() + top_k * expert_params()) + d_model;
}

double ModelConfig::flops_per_token() const {
  return 6.0 * static_cast<double>(active_nonembedding_params()) +
         12.0 * layers * heads * head_dim * static_cast<double>(seq_len);
}

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = {"tiny", "small", "bench-h200", "seed-21b"};
  return names;
}

ModelConfig preset(std::string_view name) {
  ModelConfig c;
  if (name == "tiny") {
    // Byte-level vocabulary; small enough to learn English bytes on 2 cores in minutes.
    c.name = "tiny";
    c.d_model = 96; c.layers = 2; c.heads = 4; c.kv_heads = 2; c.head_dim = 24;
    c.experts = 4; c.top_k = 2; c.expert_ffn = 128; c.vocab = 256;
    c.seq_len = 128; c.micro_batch = 8; c.grad_accum = 1;
  } else if (name == "small") {
    c.name = "small";
    c.d_model = 256; c.layers = 4; c.heads = 8; c.kv_heads = 2; c.head_dim = 32;
    c.experts = 8; c.top_k = 2; c.expert_ffn = 256; c.vocab = 256;
    c.seq_len = 256; c.micro_batch = 16; c.grad_accum = 1;
  } else if (name == "seed-21b" || name == "bench-h200") {
    // The seed's per-layer shape. 30 layers x 64 experts gives 21.01B total and 3.32B active
    // (embeddings counted in both), within 2% of the seed's 21.0B / 3.36B.
    c.d_model = 4096; c.heads = 40; c.kv_heads = 8; c.head_dim = 128;
    c.top_k = 4; c.expert_ffn = 800; c.vocab = 151936; c.tied_embeddings = true;
    c.rope_theta = 1000000.0; c.seq_len = 4096; c.micro_batch = 1;
    if (name == "seed-21b") {
      c.name = "seed-21b"; c.layers = 30; c.experts = 64; c.grad_accum = 8;
    } else {
      // 14 layers x 48 experts: 7.94B params, fp32 master+m+v = 88.7 GiB on the host.
      c.name = "bench-h200"; c.layers = 14; c.experts = 48; c.grad_accum = 4;
    }
  } else {
    std::string valid;
    for (const auto& n : preset_names()) valid += (valid.empty() ? "" : ", ") + n;
    GHT_FAIL("unknown model preset '" + std::string(name) + "'; valid presets: " + valid);
  }
  c.validate();
  return c;
}

}  // namespace ght::trainer
