#include "trainer/hf_config.hpp"

#include <filesystem>
#include <limits>
#include <optional>

#include "tier/error.hpp"
#include "trainer/file_io.hpp"

namespace fs = std::filesystem;

namespace ght::trainer {

namespace {

[[noreturn]] void hf_fail(const std::string& source, const std::string& what) {
  throw io_error(source + ": " + what);
}

// Readers for one field: required ones fail when absent, optional ones take HF's default.
class Fields {
 public:
  Fields(const nlohmann::json& j, std::string source) : j_(j), src_(std::move(source)) {}

  [[nodiscard]] bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  int get_int(const char* key, std::optional<int> def = std::nullopt) const {
    if (!has(key)) {
      if (def) return *def;
      hf_fail(src_, std::string("missing required field \"") + key + "\"");
    }
    const auto& v = j_.at(key);
    if (!v.is_number_integer()) hf_fail(src_, std::string("field \"") + key + "\" must be an integer, got " + v.dump());
    const auto x = v.get<std::int64_t>();
    if (x < 0 || x > std::numeric_limits<int>::max()) {
      hf_fail(src_, std::string("field \"") + key + "\" is out of range: " + v.dump());
    }
    return static_cast<int>(x);
  }
  double get_double(const char* key, double def) const {
    if (!has(key)) return def;
    const auto& v = j_.at(key);
    if (!v.is_number()) hf_fail(src_, std::string("field \"") + key + "\" must be a number, got " + v.dump());
    return v.get<double>();
  }
  bool get_bool(const char* key, bool def) const {
    if (!has(key)) return def;
    const auto& v = j_.at(key);
    if (!v.is_boolean()) hf_fail(src_, std::string("field \"") + key + "\" must be true or false, got " + v.dump());
    return v.get<bool>();
  }
  std::string get_string(const char* key, const std::string& def) const {
    if (!has(key)) return def;
    const auto& v = j_.at(key);
    if (!v.is_string()) hf_fail(src_, std::string("field \"") + key + "\" must be a string, got " + v.dump());
    return v.get<std::string>();
  }

 private:
  const nlohmann::json& j_;
  std::string src_;
};

}  // namespace

nlohmann::ordered_json to_hf_config(const ModelConfig& cfg, const HfConfigOptions& opt) {
  cfg.validate();
  const int max_pos = opt.max_position_embeddings > 0 ? opt.max_position_embeddings : cfg.seq_len;
  nlohmann::ordered_json j;
  j["architectures"] = {"Qwen3MoeForCausalLM"};
  j["model_type"] = "qwen3_moe";
  j["vocab_size"] = cfg.vocab;
  j["hidden_size"] = cfg.d_model;
  j["num_hidden_layers"] = cfg.layers;
  j["num_attention_heads"] = cfg.heads;
  j["num_key_value_heads"] = cfg.kv_heads;
  j["head_dim"] = cfg.head_dim;
  j["num_experts"] = cfg.experts;
  j["num_experts_per_tok"] = cfg.top_k;
  j["moe_intermediate_size"] = cfg.expert_ffn;
  // Only read for dense (mlp_only) layers, of which there are none; set equal for clarity.
  j["intermediate_size"] = cfg.expert_ffn;
  j["decoder_sparse_step"] = 1;
  j["mlp_only_layers"] = nlohmann::ordered_json::array();
  j["norm_topk_prob"] = cfg.norm_topk_prob;
  j["router_aux_loss_coef"] = cfg.aux_loss_coef;
  j["output_router_logits"] = false;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = cfg.rms_eps;
  // transformers 4 reads rope_theta; transformers 5 reads rope_parameters (and folds a top-level
  // rope_theta into it). Writing both loads the same model in either.
  j["rope_theta"] = cfg.rope_theta;
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", cfg.rope_theta}};
  j["max_position_embeddings"] = max_pos;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  j["tie_word_embeddings"] = cfg.tied_embeddings;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  j["bos_token_id"] = opt.bos_token_id;
  j["eos_token_id"] = opt.eos_token_id;
  j["torch_dtype"] = opt.torch_dtype;  // transformers 4
  j["dtype"] = opt.torch_dtype;        // transformers 5's name for it
  j["ghtier"] = {{"name", cfg.name},
                 {"z_loss_coef", cfg.z_loss_coef},
                 {"seq_len", cfg.seq_len},
                 {"micro_batch", cfg.micro_batch},
                 {"grad_accum", cfg.grad_accum}};
  return j;
}

void write_hf_config(const std::string& dir, const ModelConfig& cfg, const HfConfigOptions& opt) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw io_error(dir + ": cannot create directory: " + ec.message());
  fileio::atomic_write((fs::path(dir) / "config.json").string(), to_hf_config(cfg, opt).dump(2) + "\n");
}

