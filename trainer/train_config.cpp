#include "trainer/train_config.hpp"

#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <toml.hpp>

#include "tier/error.hpp"

namespace ght::trainer {

namespace {

// A flat "section.key" -> setter table keeps TOML, JSON and overrides on one set of names.
using Setter = std::function<void(TrainConfig&, const toml::value&)>;

template <class T>
T as(const toml::value& v, const std::string& key) {
  try {
    if constexpr (std::is_same_v<T, bool>) {
      return toml::get<bool>(v);
    } else if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(toml::get<std::int64_t>(v));
    } else if constexpr (std::is_floating_point_v<T>) {
      if (v.is_integer()) return static_cast<T>(toml::get<std::int64_t>(v));
      return static_cast<T>(toml::get<double>(v));
    } else {
      return toml::get<std::string>(v);
    }
  } catch (const std::exception&) {
    throw ght::logic_error("config key '" + key + "': expected " +
                           (std::is_same_v<T, bool>         ? "a boolean"
                            : std::is_integral_v<T>         ? "an integer"
                            : std::is_floating_point_v<T>   ? "a number"
                                                            : "a string") +
                           ", got " + toml::format(v));
  }
}

#define GHT_FIELD(section, key, member)                                              \
  {                                                                                  \
    section "." #key, [](TrainConfig& c, const toml::value& v) {                     \
      c.member = as<decltype(c.member)>(v, section "." #key);                        \
    }                                                                                \
  }

const std::map<std::string, Setter>& setters() {
  static const std::map<std::string, Setter> s = {
      {"model.preset", [](TrainConfig& c, const toml::value& v) {
         c.model = preset(as<std::string>(v, "model.preset"));
       }},
      {"model.name", [](TrainConfig& c, const toml::value& v) { c.model.name = as<std::string>(v, "model.name"); }},
      GHT_FIELD("model", d_model, model.d_model),
      GHT_FIELD("model", layers, model.layers),
      GHT_FIELD("model", heads, model.heads),
      GHT_FIELD("model", kv_heads, model.kv_heads),
      GHT_FIELD("model", head_dim, model.head_dim),
      GHT_FIELD("model", experts, model.experts),
      GHT_FIELD("model", top_k, model.top_k),
      GHT_FIELD("model", expert_ffn, model.expert_ffn),
      GHT_FIELD("model", norm_topk_prob, model.norm_topk_prob),
      GHT_FIELD("model", rope_theta, model.rope_theta),
      GHT_FIELD("model", vocab, model.vocab),
      GHT_FIELD("model", tied_embeddings, model.tied_embeddings),
      GHT_FIELD("model", rms_eps, model.rms_eps),
      GHT_FIELD("model", aux_loss_coef, model.aux_loss_coef),
      GHT_FIELD("model", z_loss_coef, model.z_loss_coef),
      GHT_FIELD("model", seq_len, model.seq_len),
      GHT_FIELD("model", micro_batch, model.micro_batch),
      GHT_FIELD("model", grad_accum, model.grad_accum),
      GHT_FIELD("train", data, data),
      GHT_FIELD("train", out, out),
      GHT_FIELD("train", steps, steps),
      GHT_FIELD("train", eval_every, eval_every),
      GHT_FIELD("train", eval_batches, eval_batches),
      GHT_FIELD("train", ckpt_every, ckpt_every),
      GHT_FIELD("train", keep, keep),
      GHT_FIELD("train", seed, seed),
      GHT_FIELD("train", backend, backend),
      GHT_FIELD("train", log_every, log_every),
      GHT_FIELD("train", threads, threads),
      GHT_FIELD("optimizer", beta1, adam.beta1),
      GHT_FIELD("optimizer", beta2, adam.beta2),
      GHT_FIELD("optimizer", eps, adam.eps),
      GHT_FIELD("optimizer", weight_decay, adam.weight_decay),
      GHT_FIELD("optimizer", max_grad_norm, adam.max_grad_norm),
      {"schedule.kind", [](TrainConfig& c, const toml::value& v) {
         c.schedule.kind = parse_schedule_kind(as<std::string>(v, "schedule.kind"));
       }},
      GHT_FIELD("schedule", lr, schedule.lr),
      GHT_FIELD("schedule", min_lr, schedule.min_lr),
      GHT_FIELD("schedule", warmup_steps, schedule.warmup_steps),
      GHT_FIELD("schedule", decay_fraction, schedule.decay_fraction),
  };
  return s;
}
#undef GHT_FIELD

void apply(TrainConfig& c, const std::string& key, const toml::value& v, const std::string& origin) {
  const auto it = setters().find(key);
  if (it == setters().end()) {
    std::string known;
    for (const auto& [k, _] : setters()) known += (known.empty() ? "" : ", ") + k;
    throw ght::logic_error(origin + ": unknown key '" + key + "'; known keys: " + known);
  }
  try {
    it->second(c, v);
  } catch (const ght::logic_error& e) {
    throw ght::logic_error(origin + ": " + e.what());
  }
}

// Apply a parsed TOML document: model.preset first, so explicit model fields refine the preset.
void apply_document(TrainConfig& c, const toml::value& doc, const std::string& origin) {
  GHT_EXPECTS(doc.is_table(), origin + ": expected a TOML table at the top level");
  const auto& top = doc.as_table();
  if (auto m = top.find("model"); m != top.end() && m->second.is_table()) {
    if (auto p = m->second.as_table().find("preset"); p != m->second.as_table().end()) {
      apply(c, "model.preset", p->second, origin);
    }
  }
  for (const auto& [section, table] : top) {
    if (!table.is_table()) {
      throw ght::logic_error(origin + ": '" + section +
                             "' must be a table ([model], [train], [optimizer], [schedule])");
    }
    for (const auto& [key, value] : table.as_table()) {
      if (section == "model" && key == "preset") continue;
      apply(c, section + "." + key, value, origin);
    }
  }
}

toml::value parse_override_value(const std::string& text, const std::string& item) {
  std::istringstream in("v = " + text);
  try {
    return toml::parse(in, "override").as_table().at("v");
  } catch (const std::exception&) {
    // A bare word (cosine, runs/x, cuda) is a string.
    if (text.find_first_of("\"'\n=[]{}") == std::string::npos && !text.empty()) {
      return toml::value(text);
    }
    throw ght::logic_error("override '" + item + "': cannot parse the value '" + text + "'");
  }
}

}  // namespace

