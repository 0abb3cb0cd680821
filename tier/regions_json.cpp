#include "tier/regions_json.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "tier/config.hpp"
#include "tier/cost_model.hpp"

namespace ght::tier {

namespace {

using json = nlohmann::ordered_json;

constexpr int kPlanVersion = 1;

[[noreturn]] void fail(const std::string& origin, const std::string& path, const std::string& msg) {
  throw io_error(origin + ": " + path + ": " + msg);
}

std::string join(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

void check_keys(const json& j, const std::string& origin, const std::string& path,
                std::initializer_list<std::string_view> a, std::initializer_list<std::string_view> b = {}) {
  if (!j.is_object()) fail(origin, path.empty() ? "(top level)" : path, "expected an object");
  for (const auto& [key, value] : j.items()) {
    bool known = false;
    for (auto k : a) known |= key == k;
    for (auto k : b) known |= key == k;
    if (!known) fail(origin, join(path, key), "unknown key");
  }
}

const json* get(const json& j, std::string_view key) {
  const auto it = j.find(std::string(key));
  return it == j.end() ? nullptr : &*it;
}

// Doubles: numbers, or "inf" / "-inf" / "nan" for what JSON cannot spell.
void put_double(json& j, const char* key, double v) {
  if (std::isfinite(v)) {
    j[key] = v;
  } else {
    j[key] = std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  }
}

double read_double(const json& v, const std::string& origin, const std::string& path) {
  if (v.is_number()) return v.get<double>();
  if (v.is_string()) {
    const auto s = v.get<std::string>();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  }
  fail(origin, path, "expected a number");
}

double get_double(const json& j, std::string_view key, const std::string& origin,
                  const std::string& path, double def) {
  const json* v = get(j, key);
  return v == nullptr ? def : read_double(*v, origin, join(path, key));
}

std::uint64_t read_u64(const json& v, const std::string& origin, const std::string& path) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (v.is_number_integer()) fail(origin, path, "must be >= 0, got " + v.dump());
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d >= 0 && d < 1.8e19 && std::floor(d) == d) return static_cast<std::uint64_t>(d);
    fail(origin, path, "expected a whole number of bytes >= 0, got " + v.dump());
  }
  fail(origin, path, "expected a whole number of bytes");
}

std::uint64_t get_u64(const json& j, std::string_view key, const std::string& origin,
                      const std::string& path) {
  const json* v = get(j, key);
  if (v == nullptr) fail(origin, join(path, key), "missing");
  return read_u64(*v, origin, join(path, key));
}

int get_int(const json& j, std::string_view key, const std::string& origin, const std::string& path,
            int def) {
  const json* v = get(j, key);
  if (v == nullptr) return def;
  if (!v->is_number_integer()) fail(origin, join(path, key), "expected an integer");
  const auto x = v->get<std::int64_t>();
  if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max()) {
    fail(origin, join(path, key), "out of range");
  }
  return static_cast<int>(x);
}

bool get_bool(const json& j, std::string_view key, const std::string& origin, const std::string& path,
              bool def) {
  const json* v = get(j, key);
  if (v == nullptr) return def;
  if (!v->is_boolean()) fail(origin, join(path, key), "expected true or false");
  return v->get<bool>();
}

std::string get_string(const json& j, std::string_view key, const std::string& origin,
                       const std::string& path, const std::string* def) {
  const json* v = get(j, key);
  if (v == nullptr) {
    if (def == nullptr) fail(origin, join(path, key), "missing");
    return *def;
  }
  if (!v->is_string()) fail(origin, join(path, key), "expected a string");
  return v->get<std::string>();
}

// ---- access and region ----

