#include "trainer/model_config.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "tier/error.hpp"

namespace ght::trainer {

const std::vector<IntFieldRange>& model_int_ranges() {
  // Generous bounds: far beyond any real model, small enough that products of them (parameter
  // counts, activation sizes) cannot overflow 64-bit arithmetic.
  static const std::vector<IntFieldRange> r = {
      {"d_model", 1, 1 << 16},    {"layers", 1, 1 << 12},      {"heads", 1, 1 << 12},
      {"kv_heads", 1, 1 << 12},   {"head_dim", 2, 1 << 12},    {"experts", 1, 1 << 14},
      {"top_k", 1, 1 << 14},      {"expert_ffn", 1, 1 << 18},  {"vocab", 1, 1 << 24},
      {"seq_len", 1, 1 << 20},    {"micro_batch", 1, 1 << 16}, {"grad_accum", 1, 1 << 16},
  };
  return r;
}

const IntFieldRange* model_int_range(std::string_view field) {
  for (const auto& r : model_int_ranges()) {
    if (r.field == field) return &r;
  }
  return nullptr;
}

namespace {
[[noreturn]] void bad(const std::string& field, const std::string& why) {
  throw ght::logic_error("model config: " + field + " " + why);
}

void expect_in_range(std::int64_t v, const char* field) {
  const IntFieldRange* r = model_int_range(field);
  if (r != nullptr && (v < r->lo || v > r->hi)) {
    bad(field, "must be in [" + std::to_string(r->lo) + ", " + std::to_string(r->hi) + "], got " +
                   std::to_string(v));
  }
}

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

void expect_finite(double v, const char* field, bool allow_zero) {
  if (!std::isfinite(v)) bad(field, "must be a finite number, got " + num(v));
  if (allow_zero ? !(v >= 0) : !(v > 0)) bad(field, std::string("must be ") + (allow_zero ? ">= 0" : "> 0") + ", got " + num(v));
}
}  // namespace

void ModelConfig::validate() const {
  expect_in_range(d_model, "d_model");
  expect_in_range(layers, "layers");
  expect_in_range(heads, "heads");
  expect_in_range(kv_heads, "kv_heads");
  expect_in_range(head_dim, "head_dim");
  expect_in_range(experts, "experts");
  expect_in_range(top_k, "top_k");
  expect_in_range(expert_ffn, "expert_ffn");
  expect_in_range(vocab, "vocab");
  expect_in_range(seq_len, "seq_len");
  expect_in_range(micro_batch, "micro_batch");
  expect_in_range(grad_accum, "grad_accum");
  // Built with += : GCC 12 raises a false -Wrestrict on `"(" + std::to_string(...)` at -O3.
  if (heads % kv_heads != 0) {
    std::string why = "(";
    why += std::to_string(heads) + ") must be a multiple of kv_heads (" + std::to_string(kv_heads) + ")";
    bad("heads", why);
  }
  if (top_k > experts) {
    std::string why = "(";
    why += std::to_string(top_k) + ") must be <= experts (" + std::to_string(experts) + ")";
    bad("top_k", why);
  }
  if (head_dim % 2 != 0) bad("head_dim", "must be even for RoPE, got " + std::to_string(head_dim));
  expect_finite(rope_theta, "rope_theta", /*allow_zero=*/false);
  expect_finite(rms_eps, "rms_eps", /*allow_zero=*/false);
  expect_finite(aux_loss_coef, "aux_loss_coef", /*allow_zero=*/true);
  expect_finite(z_loss_coef, "z_loss_coef", /*allow_zero=*/true);
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

double ModelConfig::seed_flops_per_token() const {
  return 6.0 * static_cast<double>(active_params()) +
         12.0 * layers * static_cast<double>(seq_len) * static_cast<double>(d_model);
}

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = {"tiny", "small", "bench-h200", "bench-h200-14l",
                                                 "seed-21b"};
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
  } else if (name == "seed-21b" || name == "bench-h200" || name == "bench-h200-14l") {
    // The seed's per-layer shape. 30 layers x 64 experts gives 21.01B total and 3.32B active
    // (embeddings counted in both), within 2% of the seed's 21.0B / 3.36B.
    c.d_model = 4096; c.heads = 40; c.kv_heads = 8; c.head_dim = 128;
    c.top_k = 4; c.expert_ffn = 800; c.vocab = 151936; c.tied_embeddings = true;
    c.rope_theta = 1000000.0; c.seq_len = 4096; c.micro_batch = 1;
    if (name == "seed-21b") {
      c.name = "seed-21b"; c.layers = 30; c.experts = 64; c.grad_accum = 8;
    } else if (name == "bench-h200") {
      // 10 layers x 48 experts: 5.85B params, the model of configs/bench-h200.toml (the H200
      // throughput bench; that file says why 10 layers).
      c.name = "bench-h200"; c.layers = 10; c.experts = 48; c.grad_accum = 4;
    } else {
      // 14 layers x 48 experts: 7.94B params, fp32 master+m+v = 88.7 GiB on the host.
      c.name = "bench-h200-14l"; c.layers = 14; c.experts = 48; c.grad_accum = 4;
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