void TrainConfig::validate() const {
  model.validate();
  auto fail = [](const std::string& key, const std::string& why) {
    throw ght::logic_error("train config: " + key + " " + why);
  };
  if (steps < 1) fail("train.steps", "must be >= 1, got " + std::to_string(steps));
  if (eval_every < 0) fail("train.eval_every", "must be >= 0");
  if (eval_batches < 1) fail("train.eval_batches", "must be >= 1");
  if (ckpt_every < 0) fail("train.ckpt_every", "must be >= 0");
  if (keep < 1) fail("train.keep", "must be >= 1");
  if (log_every < 1) fail("train.log_every", "must be >= 1");
  if (threads < 0) fail("train.threads", "must be >= 0");
  if (backend != "auto" && backend != "cpu" && backend != "cuda") {
    fail("train.backend", "must be auto, cpu or cuda, got '" + backend + "'");
  }
  if (data.empty()) fail("train.data", "must name a shard directory or pattern");
  if (out.empty()) fail("train.out", "must name a run directory");
  if (!(adam.beta1 >= 0 && adam.beta1 < 1)) fail("optimizer.beta1", "must be in [0, 1)");
  if (!(adam.beta2 >= 0 && adam.beta2 < 1)) fail("optimizer.beta2", "must be in [0, 1)");
  if (!(adam.eps > 0)) fail("optimizer.eps", "must be > 0");
  if (!(adam.weight_decay >= 0)) fail("optimizer.weight_decay", "must be >= 0");
  schedule.validate();
}