json access_to_json(const Access& a) {
  json j = json::object();
  if (a.what != "compute") j["what"] = a.what;
  if (a.gpu_read_bytes != 0) put_double(j, "gpu_read_bytes", a.gpu_read_bytes);
  if (a.gpu_write_bytes != 0) put_double(j, "gpu_write_bytes", a.gpu_write_bytes);
  if (a.cpu_read_bytes != 0) put_double(j, "cpu_read_bytes", a.cpu_read_bytes);
  if (a.cpu_write_bytes != 0) put_double(j, "cpu_write_bytes", a.cpu_write_bytes);
  if (a.times_per_step != 1) put_double(j, "times_per_step", a.times_per_step);
  if (!a.overlappable) j["overlappable"] = false;
  if (a.window_fraction != 1) put_double(j, "window_fraction", a.window_fraction);
  if (a.gpu_path != GpuPath::copy) j["gpu_path"] = std::string(to_string(a.gpu_path));
  if (a.routing_tokens != 0) put_double(j, "routing_tokens", a.routing_tokens);
  if (a.hbm_pass) j["hbm_pass"] = true;
  if (a.hbm_pass_share != 1) put_double(j, "hbm_pass_share", a.hbm_pass_share);
  if (a.hbm_pass_bps != 0) put_double(j, "hbm_pass_bps", a.hbm_pass_bps);
  if (a.backward_hbm_bytes != 0) put_double(j, "backward_hbm_bytes", a.backward_hbm_bytes);
  if (a.backward_exposed != 0) put_double(j, "backward_exposed", a.backward_exposed);
  return j;
}

Access access_from_json(const json& j, const std::string& origin, const std::string& path) {
  check_keys(j, origin, path,
             {"what", "gpu_read_bytes", "gpu_write_bytes", "cpu_read_bytes", "cpu_write_bytes",
              "times_per_step", "overlappable", "window_fraction", "gpu_path", "routing_tokens", "hbm_pass",
              "hbm_pass_share", "hbm_pass_bps", "backward_hbm_bytes", "backward_exposed"});
  Access a;
  const std::string def_what = "compute";
  a.what = get_string(j, "what", origin, path, &def_what);
  a.gpu_read_bytes = get_double(j, "gpu_read_bytes", origin, path, 0);
  a.gpu_write_bytes = get_double(j, "gpu_write_bytes", origin, path, 0);
  a.cpu_read_bytes = get_double(j, "cpu_read_bytes", origin, path, 0);
  a.cpu_write_bytes = get_double(j, "cpu_write_bytes", origin, path, 0);
  a.times_per_step = get_double(j, "times_per_step", origin, path, 1);
  a.overlappable = get_bool(j, "overlappable", origin, path, true);
  a.window_fraction = get_double(j, "window_fraction", origin, path, 1);
  const std::string def_path = "copy";
  const std::string gp = get_string(j, "gpu_path", origin, path, &def_path);
  const auto p = parse_gpu_path(gp);
  if (!p) fail(origin, join(path, "gpu_path"), "expected copy or kernel, got '" + gp + "'");
  a.gpu_path = *p;
  a.routing_tokens = get_double(j, "routing_tokens", origin, path, 0);
  a.hbm_pass = get_bool(j, "hbm_pass", origin, path, false);
  a.hbm_pass_share = get_double(j, "hbm_pass_share", origin, path, 1);
  if (!(a.hbm_pass_share > 0 && a.hbm_pass_share <= 1)) fail(origin, join(path, "hbm_pass_share"), "must be in (0, 1]");
  a.hbm_pass_bps = get_double(j, "hbm_pass_bps", origin, path, 0);
  if (!(a.hbm_pass_bps >= 0 && std::isfinite(a.hbm_pass_bps))) fail(origin, join(path, "hbm_pass_bps"), "must be >= 0");
  a.backward_hbm_bytes = get_double(j, "backward_hbm_bytes", origin, path, 0);
  if (!(a.backward_hbm_bytes >= 0)) fail(origin, join(path, "backward_hbm_bytes"), "must be >= 0");
  a.backward_exposed = get_double(j, "backward_exposed", origin, path, 0);
  if (!(a.backward_exposed >= 0 && a.backward_exposed <= 1)) {
    fail(origin, join(path, "backward_exposed"), "must be in [0, 1]");
  }
  for (double v : {a.gpu_read_bytes, a.gpu_write_bytes, a.cpu_read_bytes, a.cpu_write_bytes,
                   a.times_per_step, a.routing_tokens}) {
    if (!(v >= 0) || !std::isfinite(v)) fail(origin, path, "byte counts, times_per_step and routing_tokens must be finite and >= 0");
  }
  if (!(a.window_fraction >= 0 && a.window_fraction <= 1)) {
    fail(origin, join(path, "window_fraction"), "must be within [0, 1]");
  }
  return a;
}

