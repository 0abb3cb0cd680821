#include "trainer/train_config.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <toml.hpp>

#include "tier/error.hpp"

namespace ght::trainer {

namespace {

// A flat "section.key" -> setter table keeps TOML, JSON and overrides on one set of names.
using Setter = std::function<void(TrainConfig&, const toml::value&)>;

const char* expected_kind(bool is_bool, bool is_int, bool is_float) {
  return is_bool ? "a boolean" : is_int ? "an integer" : is_float ? "a number" : "a string";
}

// The valid range of every integer key. Values are checked here, before they are narrowed to the
// member's type, so 4294967392 cannot wrap to 96 and -1 cannot become 2^64-1.
std::pair<std::int64_t, std::int64_t> int_range(const std::string& key) {
  if (key.rfind("model.", 0) == 0) {
    if (const IntFieldRange* r = model_int_range(key.substr(6))) return {r->lo, r->hi};
  }
  constexpr std::int64_t kSteps = 1'000'000'000'000;  // 10^12 steps: beyond any run
  static const std::map<std::string, std::pair<std::int64_t, std::int64_t>> r = {
      {"train.steps", {1, kSteps}},
      {"train.eval_every", {0, kSteps}},
      {"train.eval_batches", {1, 1 << 20}},
      {"train.ckpt_every", {0, kSteps}},
      {"train.keep", {1, 1 << 20}},
      {"train.seed", {0, std::numeric_limits<std::int64_t>::max() - 1}},
      {"train.log_every", {1, kSteps}},
      {"train.threads", {0, 4096}},
      {"schedule.warmup_steps", {0, kSteps}},
      {"diloco.inner_steps", {0, kSteps}},
      {"diloco.fragments", {1, 1 << 16}},
      {"diloco.overlap_steps", {0, kSteps}},
  };
  const auto it = r.find(key);
  GHT_EXPECTS(it != r.end(), "train config: no range declared for integer key '" + key + "'");
  return it->second;
}

std::string number_text(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

template <class T>
T as(const toml::value& v, const std::string& key) {
  constexpr bool is_bool = std::is_same_v<T, bool>;
  constexpr bool is_int = std::is_integral_v<T> && !is_bool;
  constexpr bool is_float = std::is_floating_point_v<T>;
  T out{};
  try {
    if constexpr (is_bool) {
      out = toml::get<bool>(v);
    } else if constexpr (is_int) {
      const auto x = toml::get<std::int64_t>(v);
      const auto [lo, hi] = int_range(key);
      // toml11 saturates an out-of-range literal to the int64 limits; no key's range reaches them.
      if (x < lo || x > hi) {
        const bool saturated = x == std::numeric_limits<std::int64_t>::max() ||
                               x == std::numeric_limits<std::int64_t>::min();
        throw ght::logic_error("config key '" + key + "': " +
                               (saturated ? std::string("overflows a 64-bit integer")
                                          : std::to_string(x) + " is out of range") +
                               "; valid range [" + std::to_string(lo) + ", " + std::to_string(hi) +
                               "]");
      }
      out = static_cast<T>(x);
    } else if constexpr (is_float) {
      const double x = v.is_integer() ? static_cast<double>(toml::get<std::int64_t>(v)) : toml::get<double>(v);
      // inf and nan would train, then be written to config.json as null and break every resume.
      if (!std::isfinite(x)) {
        throw ght::logic_error("config key '" + key + "': must be a finite number, got " + number_text(x));
      }
      out = static_cast<T>(x);
    } else {
      out = toml::get<std::string>(v);
    }
  } catch (const ght::logic_error&) {
    throw;
  } catch (const std::exception&) {
    throw ght::logic_error("config key '" + key + "': expected " + expected_kind(is_bool, is_int, is_float) +
                           ", got " + toml::format(v));
  }
  return out;
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
      {"model.micro_batch", [](TrainConfig& c, const toml::value& v) {
         c.model.micro_batch = as<int>(v, "model.micro_batch");
         c.model.micro_batch_pinned = true;
       }},
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
      GHT_FIELD("diloco", inner_steps, diloco.inner_steps),
      GHT_FIELD("diloco", outer_lr, diloco.outer_lr),
      GHT_FIELD("diloco", outer_momentum, diloco.outer_momentum),
      GHT_FIELD("diloco", bf16_pseudo_grads, diloco.bf16_pseudo_grads),
      GHT_FIELD("diloco", fragments, diloco.fragments),
      GHT_FIELD("diloco", overlap_steps, diloco.overlap_steps),
      GHT_FIELD("diloco", mix, diloco.mix),
      GHT_FIELD("dist", optimizer_state, dist.optimizer_state),
  };
  return s;
}
#undef GHT_FIELD

void apply(TrainConfig& c, const std::string& key, const toml::value& v, const std::string& origin,
           std::set<std::string>* applied = nullptr) {
  if (applied != nullptr) applied->insert(key);
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
void apply_document(TrainConfig& c, const toml::value& doc, const std::string& origin,
                    std::set<std::string>* applied) {
  GHT_EXPECTS(doc.is_table(), origin + ": expected a TOML table at the top level");
  const auto& top = doc.as_table();
  if (auto m = top.find("model"); m != top.end() && m->second.is_table()) {
    if (auto p = m->second.as_table().find("preset"); p != m->second.as_table().end()) {
      apply(c, "model.preset", p->second, origin, applied);
    }
  }
  for (const auto& [section, table] : top) {
    if (!table.is_table()) {
      throw ght::logic_error(origin + ": '" + section +
                             "' must be a table ([model], [train], [optimizer], [schedule], [diloco], [dist])");
    }
    for (const auto& [key, value] : table.as_table()) {
      if (section == "model" && key == "preset") continue;
      apply(c, section + "." + key, value, origin, applied);
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
  auto finite = [&](const std::string& key, double v) {
    if (!std::isfinite(v)) fail(key, "must be a finite number, got " + number_text(v));
  };
  finite("optimizer.beta1", adam.beta1);
  finite("optimizer.beta2", adam.beta2);
  finite("optimizer.eps", adam.eps);
  finite("optimizer.weight_decay", adam.weight_decay);
  finite("optimizer.max_grad_norm", adam.max_grad_norm);
  finite("schedule.lr", schedule.lr);
  finite("schedule.min_lr", schedule.min_lr);
  finite("schedule.decay_fraction", schedule.decay_fraction);
  if (!(adam.eps > 0)) fail("optimizer.eps", "must be > 0");
  if (!(adam.weight_decay >= 0)) fail("optimizer.weight_decay", "must be >= 0");
  if (seed > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max() - 1)) {
    fail("train.seed", "must be in [0, " + std::to_string(std::numeric_limits<std::int64_t>::max() - 1) +
                           "], got " + std::to_string(seed));
  }
  if (schedule.warmup_steps > steps) {
    std::string why = "(";  // += : GCC 12's false -Wrestrict on "(" + std::string at -O3
    why += std::to_string(schedule.warmup_steps) + ") exceeds train.steps (" + std::to_string(steps) +
           "); lower it to at most " + std::to_string(steps) + ", e.g. -o schedule.warmup_steps=" +
           std::to_string(steps / 10);
    fail("schedule.warmup_steps", why);
  }
  finite("diloco.outer_lr", diloco.outer_lr);
  finite("diloco.outer_momentum", diloco.outer_momentum);
  if (diloco.inner_steps < 0) fail("diloco.inner_steps", "must be >= 0 (0 = off), got " + std::to_string(diloco.inner_steps));
  if (!(diloco.outer_lr > 0 && diloco.outer_lr <= 10)) {
    fail("diloco.outer_lr", "must be in (0, 10], got " + number_text(diloco.outer_lr));
  }
  if (!(diloco.outer_momentum >= 0 && diloco.outer_momentum < 1)) {
    fail("diloco.outer_momentum", "must be in [0, 1), got " + number_text(diloco.outer_momentum));
  }
  finite("diloco.mix", diloco.mix);
  if (!(diloco.mix >= 0 && diloco.mix <= 1)) fail("diloco.mix", "must be in [0, 1], got " + number_text(diloco.mix));
  if (diloco.fragments < 1) fail("diloco.fragments", "must be >= 1, got " + std::to_string(diloco.fragments));
  if (diloco.overlap_steps < 0) fail("diloco.overlap_steps", "must be >= 0, got " + std::to_string(diloco.overlap_steps));
  if (diloco.on() && diloco.inner_steps % diloco.fragments != 0) {
    fail("diloco.fragments", "(" + std::to_string(diloco.fragments) + ") must divide diloco.inner_steps (" +
                                 std::to_string(diloco.inner_steps) + "): each fragment syncs once every H steps, H/fragments apart");
  }
  if (diloco.on() && diloco.overlap_steps >= diloco.inner_steps / diloco.fragments) {
    fail("diloco.overlap_steps", "(" + std::to_string(diloco.overlap_steps) + ") must be below diloco.inner_steps / diloco.fragments (" +
                                     std::to_string(diloco.inner_steps / diloco.fragments) +
                                     "): one fragment's all-reduce at a time");
  }
  // Streaming: some fragment is always mid-window, so the ranks' models never agree before the
  // closing outer step.
  if (diloco.streaming() && eval_every != 0) {
    fail("train.eval_every", "(" + std::to_string(eval_every) + ") must be 0 with streaming DiLoCo (diloco.fragments, "
                             "overlap_steps or mix set): the workers' models agree only after the last step's outer step, "
                             "where the final eval runs");
  }
  // Mid-window every rank holds its own weights: an eval there would mix the workers' models.
  if (diloco.on() && eval_every % diloco.inner_steps != 0) {
    fail("train.eval_every", "(" + std::to_string(eval_every) + ") must be a multiple of diloco.inner_steps (" +
                                 std::to_string(diloco.inner_steps) +
                                 "), so that evals see the synchronised model (0: only at the end)");
  }
  if (!dist.sharded() && dist.optimizer_state != "replicated") {
    fail("dist.optimizer_state", "must be sharded or replicated, got '" + dist.optimizer_state + "'");
  }
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
  j["diloco"] = {{"inner_steps", diloco.inner_steps}, {"outer_lr", diloco.outer_lr},
                 {"outer_momentum", diloco.outer_momentum}, {"bf16_pseudo_grads", diloco.bf16_pseudo_grads},
                 {"fragments", diloco.fragments}, {"overlap_steps", diloco.overlap_steps}, {"mix", diloco.mix}};
  j["dist"] = {{"optimizer_state", dist.optimizer_state}};
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
  c.schedule.warmup_steps = kDefaultWarmupSteps;
  c.adam.weight_decay = 0.1;
  std::set<std::string> applied;  // keys the file or an override set explicitly
  if (!toml_path.empty()) {
    std::error_code ec;
    if (std::filesystem::is_directory(toml_path, ec)) {
      throw ght::io_error("config file " + toml_path + ": is a directory, expected a TOML file");
    }
    toml::value doc;
    try {
      doc = toml::parse(toml_path);
    } catch (const std::runtime_error& e) {
      throw ght::io_error("cannot read config file " + toml_path + ": " + e.what());
    }
    apply_document(c, doc, toml_path, &applied);
  }
  for (const auto& item : overrides) {
    const auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw ght::logic_error("override '" + item + "': expected section.key=value (e.g. train.steps=500)");
    }
    const std::string key = item.substr(0, eq);
    apply(c, key, parse_override_value(item.substr(eq + 1), item), "override '" + item + "'", &applied);
  }
  c.schedule.total_steps = c.steps;
  // The built-in warmup must not make a quick run (--steps 5) invalid: when nobody set
  // schedule.warmup_steps, it is clamped to what the run can hold. An explicit value is kept, and
  // validate() says which -o fixes it.
  if (!applied.contains("schedule.warmup_steps") && c.steps >= 1) {
    std::int64_t cap = c.steps;
    if (c.schedule.kind == ScheduleKind::wsd) {
      cap -= static_cast<std::int64_t>(std::llround(c.schedule.decay_fraction * static_cast<double>(c.steps)));
    }
    c.schedule.warmup_steps = std::clamp<std::int64_t>(c.schedule.warmup_steps, 0, std::max<std::int64_t>(cap, 0));
  }
  c.validate();
  return c;
}

namespace {
void append_key(std::string& path, const std::string& key) {
  if (!path.empty()) path += '.';
  path += key;
}

bool find_difference(const nlohmann::json& a, const nlohmann::json& b, std::string& path) {
  if (a.is_object() && b.is_object()) {
    for (const auto& [k, va] : a.items()) {
      std::string sub = path;
      append_key(sub, k);
      const auto it = b.find(k);
      if (it == b.end()) {
        path = sub;
        return true;
      }
      if (find_difference(va, *it, sub)) {
        path = sub;
        return true;
      }
    }
    for (const auto& [k, vb] : b.items()) {
      if (!a.contains(k)) {
        append_key(path, k);
        return true;
      }
    }
    return false;
  }
  if (a.is_array() && b.is_array()) {
    const std::size_t n = std::min(a.size(), b.size());
    for (std::size_t i = 0; i < n; ++i) {
      std::string sub = path + "[" + std::to_string(i) + "]";
      if (find_difference(a[i], b[i], sub)) {
        path = sub;
        return true;
      }
    }
    if (a.size() != b.size()) {
      path += "[" + std::to_string(n) + "]";
      return true;
    }
    return false;
  }
  // Numbers compare by value: 1 (integer) and 1.0 (float) are the same setting.
  if (a.is_number() && b.is_number() && (a.is_number_float() || b.is_number_float())) {
    return a.get<double>() != b.get<double>();
  }
  return a != b;
}
}  // namespace

std::string first_difference(const nlohmann::json& a, const nlohmann::json& b) {
  std::string path;
  if (!find_difference(a, b, path)) return {};
  return path.empty() ? std::string("(top level)") : path;
}

std::string describe_difference(const nlohmann::json& saved, const nlohmann::json& requested) {
  const std::string key = first_difference(saved, requested);
  if (key.empty()) return {};
  auto at = [&](const nlohmann::json& j) -> std::string {
    const nlohmann::json* p = &j;
    std::string rest = key;
    while (!rest.empty() && p != nullptr) {
      const auto dot = rest.find('.');
      const std::string part = rest.substr(0, dot);
      rest = dot == std::string::npos ? std::string() : rest.substr(dot + 1);
      if (!p->is_object() || !p->contains(part)) return "(absent)";
      p = &(*p)[part];
    }
    return p->dump();
  };
  return key + ": checkpoint has " + at(saved) + ", this run has " + at(requested);
}

}  // namespace ght::trainer