nlohmann::ordered_json TrainConfig::to_json() const {
  nlohmann::ordered_json j;
  const auto& m = model;
  j["model"] = {{"name", m.name},           {"d_model", m.d_model},
                {"layers", m.layers},       {"heads", m.heads},
                {"kv_heads", m.kv_heads},   {"head_dim", m.head_dim},
                {"experts", m.experts},     {"top_k", m.top_k},
                {"expert_ffn", m.expert_ffn}, {"norm_topk_prob", m.norm_topk_prob},
                {"rope_theta", m.rope_theta}, {"vocab", m.vocab},
                {"tied_embeddings", m.tied_embeddings}, {"rms_eps", m.rms_eps},
                {"aux_loss_coef", m.aux_loss_coef}, {"z_loss_coef", m.z_loss_coef},
                {"seq_len", m.seq_len},     {"micro_batch", m.micro_batch},
                {"grad_accum", m.grad_accum}};
  j["train"] = {{"data", data},         {"out", out},
                {"steps", steps},       {"eval_every", eval_every},
                {"eval_batches", eval_batches}, {"ckpt_every", ckpt_every},
                {"keep", keep},         {"seed", seed},
                {"backend", backend},   {"log_every", log_every},
                {"threads", threads}};
  j["optimizer"] = {{"beta1", adam.beta1}, {"beta2", adam.beta2}, {"eps", adam.eps},
                    {"weight_decay", adam.weight_decay}, {"max_grad_norm", adam.max_grad_norm}};
  j["schedule"] = {{"kind", std::string(to_string(schedule.kind))}, {"lr", schedule.lr},
                   {"min_lr", schedule.min_lr}, {"warmup_steps", schedule.warmup_steps},
                   {"decay_fraction", schedule.decay_fraction}};
  return j;
}

TrainConfig TrainConfig::from_json(const nlohmann::json& j) {
  // Round-trip through TOML values so JSON and TOML share one set of setters.
  TrainConfig c;
  for (const auto& [section, table] : j.items()) {
    GHT_EXPECTS(table.is_object(), "config JSON: '" + section + "' must be an object");
    for (const auto& [key, v] : table.items()) {
      toml::value tv;
      if (v.is_boolean()) tv = v.get<bool>();
      else if (v.is_number_integer()) tv = v.get<std::int64_t>();
      else if (v.is_number()) tv = v.get<double>();
      else if (v.is_string()) tv = v.get<std::string>();
      else throw ght::logic_error("config JSON: " + section + "." + key + " has an unsupported type");
      apply(c, section + "." + key, tv, "config JSON");
    }
  }
  c.schedule.total_steps = c.steps;
  return c;
}

TrainConfig resolve_train_config(const std::string& preset_name, const std::string& toml_path,
                                 const std::vector<std::string>& overrides) {
  TrainConfig c;
  c.model = preset(preset_name.empty() ? "tiny" : preset_name);
  // Sensible per-preset defaults: the tiny demo learns English bytes on 2 cores in minutes.
  c.schedule.lr = 2e-3;
  c.schedule.min_lr = 2e-4;
  c.schedule.warmup_steps = 20;
  c.adam.weight_decay = 0.1;
  if (!toml_path.empty()) {
    toml::value doc;
    try {
      doc = toml::parse(toml_path);
    } catch (const std::runtime_error& e) {
      throw ght::io_error("cannot read config file " + toml_path + ": " + e.what());
    }
    apply_document(c, doc, toml_path);
  }
  for (const auto& item : overrides) {
    const auto eq = item.find('=');
    GHT_EXPECTS(eq != std::string::npos && eq > 0,
                "override '" + item + "': expected section.key=value (e.g. train.steps=500)");
    const std::string key = item.substr(0, eq);
    apply(c, key, parse_override_value(item.substr(eq + 1), item), "override '" + item + "'");
  }
  c.schedule.total_steps = c.steps;
  c.validate();
  return c;
}

}  // namespace ght::trainer