json access_list_to_json(const std::vector<Access>& list) {
  json a = json::array();
  for (const Access& x : list) a.push_back(access_to_json(x));
  return a;
}

std::vector<Access> access_list_from_json(const json& j, const std::string& origin,
                                          const std::string& path) {
  if (!j.is_array()) fail(origin, path, "expected an array");
  std::vector<Access> out;
  for (std::size_t i = 0; i < j.size(); ++i) {
    out.push_back(access_from_json(j[i], origin, path + "[" + std::to_string(i) + "]"));
  }
  return out;
}

const std::initializer_list<std::string_view> kRegionKeys = {
    "name",     "class",        "group",           "bytes",  "host_bytes", "hbm_bytes_on_host", "access",
    "host_access", "hbm_allowed", "host_allowed", "recompute_bytes", "recompute_flops",
    "layer",    "expert",       "routing_frequency"};
const std::initializer_list<std::string_view> kDecisionKeys = {"tier", "mode", "reason",
                                                                   "gain_ms_per_gib", "rule"};

json region_to_json(const Region& r) {
  json j = json::object();
  j["name"] = r.name;
  j["class"] = std::string(to_string(r.cls));
  if (!r.group.empty()) j["group"] = r.group;
  j["bytes"] = r.bytes;
  if (r.host_bytes) j["host_bytes"] = *r.host_bytes;
  if (r.hbm_bytes_on_host != 0) j["hbm_bytes_on_host"] = r.hbm_bytes_on_host;
  if (!r.access.empty()) j["access"] = access_list_to_json(r.access);
  if (r.host_access) j["host_access"] = access_list_to_json(*r.host_access);
  if (!r.hbm_allowed) j["hbm_allowed"] = false;
  if (!r.host_allowed) j["host_allowed"] = false;
  if (r.recompute_bytes) j["recompute_bytes"] = *r.recompute_bytes;
  if (r.recompute_flops != 0) put_double(j, "recompute_flops", r.recompute_flops);
  if (r.layer != -1) j["layer"] = r.layer;
  if (r.expert != -1) j["expert"] = r.expert;
  if (r.routing_frequency != 0) put_double(j, "routing_frequency", r.routing_frequency);
  return j;
}

Region region_from_json(const json& j, const std::string& origin, const std::string& path,
                        bool with_decision) {
  if (with_decision) {
    check_keys(j, origin, path, kRegionKeys, kDecisionKeys);
  } else {
    check_keys(j, origin, path, kRegionKeys);
  }
  Region r;
  r.name = get_string(j, "name", origin, path, nullptr);
  const std::string cls = get_string(j, "class", origin, path, nullptr);
  const auto c = parse_tensor_class(cls);
  if (!c) {
    fail(origin, join(path, "class"),
         "unknown class '" + cls + "'; expected weight, grad, master, adam_m, adam_v, activation or other");
  }
  r.cls = *c;
  const std::string empty;
  r.group = get_string(j, "group", origin, path, &empty);
  r.bytes = get_u64(j, "bytes", origin, path);
  if (get(j, "host_bytes")) r.host_bytes = get_u64(j, "host_bytes", origin, path);
  if (get(j, "hbm_bytes_on_host")) r.hbm_bytes_on_host = get_u64(j, "hbm_bytes_on_host", origin, path);
  if (const json* a = get(j, "access")) r.access = access_list_from_json(*a, origin, join(path, "access"));
  if (const json* a = get(j, "host_access")) {
    r.host_access = access_list_from_json(*a, origin, join(path, "host_access"));
  }
  r.hbm_allowed = get_bool(j, "hbm_allowed", origin, path, true);
  r.host_allowed = get_bool(j, "host_allowed", origin, path, true);
  if (get(j, "recompute_bytes")) r.recompute_bytes = get_u64(j, "recompute_bytes", origin, path);
  r.recompute_flops = get_double(j, "recompute_flops", origin, path, 0);
  r.layer = get_int(j, "layer", origin, path, -1);
  r.expert = get_int(j, "expert", origin, path, -1);
  r.routing_frequency = get_double(j, "routing_frequency", origin, path, 0);
  return r;
}

