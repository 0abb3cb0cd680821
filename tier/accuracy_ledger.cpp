#include "tier/accuracy_ledger.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tier/accuracy_ledger_builtin.hpp"  // generated: kBuiltinLedgerJson
#include "tier/config.hpp"
#include "tier/error.hpp"

namespace ght::tier {

namespace {

using json = nlohmann::json;

std::string percent(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%+.2f%%", 100.0 * x);
  return b;
}

std::string count(double n) {
  char b[32];
  if (n >= 1e9) {
    std::snprintf(b, sizeof b, "%.2fB", n / 1e9);
  } else {
    std::snprintf(b, sizeof b, "%.1fM", n / 1e6);
  }
  return b;
}

template <class T>
T field(const json& v, const char* key, const std::string& where) {
  if (!v.contains(key)) throw io_error(where + ": missing field \"" + key + "\"");
  try {
    return v.at(key).get<T>();
  } catch (const json::exception&) {
    throw io_error(where + ": field \"" + std::string(key) + "\" has the wrong type");
  }
}

Verdict parse_verdict(const json& v, const std::string& where) {
  if (!v.is_object()) throw io_error(where + ": expected an object");
  Verdict d;
  d.option = field<std::string>(v, "option", where);
  d.value = field<std::string>(v, "value", where);
  d.model = field<std::string>(v, "model", where);
  d.params = field<double>(v, "params", where);
  d.steps = field<long long>(v, "steps", where);
  d.lr = field<double>(v, "lr", where);
  d.exact_seeds = field<int>(v, "exact_seeds", where);
  d.eval_loss_delta = field<double>(v, "eval_loss_delta", where);
  d.noise_band = field<double>(v, "noise_band", where);
  if (v.contains("extra_tokens") && !v.at("extra_tokens").is_null()) d.extra_tokens = field<double>(v, "extra_tokens", where);
  d.within_noise = field<bool>(v, "within_noise", where);
  d.measured = field<std::string>(v, "measured", where);
  d.source = field<std::string>(v, "source", where);
  if (config::find_option(d.option) == nullptr) throw io_error(where + ": unknown option " + d.option);
  for (double x : {d.params, d.lr, d.noise_band}) {
    if (!std::isfinite(x) || x < 0) throw io_error(where + ": params, lr and noise_band must be finite and >= 0");
  }
  if (!std::isfinite(d.eval_loss_delta)) throw io_error(where + ": eval_loss_delta must be finite");
  // The verdict is the numbers' own: a file cannot call a choice inside the noise that is not.
  const bool inside = d.eval_loss_delta <= d.noise_band;
  if (d.within_noise != inside) {
    throw io_error(where + ": within_noise is " + (d.within_noise ? "true" : "false") + " but eval_loss_delta " +
                   percent(d.eval_loss_delta) + " is " + (inside ? "inside" : "outside") + " the noise band " +
                   percent(d.noise_band));
  }
  return d;
}

}  // namespace

std::string Verdict::describe() const {
  std::string s = option + "=" + value + ": " + percent(eval_loss_delta) + " eval loss (exact run's noise ±" +
                  percent(noise_band).substr(1) + " over " + std::to_string(exact_seeds) + " runs";
  if (extra_tokens) s += ", " + percent(*extra_tokens) + " tokens to the exact loss";
  char b[96];
  std::snprintf(b, sizeof b, "), %s (%s params), %lld steps, lr %g, %s", model.c_str(), count(params).c_str(), steps,
                lr, measured.c_str());
  return s + b;
}

Ledger Ledger::parse(const std::string& text, const std::string& origin) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    throw io_error(origin + ": not valid JSON: " + e.what());
  }
  if (!doc.is_object() || !doc.contains("verdicts") || !doc.at("verdicts").is_array()) {
    throw io_error(origin + ": expected an object with a \"verdicts\" array (tier/accuracy_ledger.json's format)");
  }
  if (doc.value("format", 0) != 1) throw io_error(origin + ": unsupported \"format\" (expected 1)");
  std::vector<Verdict> out;
  const json& list = doc.at("verdicts");
  for (std::size_t i = 0; i < list.size(); ++i) {
    out.push_back(parse_verdict(list[i], origin + ": verdicts[" + std::to_string(i) + "]"));
  }
  return Ledger(std::move(out));
}

const Ledger& Ledger::builtin() {
  static const Ledger ledger = parse(kBuiltinLedgerJson, "the built-in accuracy ledger (tier/accuracy_ledger.json)");
  return ledger;
}

Ledger Ledger::from_config() {
  const std::string path = config::cfg().get_string(config::Key::GHT_PLAN_LEDGER);
  if (path.empty()) return builtin();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw io_error("GHT_PLAN_LEDGER=" + path + ": cannot open the file");
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), "GHT_PLAN_LEDGER=" + path);
}

const Verdict* Ledger::find(std::string_view option, std::string_view value) const {
  const Verdict* best = nullptr;
  for (const Verdict& v : verdicts_) {
    if (v.option != option || v.value != value) continue;
    if (best == nullptr || v.params > best->params || (v.params == best->params && v.steps > best->steps)) best = &v;
  }
  return best;
}

}  // namespace ght::tier