ModelConfig from_hf_config(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) hf_fail(source, "is not a JSON object");
  const Fields f(j, source);
  const std::string model_type = f.get_string("model_type", "");
  if (model_type != "qwen3_moe") {
    hf_fail(source, "model_type is \"" + model_type + "\"; only \"qwen3_moe\" (Qwen3MoeForCausalLM) is supported");
  }
  if (f.has("architectures")) {
    const auto& a = j.at("architectures");
    bool ok = false;
    if (a.is_array()) {
      for (const auto& x : a) ok = ok || (x.is_string() && x.get<std::string>() == "Qwen3MoeForCausalLM");
    }
    if (!ok) hf_fail(source, "architectures " + a.dump() + " does not name Qwen3MoeForCausalLM");
  }

  ModelConfig c;
  c.name = "hf";
  c.d_model = f.get_int("hidden_size");
  c.layers = f.get_int("num_hidden_layers");
  c.heads = f.get_int("num_attention_heads");
  // transformers' default: all heads are key/value heads (no GQA).
  c.kv_heads = f.get_int("num_key_value_heads", c.heads);
  if (c.heads <= 0) hf_fail(source, "num_attention_heads must be > 0");
  c.head_dim = f.get_int("head_dim", c.d_model / c.heads);
  // transformers 5 may store num_experts under its attribute name num_local_experts.
  c.experts = f.has("num_experts") ? f.get_int("num_experts") : f.get_int("num_local_experts", std::nullopt);
  c.top_k = f.get_int("num_experts_per_tok");
  c.expert_ffn = f.get_int("moe_intermediate_size");
  c.norm_topk_prob = f.get_bool("norm_topk_prob", false);
  c.vocab = f.get_int("vocab_size");
  c.tied_embeddings = f.get_bool("tie_word_embeddings", false);
  c.rms_eps = f.get_double("rms_norm_eps", 1e-6);
  c.aux_loss_coef = f.get_double("router_aux_loss_coef", 0.001);

  // RoPE: plain (unscaled) only.
  double theta = f.get_double("rope_theta", 10000.0);
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!f.has(key)) continue;
    const auto& rp = j.at(key);
    if (!rp.is_object()) hf_fail(source, std::string("field \"") + key + "\" must be an object, got " + rp.dump());
    const std::string type = rp.value("rope_type", rp.value("type", std::string("default")));
    if (type != "default") {
      hf_fail(source, std::string("\"") + key + "\" uses rope_type \"" + type +
                          "\"; only unscaled (default) RoPE is supported");
    }
    if (rp.contains("rope_theta")) {
      if (!rp["rope_theta"].is_number()) hf_fail(source, std::string("\"") + key + ".rope_theta\" must be a number");
      theta = rp["rope_theta"].get<double>();
    }
    if (rp.contains("partial_rotary_factor") &&
        (!rp["partial_rotary_factor"].is_number() || rp["partial_rotary_factor"].get<double>() != 1.0)) {
      hf_fail(source, "partial_rotary_factor != 1 is not supported");
    }
  }
  c.rope_theta = theta;
  if (f.get_double("partial_rotary_factor", 1.0) != 1.0) hf_fail(source, "partial_rotary_factor != 1 is not supported");

  // What this trainer cannot reproduce.
  const std::string act = f.get_string("hidden_act", "silu");
  if (act != "silu") hf_fail(source, "hidden_act is \"" + act + "\"; only \"silu\" (SwiGLU experts) is supported");
  if (f.get_bool("attention_bias", false)) hf_fail(source, "attention_bias = true is not supported");
  if (f.get_bool("use_sliding_window", false)) hf_fail(source, "use_sliding_window = true is not supported");
  const int sparse_step = f.get_int("decoder_sparse_step", 1);
  if (sparse_step != 1) {
    hf_fail(source, "decoder_sparse_step is " + std::to_string(sparse_step) +
                        "; every layer must be MoE (decoder_sparse_step 1)");
  }
  if (f.has("mlp_only_layers")) {
    const auto& m = j.at("mlp_only_layers");
    if (!m.is_array()) hf_fail(source, "field \"mlp_only_layers\" must be a list");
    if (!m.empty()) hf_fail(source, "mlp_only_layers " + m.dump() + " lists dense layers; every layer must be MoE");
  }
  for (const char* key : {"shared_expert_intermediate_size", "n_shared_experts", "num_shared_experts"}) {
    if (f.has(key) && f.get_int(key, 0) > 0) {
      hf_fail(source, std::string("\"") + key + "\" > 0: shared experts are not supported");
    }
  }

  // Our own fields, when the file came from `ght export`.
  if (f.has("ghtier")) {
    const auto& g = j.at("ghtier");
    if (!g.is_object()) hf_fail(source, "field \"ghtier\" must be an object");
    const Fields gf(g, source + " (ghtier)");
    c.name = gf.get_string("name", c.name);
    c.z_loss_coef = gf.get_double("z_loss_coef", c.z_loss_coef);
    c.seq_len = gf.get_int("seq_len", c.seq_len);
    c.micro_batch = gf.get_int("micro_batch", c.micro_batch);
    c.grad_accum = gf.get_int("grad_accum", c.grad_accum);
  }
  try {
    c.validate();
  } catch (const logic_error& e) {
    hf_fail(source, e.what());
  }
  return c;
}

ModelConfig read_hf_config(const std::string& path) {
  std::error_code ec;
  const std::string file = fs::is_directory(path, ec) ? (fs::path(path) / "config.json").string() : path;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(fileio::read_all(file));
  } catch (const nlohmann::json::exception& e) {
    hf_fail(file, std::string("not valid JSON: ") + e.what());
  }
  return from_hf_config(j, file);
}

}  // namespace ght::trainer