json parse_text(const std::string& text, const std::string& origin) {
  try {
    return json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw io_error(origin + ": not valid JSON: " + e.what());
  }
}

void validate_or_io(const std::vector<Region>& regions, const std::string& origin) {
  try {
    validate_regions(regions);
  } catch (const ght::logic_error& e) {
    throw io_error(origin + ": " + e.what());
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw io_error(path + ": cannot open for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw io_error(path + ": read failed");
  return ss.str();
}

// One key per line at the top, one region per line in the array: readable and diff-able.
std::string layout(const json& top, const json& regions) {
  std::string out = "{\n";
  for (const auto& [key, value] : top.items()) {
    out += "  " + json(key).dump() + ": " + value.dump() + ",\n";
  }
  out += "  \"regions\": [";
  for (std::size_t i = 0; i < regions.size(); ++i) {
    out += (i ? ",\n    " : "\n    ") + regions[i].dump();
  }
  out += regions.empty() ? "]\n}\n" : "\n  ]\n}\n";
  return out;
}

}  // namespace

std::string regions_to_json(const std::vector<Region>& regions, double step_flops) {
  json top = json::object();
  put_double(top, "step_flops", step_flops);
  json arr = json::array();
  for (const Region& r : regions) arr.push_back(region_to_json(r));
  return layout(top, arr);
}

RegionSet regions_from_json(const std::string& text, const std::string& origin) {
  const json j = parse_text(text, origin);
  RegionSet set;
  const json* arr = &j;
  if (j.is_object()) {
    check_keys(j, origin, "", {"step_flops", "regions"});
    set.step_flops = get_double(j, "step_flops", origin, "", 0);
    if (!(set.step_flops >= 0) || !std::isfinite(set.step_flops)) {
      fail(origin, "step_flops", "must be finite and >= 0");
    }
    arr = get(j, "regions");
    if (arr == nullptr) fail(origin, "regions", "missing");
  }
  if (!arr->is_array()) fail(origin, "regions", "expected an array of regions");
  for (std::size_t i = 0; i < arr->size(); ++i) {
    set.regions.push_back(region_from_json((*arr)[i], origin, "regions[" + std::to_string(i) + "]", false));
  }
  validate_or_io(set.regions, origin);
  return set;
}

RegionSet load_regions_file(const std::string& path) { return regions_from_json(read_file(path), path); }

std::string measurements_to_json(const Measurements& m) {
  json j = json::object();
  put_double(j, "step_tokens", m.step_tokens);
  json e = json::array();
  for (const auto& x : m.expert_tokens) {
    json o = {{"layer", x.layer}, {"expert", x.expert}};
    put_double(o, "tokens", x.tokens);
    e.push_back(o);
  }
  j["expert_tokens"] = e;
  json l = json::array();
  for (const auto& x : m.link_bytes) {
    json o = {{"region", x.region}};
    put_double(o, "h2d_bytes", x.h2d_bytes);
    put_double(o, "d2h_bytes", x.d2h_bytes);
    l.push_back(o);
  }
  j["link_bytes"] = l;
  if (m.phases.present()) {
    json ph = json::object();
    put_double(ph, "step_flops", m.phases.step_flops);
    put_double(ph, "recompute_flops", m.phases.recompute_flops);
    put_double(ph, "head_flops", m.phases.head_flops);
    put_double(ph, "forward_seconds", m.phases.forward_seconds);
    put_double(ph, "backward_seconds", m.phases.backward_seconds);
    j["phases"] = ph;
  }
  return j.dump(1) + "\n";
}

Measurements measurements_from_json(const std::string& text, const std::string& origin) {
  const json j = parse_text(text, origin);
  check_keys(j, origin, "", {"step_tokens", "expert_tokens", "link_bytes", "phases"});
  Measurements m;
  m.step_tokens = get_double(j, "step_tokens", origin, "", 0);
  if (const json* e = get(j, "expert_tokens")) {
    if (!e->is_array()) fail(origin, "expert_tokens", "expected an array");
    for (std::size_t i = 0; i < e->size(); ++i) {
      const std::string path = "expert_tokens[" + std::to_string(i) + "]";
      const json& o = (*e)[i];
      check_keys(o, origin, path, {"layer", "expert", "tokens"});
      ExpertTokens x;
      x.layer = get_int(o, "layer", origin, path, -1);
      x.expert = get_int(o, "expert", origin, path, -1);
      if (get(o, "tokens") == nullptr) fail(origin, join(path, "tokens"), "missing");
      x.tokens = get_double(o, "tokens", origin, path, 0);
      if (!(x.tokens >= 0) || !std::isfinite(x.tokens)) fail(origin, join(path, "tokens"), "must be finite and >= 0");
      m.expert_tokens.push_back(x);
    }
  }
  if (const json* l = get(j, "link_bytes")) {
    if (!l->is_array()) fail(origin, "link_bytes", "expected an array");
    for (std::size_t i = 0; i < l->size(); ++i) {
      const std::string path = "link_bytes[" + std::to_string(i) + "]";
      const json& o = (*l)[i];
      check_keys(o, origin, path, {"region", "h2d_bytes", "d2h_bytes"});
      RegionLinkBytes x;
      x.region = get_string(o, "region", origin, path, nullptr);
      x.h2d_bytes = get_double(o, "h2d_bytes", origin, path, 0);
      x.d2h_bytes = get_double(o, "d2h_bytes", origin, path, 0);
      m.link_bytes.push_back(x);
    }
  }
  if (const json* ph = get(j, "phases")) {
    check_keys(*ph, origin, "phases",
               {"step_flops", "recompute_flops", "head_flops", "forward_seconds", "backward_seconds"});
    for (const char* k : {"step_flops", "forward_seconds", "backward_seconds"}) {
      if (get(*ph, k) == nullptr) fail(origin, join("phases", k), "missing");
    }
    m.phases.step_flops = get_double(*ph, "step_flops", origin, "phases", 0);
    m.phases.recompute_flops = get_double(*ph, "recompute_flops", origin, "phases", 0);
    m.phases.head_flops = get_double(*ph, "head_flops", origin, "phases", 0);
    m.phases.forward_seconds = get_double(*ph, "forward_seconds", origin, "phases", 0);
    m.phases.backward_seconds = get_double(*ph, "backward_seconds", origin, "phases", 0);
    try {
      (void)calibrate_compute(m.phases, PlanOptions{}.head_tflops);  // GHT_ASSUMED_HEAD_TFLOPS' default
    } catch (const config_error& e) {
      fail(origin, "phases", e.what());
    }
  }
  return m;
}

Measurements load_measurements_file(const std::string& path) {
  return measurements_from_json(read_file(path), path);
}

std::optional<Measurements> configured_measurements() {
  const std::string path = config::cfg().get_string(config::Key::GHT_PLAN_MEASUREMENTS);
  if (path.empty()) return std::nullopt;
  try {
    return load_measurements_file(path);
  } catch (const io_error& e) {
    throw io_error(std::string("GHT_PLAN_MEASUREMENTS: ") + e.what());
  }
}

// ---- Plan JSON ----------------------------------------------------------------------------------

std::string Plan::to_json() const {
  const PlanOptions& o = options_;
  json top = json::object();
  top["format"] = "ghtier-plan";
  top["version"] = kPlanVersion;
  top["policy"] = std::string(to_string(o.policy));
  top["place"] = o.place;
  top["budgets"] = {{"hbm", o.budgets.hbm},
                    {"host", o.budgets.host},
                    {"hbm_origin", o.budgets.hbm_origin},
                    {"host_origin", o.budgets.host_origin}};
  json link = json::object();
  link["name"] = o.link.name;
  link["source"] = o.link.source;
  link["kind"] = std::string(ght::to_string(o.link.kind));
  put_double(link, "h2d_bps", o.link.h2d_bps);
  put_double(link, "d2h_bps", o.link.d2h_bps);
  put_double(link, "bidir_bps", o.link.bidir_bps);
  put_double(link, "kernel_read_bps", o.link.kernel_read_bps);
  put_double(link, "kernel_write_bps", o.link.kernel_write_bps);
  put_double(link, "host_triad_bps", o.link.host_triad_bps);
  put_double(link, "hbm_bps", o.link.hbm_bps);
  top["link"] = link;
  put_double(top, "step_flops", o.step_flops);
  put_double(top, "assumed_tflops", o.assumed_tflops);
  put_double(top, "backward_ratio", o.backward_ratio);
  put_double(top, "head_flops", o.head_flops);
  put_double(top, "head_tflops", o.head_tflops);
  top["stream_staging_bytes"] = o.stream_staging_bytes;
  top["host_state_hbm_bytes"] = o.host_state_hbm_bytes;
  top["recompute_scratch_bytes"] = o.recompute_scratch_bytes;
  top["delayed_update_hbm_bytes"] = o.delayed_update_hbm_bytes;
  if (o.speculation_hbm_bytes != 0) top["speculation_hbm_bytes"] = o.speculation_hbm_bytes;
  if (o.fp8_hbm_bytes != 0) top["fp8_hbm_bytes"] = o.fp8_hbm_bytes;
  if (o.fp8_saved_seconds != 0) put_double(top, "fp8_saved_seconds", o.fp8_saved_seconds);
  top["summary"] = {{"grad_mode", mode_summary(TensorClass::grad)},
                    {"activation_mode", mode_summary(TensorClass::activation)}};
  const Prediction& p = prediction_;
  json pj = json::object();
  pj["hbm_bytes"] = p.hbm_bytes;
  pj["host_bytes"] = p.host_bytes;
  put_double(pj, "h2d_bytes", p.h2d_bytes);
  put_double(pj, "d2h_bytes", p.d2h_bytes);
  put_double(pj, "h2d_seconds", p.h2d_seconds);
  put_double(pj, "d2h_seconds", p.d2h_seconds);
  put_double(pj, "link_seconds", p.link_seconds);
  put_double(pj, "host_traffic_bytes", p.host_traffic_bytes);
  put_double(pj, "host_seconds", p.host_seconds);
  put_double(pj, "compute_seconds", p.compute_seconds);
  put_double(pj, "forward_seconds", p.forward_seconds);
  put_double(pj, "head_seconds", p.head_seconds);
  put_double(pj, "accumulate_seconds", p.accumulate_seconds);
  put_double(pj, "recompute_seconds", p.recompute_seconds);
  put_double(pj, "window_seconds", p.window_seconds);
  put_double(pj, "hbm_pass_seconds", p.hbm_pass_seconds);
  put_double(pj, "exposed_seconds", p.exposed_seconds);
  put_double(pj, "step_seconds", p.step_seconds);
  put_double(pj, "optimizer_link_seconds", p.optimizer_link_seconds);
  top["prediction"] = pj;
  top["notes"] = notes_;
  json arr = json::array();
  for (std::size_t i = 0; i < regions_.size(); ++i) {
    json r = region_to_json(regions_[i]);
    const Decision& d = decisions_[i];
    r["tier"] = std::string(ght::to_string(d.tier));
    r["mode"] = std::string(tier::to_string(d.mode));
    r["reason"] = d.reason;
    if (d.gain_ms_per_gib != 0) put_double(r, "gain_ms_per_gib", d.gain_ms_per_gib);
    if (d.rule != 0) r["rule"] = d.rule;
    arr.push_back(std::move(r));
  }
  return layout(top, arr);
}

Plan Plan::from_json(const std::string& text, const std::string& origin) {
  const json j = parse_text(text, origin);
  check_keys(j, origin, "",
             {"format", "version", "policy", "place", "budgets", "link", "step_flops",
              "assumed_tflops", "backward_ratio", "head_flops", "head_tflops", "stream_staging_bytes", "host_state_hbm_bytes", "recompute_scratch_bytes", "delayed_update_hbm_bytes", "speculation_hbm_bytes", "fp8_hbm_bytes", "fp8_saved_seconds", "summary", "prediction", "notes", "regions"});
  if (get_string(j, "format", origin, "", nullptr) != "ghtier-plan") {
    fail(origin, "format", "expected \"ghtier-plan\" (is this a ght plan --json file?)");
  }
  if (get_int(j, "version", origin, "", 0) != kPlanVersion) {
    fail(origin, "version", "unsupported plan version; this build reads version " + std::to_string(kPlanVersion));
  }
  PlanOptions o;
  const std::string pol = get_string(j, "policy", origin, "", nullptr);
  const auto policy = parse_policy(pol);
  if (!policy) fail(origin, "policy", "expected static, greedy or auto, got '" + pol + "'");
  o.policy = *policy;
  o.place = get_string(j, "place", origin, "", nullptr);
  const json* b = get(j, "budgets");
  if (b == nullptr) fail(origin, "budgets", "missing");
  check_keys(*b, origin, "budgets", {"hbm", "host", "hbm_origin", "host_origin"});
  o.budgets.hbm = get_u64(*b, "hbm", origin, "budgets");
  o.budgets.host = get_u64(*b, "host", origin, "budgets");
  o.budgets.hbm_origin = get_string(*b, "hbm_origin", origin, "budgets", nullptr);
  o.budgets.host_origin = get_string(*b, "host_origin", origin, "budgets", nullptr);
  const json* l = get(j, "link");
  if (l == nullptr) fail(origin, "link", "missing");
  check_keys(*l, origin, "link",
             {"name", "source", "kind", "h2d_bps", "d2h_bps", "bidir_bps", "kernel_read_bps",
              "kernel_write_bps", "host_triad_bps", "hbm_bps"});
  o.link.name = get_string(*l, "name", origin, "link", nullptr);
  o.link.source = get_string(*l, "source", origin, "link", nullptr);
  const std::string kind = get_string(*l, "kind", origin, "link", nullptr);
  const auto k = parse_link_kind(kind);
  if (!k) fail(origin, "link.kind", "expected none, pcie or c2c, got '" + kind + "'");
  o.link.kind = *k;
  o.link.h2d_bps = get_double(*l, "h2d_bps", origin, "link", 0);
  o.link.d2h_bps = get_double(*l, "d2h_bps", origin, "link", 0);
  o.link.bidir_bps = get_double(*l, "bidir_bps", origin, "link", 0);
  o.link.kernel_read_bps = get_double(*l, "kernel_read_bps", origin, "link", 0);
  o.link.kernel_write_bps = get_double(*l, "kernel_write_bps", origin, "link", 0);
  o.link.host_triad_bps = get_double(*l, "host_triad_bps", origin, "link", 0);
  o.link.hbm_bps = get_double(*l, "hbm_bps", origin, "link", 0);
  o.step_flops = get_double(j, "step_flops", origin, "", 0);
  o.assumed_tflops = get_double(j, "assumed_tflops", origin, "", 0);
  if (get(j, "backward_ratio")) o.backward_ratio = get_double(j, "backward_ratio", origin, "", 0);
  if (get(j, "head_flops")) o.head_flops = get_double(j, "head_flops", origin, "", 0);
  if (get(j, "head_tflops")) o.head_tflops = get_double(j, "head_tflops", origin, "", 0);
  o.stream_staging_bytes = get_u64(j, "stream_staging_bytes", origin, "");
  if (get(j, "host_state_hbm_bytes")) o.host_state_hbm_bytes = get_u64(j, "host_state_hbm_bytes", origin, "");
  if (get(j, "recompute_scratch_bytes")) o.recompute_scratch_bytes = get_u64(j, "recompute_scratch_bytes", origin, "");
  if (get(j, "delayed_update_hbm_bytes")) o.delayed_update_hbm_bytes = get_u64(j, "delayed_update_hbm_bytes", origin, "");
  if (get(j, "speculation_hbm_bytes")) o.speculation_hbm_bytes = get_u64(j, "speculation_hbm_bytes", origin, "");
  if (get(j, "fp8_hbm_bytes")) o.fp8_hbm_bytes = get_u64(j, "fp8_hbm_bytes", origin, "");
  if (get(j, "fp8_saved_seconds")) o.fp8_saved_seconds = get_double(j, "fp8_saved_seconds", origin, "", 0);

  const json* pj = get(j, "prediction");
  if (pj == nullptr) fail(origin, "prediction", "missing");
  check_keys(*pj, origin, "prediction",
             {"hbm_bytes", "host_bytes", "h2d_bytes", "d2h_bytes", "h2d_seconds", "d2h_seconds",
              "link_seconds", "host_traffic_bytes", "host_seconds", "compute_seconds", "forward_seconds",
              "head_seconds", "accumulate_seconds", "recompute_seconds", "window_seconds", "hbm_pass_seconds", "exposed_seconds", "step_seconds",
              "optimizer_link_seconds"});
  Prediction p;
  const std::string pp = "prediction";
  p.hbm_bytes = get_u64(*pj, "hbm_bytes", origin, pp);
  p.host_bytes = get_u64(*pj, "host_bytes", origin, pp);
  p.h2d_bytes = get_double(*pj, "h2d_bytes", origin, pp, 0);
  p.d2h_bytes = get_double(*pj, "d2h_bytes", origin, pp, 0);
  p.h2d_seconds = get_double(*pj, "h2d_seconds", origin, pp, 0);
  p.d2h_seconds = get_double(*pj, "d2h_seconds", origin, pp, 0);
  p.link_seconds = get_double(*pj, "link_seconds", origin, pp, 0);
  p.host_traffic_bytes = get_double(*pj, "host_traffic_bytes", origin, pp, 0);
  p.host_seconds = get_double(*pj, "host_seconds", origin, pp, 0);
  p.compute_seconds = get_double(*pj, "compute_seconds", origin, pp, 0);
  p.forward_seconds = get_double(*pj, "forward_seconds", origin, pp, 0);
  p.head_seconds = get_double(*pj, "head_seconds", origin, pp, 0);
  p.accumulate_seconds = get_double(*pj, "accumulate_seconds", origin, pp, 0);
  p.recompute_seconds = get_double(*pj, "recompute_seconds", origin, pp, 0);
  p.window_seconds = get_double(*pj, "window_seconds", origin, pp, 0);
  p.hbm_pass_seconds = get_double(*pj, "hbm_pass_seconds", origin, pp, 0);
  p.exposed_seconds = get_double(*pj, "exposed_seconds", origin, pp, 0);
  p.step_seconds = get_double(*pj, "step_seconds", origin, pp, 0);
  p.optimizer_link_seconds = get_double(*pj, "optimizer_link_seconds", origin, pp, 0);

  std::vector<std::string> notes;
  if (const json* n = get(j, "notes")) {
    if (!n->is_array()) fail(origin, "notes", "expected an array of strings");
    for (const auto& s : *n) {
      if (!s.is_string()) fail(origin, "notes", "expected an array of strings");
      notes.push_back(s.get<std::string>());
    }
  }
  const json* arr = get(j, "regions");
  if (arr == nullptr || !arr->is_array()) fail(origin, "regions", "expected an array");
  std::vector<Region> regions;
  std::vector<Decision> decisions;
  for (std::size_t i = 0; i < arr->size(); ++i) {
    const std::string path = "regions[" + std::to_string(i) + "]";
    const json& rj = (*arr)[i];
    regions.push_back(region_from_json(rj, origin, path, true));
    Decision d;
    const std::string tier = get_string(rj, "tier", origin, path, nullptr);
    const auto t = parse_tier(tier);
    if (!t) fail(origin, join(path, "tier"), "expected hbm or host, got '" + tier + "'");
    d.tier = *t;
    const std::string mode = get_string(rj, "mode", origin, path, nullptr);
    const auto m = parse_mode(mode);
    if (!m) fail(origin, join(path, "mode"), "unknown mode '" + mode + "'");
    d.mode = *m;
    d.reason = get_string(rj, "reason", origin, path, nullptr);
    d.gain_ms_per_gib = get_double(rj, "gain_ms_per_gib", origin, path, 0);
    d.rule = get_int(rj, "rule", origin, path, 0);
    decisions.push_back(std::move(d));
  }
  validate_or_io(regions, origin);
  // A hand-edited plan must still be one the engine could have made.
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const Placement got{decisions[i].tier, decisions[i].mode};
    const auto allowed = placements(regions[i]);
    const bool ok = o.link.kind == LinkKind::none
                        ? got.tier == TierKind::host
                        : std::find(allowed.begin(), allowed.end(), got) != allowed.end();
    if (!ok) {
      fail(origin, "regions[" + std::to_string(i) + "]",
           "region '" + regions[i].name + "' does not allow tier " + std::string(ght::to_string(got.tier)) +
               " with mode " + std::string(tier::to_string(got.mode)));
    }
  }
  return Plan(std::move(o), std::move(regions), std::move(decisions), p, std::move(notes));
}

}  // namespace ght::tier
