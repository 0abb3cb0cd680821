#include "trainer/model_config_toml.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <stdexcept>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <toml.hpp>
#include <vector>

#include "tier/error.hpp"

namespace ght::trainer {

namespace {

enum class Kind { Int, Float, Bool, String };

struct Field {
  Kind kind;
  std::function<void(ModelConfig&, const toml::value&)> set;
};

template <typename M>
Field int_field(M ModelConfig::*m, std::string_view name) {
  const IntFieldRange* r = model_int_range(name);
  return {Kind::Int, [m, r](ModelConfig& c, const toml::value& v) {
            const auto x = v.as_integer();
            // Checked before narrowing: 4294967392 must not wrap to 96. toml11 saturates
            // literals beyond int64 to its limits, which no range reaches.
            if (r != nullptr && (x < r->lo || x > r->hi)) {
              const bool saturated = x == std::numeric_limits<std::int64_t>::max() ||
                                     x == std::numeric_limits<std::int64_t>::min();
              throw std::out_of_range((saturated ? std::string("overflows a 64-bit integer")
                                                 : std::to_string(x) + " is out of range") +
                                      "; valid range [" + std::to_string(r->lo) + ", " +
                                      std::to_string(r->hi) + "]");
            }
            c.*m = static_cast<int>(x);
          }};
}
// micro_batch, marked as set by the file (ModelConfig::micro_batch_pinned).
Field pinned_micro_batch_field() {
  Field f = int_field(&ModelConfig::micro_batch, "micro_batch");
  auto set = f.set;
  f.set = [set](ModelConfig& c, const toml::value& v) {
    set(c, v);
    c.micro_batch_pinned = true;
  };
  return f;
}
Field float_field(double ModelConfig::*m) {
  return {Kind::Float, [m](ModelConfig& c, const toml::value& v) {
            const double x = v.is_integer() ? static_cast<double>(v.as_integer()) : v.as_floating();
            if (!std::isfinite(x)) throw std::domain_error("must be a finite number");
            c.*m = x;
          }};
}
Field bool_field(bool ModelConfig::*m) {
  return {Kind::Bool, [m](ModelConfig& c, const toml::value& v) { c.*m = v.as_boolean(); }};
}

const std::map<std::string, Field>& fields() {
  static const std::map<std::string, Field> f = {
      {"name", {Kind::String, [](ModelConfig& c, const toml::value& v) { c.name = v.as_string().str; }}},
      {"d_model", int_field(&ModelConfig::d_model, "d_model")},
      {"layers", int_field(&ModelConfig::layers, "layers")},
      {"heads", int_field(&ModelConfig::heads, "heads")},
      {"kv_heads", int_field(&ModelConfig::kv_heads, "kv_heads")},
      {"head_dim", int_field(&ModelConfig::head_dim, "head_dim")},
      {"experts", int_field(&ModelConfig::experts, "experts")},
      {"top_k", int_field(&ModelConfig::top_k, "top_k")},
      {"expert_ffn", int_field(&ModelConfig::expert_ffn, "expert_ffn")},
      {"norm_topk_prob", bool_field(&ModelConfig::norm_topk_prob)},
      {"rope_theta", float_field(&ModelConfig::rope_theta)},
      {"vocab", int_field(&ModelConfig::vocab, "vocab")},
      {"tied_embeddings", bool_field(&ModelConfig::tied_embeddings)},
      {"rms_eps", float_field(&ModelConfig::rms_eps)},
      {"aux_loss_coef", float_field(&ModelConfig::aux_loss_coef)},
      {"z_loss_coef", float_field(&ModelConfig::z_loss_coef)},
      {"seq_len", int_field(&ModelConfig::seq_len, "seq_len")},
      {"micro_batch", pinned_micro_batch_field()},
      {"grad_accum", int_field(&ModelConfig::grad_accum, "grad_accum")},
  };
  return f;
}

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Int: return "an integer";
    case Kind::Float: return "a number";
    case Kind::Bool: return "true or false";
    case Kind::String: return "a string";
  }
  return "?";
}

bool type_ok(Kind k, const toml::value& v) {
  switch (k) {
    case Kind::Int: return v.is_integer();
    case Kind::Float: return v.is_floating() || v.is_integer();
    case Kind::Bool: return v.is_boolean();
    case Kind::String: return v.is_string();
  }
  return false;
}

}  // namespace

ModelConfig load_model_config(const std::string& path) {
  {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) throw io_error(path + ": is a directory, expected a TOML file");
    std::ifstream probe(path);
    if (!probe) throw io_error(path + ": cannot open model config for reading");
  }
  toml::value data;
  try {
    data = toml::parse(path);
  } catch (const std::exception& e) {
    throw io_error(path + ": cannot parse model config: " + e.what());
  }
  if (!data.is_table()) throw io_error(path + ": a model config must be a TOML table");
  const toml::table* table = &data.as_table();
  std::string prefix;
  if (const auto it = table->find("model"); it != table->end()) {
    if (!it->second.is_table()) throw io_error(path + ": 'model' must be a table");
    if (table->size() != 1) {
      throw io_error(path + ": keys must be all at the top level or all inside [model], not both");
    }
    table = &it->second.as_table();
    prefix = "model.";
  }
  // Sorted, so the first error reported does not depend on hash order.
  std::vector<std::string> keys;
  for (const auto& [k, v] : *table) keys.push_back(k);
  std::sort(keys.begin(), keys.end());

  ModelConfig cfg;
  if (const auto it = table->find("preset"); it != table->end()) {
    if (!it->second.is_string()) throw io_error(path + ": key '" + prefix + "preset': expected a string");
    try {
      cfg = preset(it->second.as_string().str);
    } catch (const ght::logic_error& e) {
      throw io_error(path + ": key '" + prefix + "preset': " + e.what());
    }
  }
  for (const auto& key : keys) {
    if (key == "preset") continue;
    const auto f = fields().find(key);
    if (f == fields().end()) {
      std::string known;
      for (const auto& [name, field] : fields()) known += (known.empty() ? "" : ", ") + name;
      throw io_error(path + ": unknown key '" + prefix + key + "' (known: preset, " + known + ")");
    }
    const toml::value& v = table->at(key);
    if (!type_ok(f->second.kind, v)) {
      throw io_error(path + ": key '" + prefix + key + "': expected " + kind_name(f->second.kind));
    }
    try {
      f->second.set(cfg, v);
    } catch (const std::exception& e) {
      throw io_error(path + ": key '" + prefix + key + "': " + e.what());
    }
  }
  try {
    cfg.validate();
  } catch (const ght::logic_error& e) {
    throw io_error(path + ": " + e.what());
  }
  return cfg;
}

}  // namespace ght::trainer
