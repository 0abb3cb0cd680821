#include "tier/plan_search.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>

#include "tier/config.hpp"
#include "tier/plan_detail.hpp"

namespace ght::tier {

namespace {

using detail::fixed;

std::string gib(std::uint64_t b) { return fixed(static_cast<double>(b) / (1024.0 * 1024.0 * 1024.0), 1); }

const DimensionValue* find_value(const Dimension& d, std::string_view v) {
  for (const auto& x : d.values) {
    if (x.value == v) return &x;
  }
  return nullptr;
}

// Prices the candidate's inexact settings and decides its admission under `t`.
void price(Candidate& c, const std::vector<Dimension>& dims, const Ledger& ledger, const Tolerance& t) {
  double cost = 0;
  bool planned_inexact = false;  // an inexact value the plan would choose (not the user)
  std::string missing, outside;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const DimensionValue* v = find_value(dims[i], c.settings[i].second);
    if (v == nullptr || v->exact) continue;
    Price p{dims[i].option, v->value, dims[i].what, std::nullopt};
    if (const Verdict* verdict = ledger.find(p.option, p.value)) p.verdict = *verdict;
    const std::string name = p.option + "=" + p.value;
    if (dims[i].pinned) {  // the user's own choice: priced in the log, never refused
      c.inexact.push_back(std::move(p));
      continue;
    }
    planned_inexact = true;
    if (!p.verdict) {
      missing += (missing.empty() ? "" : ", ") + name;
    } else {
      cost += std::max(0.0, p.verdict->eval_loss_delta);
      if (!p.verdict->within_noise) outside += (outside.empty() ? "" : ", ") + name;
    }
    c.inexact.push_back(std::move(p));
  }
  if (!planned_inexact) {
    c.admitted = true;  // exact, or inexact only where the user set it
  } else if (t.kind == Tolerance::Kind::exact) {
    c.refused = "inexact (GHT_PLAN_TOLERANCE=exact)";
  } else if (!missing.empty()) {
    c.refused = "no ledger verdict for " + missing;
  } else if (t.kind == Tolerance::Kind::noise && !outside.empty()) {
    c.refused = outside + " outside the exact run's noise";
  } else if (t.kind == Tolerance::Kind::cost && cost > t.cost) {
    c.refused = "eval-loss cost " + fixed(100 * cost, 2) + "% above the tolerance " + fixed(100 * t.cost, 2) + "%";
  } else {
    c.admitted = true;
  }
}

// Rank: admitted and fitting by step time, then fitting (refused), then the infeasible by the
// bytes they miss (smallest first).
bool ranks_before(const Candidate& a, const Candidate& b) {
  auto kind = [](const Candidate& c) { return c.plan ? (c.admitted ? 0 : 1) : (c.planned ? 2 : 3); };
  const int ka = kind(a), kb = kind(b);
  if (ka != kb) return ka < kb;
  if (ka < 2) {
    if (a.rank_seconds() != b.rank_seconds()) return a.rank_seconds() < b.rank_seconds();
    return a.inexact.size() < b.inexact.size();
  }
  if (ka == 2 && a.missing_bytes != b.missing_bytes) return a.missing_bytes < b.missing_bytes;
  return a.inexact.size() < b.inexact.size();
}

void plan_candidate(Candidate& c, const PlanCandidate& plan_one) {
  c.planned = true;
  try {
    c.plan = plan_one(c.settings);
  } catch (const infeasible_plan& e) {
    c.infeasible = e.what();
    c.missing_bytes = e.missing_bytes();
  }
}

// The candidate keeps the first value of dimension d.
bool keeps_first(const Candidate& c, const std::vector<Dimension>& dims, std::size_t d) {
  return c.settings[d].second == dims[d].values.front().value;
}

// a and b agree on every prefer_first_within dimension.
bool same_preferred(const Candidate& a, const Candidate& b, const std::vector<Dimension>& dims) {
  for (std::size_t d = 0; d < dims.size(); ++d) {
    if (dims[d].prefer_first_within > 0 && a.settings[d].second != b.settings[d].second) return false;
  }
  return true;
}

// The chosen candidate (see the file comment of plan_search.hpp): the fastest admitted one, held
// to the first value of each prefer_first_within dimension where that costs less than its share,
// then one with fewer inexact choices within kPreferExactWithin of it.
std::optional<std::size_t> choose(const std::vector<Candidate>& ranked, const std::vector<Dimension>& dims) {
  auto admitted = [&](std::size_t i) { return i < ranked.size() && ranked[i].plan && ranked[i].admitted; };
  if (!admitted(0)) return std::nullopt;
  std::size_t best = 0;
  for (std::size_t d = 0; d < dims.size(); ++d) {
    if (dims[d].prefer_first_within <= 0 || keeps_first(ranked[best], dims, d)) continue;
    for (std::size_t i = 0; admitted(i); ++i) {
      if (!keeps_first(ranked[i], dims, d)) continue;
      if (ranked[i].rank_seconds() <= ranked[best].rank_seconds() * (1 + dims[d].prefer_first_within)) best = i;
      break;
    }
  }
  const double limit = ranked[best].rank_seconds() * (1 + kPreferExactWithin);
  std::size_t chosen = best;
  for (std::size_t i = 0; admitted(i); ++i) {
    if (ranked[i].rank_seconds() <= limit && same_preferred(ranked[i], ranked[best], dims) &&
        ranked[i].inexact.size() < ranked[chosen].inexact.size()) {
      chosen = i;
    }
  }
  return chosen;
}

std::string gives_up(const Candidate& c) {
  if (c.inexact.empty()) return "nothing (exact)";
  std::string s;
  for (const Price& p : c.inexact) {
    s += (s.empty() ? "" : "; ") + p.what + " " + p.value + ": ";
    s += p.verdict ? fixed(100 * p.verdict->eval_loss_delta, 2) + "% loss" : "unpriced";
  }
  return s;
}

}  // namespace

Dimension make_dimension(const config::Registry& reg, std::string option, std::string what,
                         std::vector<DimensionValue> values, bool honour_pins) {
  const config::OptionSpec* spec = config::find_option(option);
  GHT_EXPECTS(spec != nullptr, "plan search: unknown option " + option);
  Dimension d{std::move(option), std::move(what), std::move(values), std::nullopt};
  if (honour_pins && reg.source(spec->key) > config::Source::Plan) {
    std::string v = reg.text(spec->key);
    if (spec->type == config::Type::Bool) v = reg.get_bool(spec->key) ? "on" : "off";
    if (spec->type == config::Type::Enum) v = reg.get_string(spec->key);
    const DimensionValue* known = find_value(d, v);
    d.values = {known ? *known : DimensionValue{v, true}};
    d.pinned = v;
  }
  return d;
}

std::string Tolerance::describe() const {
  switch (kind) {
    case Kind::exact: return "exact";
    case Kind::noise: return "noise";
    case Kind::cost: break;
  }
  char b[32];
  std::snprintf(b, sizeof b, "%g", cost);
  return b;
}

Tolerance parse_tolerance(std::string_view text) {
  std::string t(text);
  for (char& ch : t) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (t == "exact") return {Tolerance::Kind::exact, 0};
  if (t == "noise" || t.empty()) return {Tolerance::Kind::noise, 0};
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end == t.c_str() || *end != '\0' || !std::isfinite(v) || v < 0 || v > 1) {
    throw config_error("GHT_PLAN_TOLERANCE=" + std::string(text) +
                       ": expected exact, noise, or a relative eval-loss cost in [0, 1] such as 0.01");
  }
  return {Tolerance::Kind::cost, v};
}

std::string Price::describe() const {
  return verdict ? what + " " + verdict->describe() : what + " " + option + "=" + value + ": no ledger verdict";
}

double Candidate::step_seconds() const {
  return plan ? plan->prediction().step_seconds : std::numeric_limits<double>::infinity();
}

double Candidate::rank_seconds() const {
  return plan ? plan->prediction().step_seconds - plan->prediction().hbm_pass_seconds
              : std::numeric_limits<double>::infinity();
}

std::string Candidate::changes(const std::vector<Dimension>& dims) const {
  std::string s;
  for (std::size_t i = 0; i < settings.size() && i < dims.size(); ++i) {
    const bool is_default = !dims[i].values.empty() && settings[i].second == dims[i].values.front().value &&
                            !dims[i].pinned;
    if (is_default) continue;
    // GHT_* options are set in the environment; others (model.micro_batch) with `-o`.
    if (!s.empty()) s += ' ';
    if (!settings[i].first.starts_with("GHT_")) s += "-o ";
    s += settings[i].first;
    s += '=';
    s += settings[i].second;
  }
  return s.empty() ? "(defaults)" : s;
}

const Candidate& SearchResult::best() const {
  GHT_EXPECTS(chosen.has_value(), "the plan search chose nothing: " + std::string("no plan fits the tolerance"));
  return candidates[*chosen];
}

SearchResult search_plans(const std::vector<Dimension>& dims, const PlanCandidate& plan_one, const Ledger& ledger,
                          const Tolerance& tolerance) {
  const auto t0 = std::chrono::steady_clock::now();
  SearchResult r{dims, tolerance, {}, std::nullopt, 0};
  for (const Dimension& d : dims) GHT_EXPECTS(!d.values.empty(), "plan search: dimension " + d.option + " has no value");
  std::vector<std::size_t> at(dims.size(), 0);
  for (;;) {
    Candidate c;
    for (std::size_t i = 0; i < dims.size(); ++i) c.settings.emplace_back(dims[i].option, dims[i].values[at[i]].value);
    price(c, dims, ledger, tolerance);
    if (c.admitted) plan_candidate(c, plan_one);
    r.candidates.push_back(std::move(c));
    std::size_t i = 0;
    while (i < dims.size() && ++at[i] == dims[i].values.size()) at[i++] = 0;
    if (i == dims.size()) break;
  }
  // The refused combinations matter only when nothing admitted fits: then they are the nearest
  // plans to list.
  const bool admitted_fits =
      std::any_of(r.candidates.begin(), r.candidates.end(), [](const Candidate& c) { return c.plan.has_value(); });
  if (!admitted_fits) {
    for (Candidate& c : r.candidates) {
      if (!c.planned) plan_candidate(c, plan_one);
    }
  }
  std::stable_sort(r.candidates.begin(), r.candidates.end(), ranks_before);
  r.chosen = choose(r.candidates, dims);
  r.search_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

Phases predicted_phases(const Prediction& p) {
  Phases f;
  // Plans read from JSON written before the forward's share was kept: the FLOP ratio's third.
  f.forward = p.forward_seconds > 0 ? p.forward_seconds : p.compute_seconds / 3;
  f.backward = p.compute_seconds - f.forward + p.recompute_seconds;
  f.exposed_update = std::max(0.0, p.exposed_seconds - p.recompute_seconds);
  f.step = p.step_seconds;
  return f;
}

std::string compare_phases(const Phases& predicted, const Phases& measured, double tolerance) {
  const double floor = 0.02 * predicted.step;
  const struct {
    const char* name;
    double p, m, base;
  } rows[] = {{"forward", predicted.forward, measured.forward, predicted.forward},
              {"backward", predicted.backward, measured.backward, predicted.backward},
              {"exposed update", predicted.exposed_update, measured.exposed_update,
               std::max(predicted.exposed_update, floor)},
              {"step", predicted.step, measured.step, predicted.step}};
  std::string line = "predicted against measured:";
  std::string off;
  for (const auto& r : rows) {
    line += std::string(" ") + r.name + " " + fixed(r.p, 3) + "/" + fixed(r.m, 3) + " s";
    if (r.base <= 0) continue;
    const double rel = (r.m - r.p) / r.base;
    if (std::abs(rel) > tolerance) {
      off += (off.empty() ? "" : ", ") + std::string(r.name) + " " + (rel > 0 ? "+" : "") + fixed(100 * rel, 0) + "%";
    }
  }
  if (!off.empty()) line += "; off by more than " + fixed(100 * tolerance, 0) + "%: " + off;
  return line;
}

std::string format_search(const SearchResult& r, double tokens_per_step, double peak_flops, std::size_t alternatives) {
  std::string out = "plan search: " + std::to_string(r.candidates.size()) + " combinations of";
  for (const Dimension& d : r.dimensions) {
    out += " " + d.what + (d.pinned ? " (pinned " + *d.pinned + ")" : "");
  }
  const auto planned = std::count_if(r.candidates.begin(), r.candidates.end(), [](const Candidate& c) { return c.planned; });
  out += ", tolerance " + r.tolerance.describe() + "; " + std::to_string(planned) + " planned in " +
         fixed(r.search_seconds, 2) + " s\n";
  // The settings column as wide as the longest row shown (44 at least), so the numbers line up.
  int width = 44;
  for (std::size_t i = 0, n = 0; i < r.candidates.size() && n <= alternatives && r.candidates[i].plan; ++i, ++n) {
    width = std::max(width, static_cast<int>(r.candidates[i].changes(r.dimensions).size()));
  }
  char line[768];
  std::snprintf(line, sizeof line, "  %-4s %-*s %7s %7s %7s %7s %7s %8s %8s %8s %6s  %s\n", "", width, "settings",
                "HBM GiB", "hostGiB", "fwd s", "bwd s", "upd s", "link GB", "step s", "tok/s", "MFU", "gives up");
  out += line;
  std::size_t shown = 0;
  for (std::size_t i = 0; i < r.candidates.size() && shown <= alternatives; ++i) {
    const Candidate& c = r.candidates[i];
    if (!c.plan) break;
    const Prediction& p = c.plan->prediction();
    const Phases f = predicted_phases(p);
    const double flops = c.plan->options().step_flops;
    const std::string tag = r.chosen && *r.chosen == i ? "=>" : (c.admitted ? "" : "no");
    std::snprintf(line, sizeof line, "  %-4s %-*s %7s %7s %7s %7s %7s %8s %8s %8.0f %5s%%  %s\n", tag.c_str(),
                  width, c.changes(r.dimensions).c_str(), gib(p.hbm_bytes).c_str(), gib(p.host_bytes).c_str(),
                  fixed(f.forward, 2).c_str(), fixed(f.backward, 2).c_str(), fixed(f.exposed_update, 2).c_str(),
                  fixed((p.h2d_bytes + p.d2h_bytes) / 1e9, 1).c_str(), fixed(f.step, 2).c_str(),
                  tokens_per_step / f.step, fixed(100 * flops / f.step / peak_flops, 1).c_str(),
                  c.admitted ? gives_up(c).c_str() : ("refused: " + c.refused).c_str());
    out += line;
    ++shown;
  }
  if (!r.chosen) return out + "  no plan within the tolerance fits (the error below lists what would)\n";
  return out;  // the inexact choices taken are logged with their prices by whoever applies them
}

std::string refusal_message(const SearchResult& r, double tokens_per_step) {
  std::string m = "no plan within GHT_PLAN_TOLERANCE=" + r.tolerance.describe() + " fits";
  std::string fits;
  int listed = 0;
  for (const Candidate& c : r.candidates) {
    if (!c.plan || c.admitted || listed == 3) continue;
    char b[64];
    std::snprintf(b, sizeof b, " (predicted %.2f s/step, %.0f tok/s)", c.step_seconds(), tokens_per_step / c.step_seconds());
    fits += "\n  set " + c.changes(r.dimensions) + b + ": " + c.refused;
    for (const Price& p : c.inexact) fits += "\n      " + p.describe();
    ++listed;
  }
  if (!fits.empty()) {
    return m + ". The nearest plans that fit, each outside the tolerance:" + fits +
           "\n  (or accept a cost with GHT_PLAN_TOLERANCE=<relative eval-loss cost>, e.g. 0.02)";
  }
  for (const Candidate& c : r.candidates) {
    if (c.plan || c.infeasible.empty()) continue;
    return m + ", and nothing fits at all; the nearest (" + c.changes(r.dimensions) + "): " + c.infeasible;
  }
  return m;
}

std::string search_to_json(const SearchResult& r, double tokens_per_step, double peak_flops) {
  using json = nlohmann::ordered_json;
  json j;
  j["tolerance"] = r.tolerance.describe();
  j["search_seconds"] = r.search_seconds;
  j["chosen"] = r.chosen ? json(*r.chosen) : json(nullptr);
  json dims = json::array();
  for (const Dimension& d : r.dimensions) {
    json vals = json::array();
    for (const auto& v : d.values) vals.push_back({{"value", v.value}, {"exact", v.exact}});
    dims.push_back({{"option", d.option}, {"what", d.what}, {"values", vals},
                    {"pinned", d.pinned ? json(*d.pinned) : json(nullptr)}});
  }
  j["dimensions"] = dims;
  json cands = json::array();
  for (const Candidate& c : r.candidates) {
    json s = json::object();
    for (const auto& [k, v] : c.settings) s[k] = v;
    json cj = {{"settings", s}, {"planned", c.planned}, {"fits", c.plan.has_value()}, {"admitted", c.admitted}};
    if (!c.refused.empty()) cj["refused"] = c.refused;
    if (!c.infeasible.empty()) {
      cj["infeasible"] = c.infeasible;
      cj["missing_bytes"] = c.missing_bytes;
    }
    json prices = json::array();
    for (const Price& p : c.inexact) {
      json pj = {{"option", p.option}, {"value", p.value}, {"verdict", p.verdict.has_value()}};
      if (p.verdict) {
        pj["eval_loss_delta"] = p.verdict->eval_loss_delta;
        pj["noise_band"] = p.verdict->noise_band;
        pj["within_noise"] = p.verdict->within_noise;
        pj["measured_on"] = p.verdict->model;
        pj["steps"] = p.verdict->steps;
      }
      prices.push_back(pj);
    }
    cj["inexact"] = prices;
    if (c.plan) {
      const Prediction& p = c.plan->prediction();
      const Phases f = predicted_phases(p);
      cj["predicted"] = {{"hbm_bytes", p.hbm_bytes},     {"host_bytes", p.host_bytes},
                         {"forward_s", f.forward},       {"backward_s", f.backward},
                         {"exposed_update_s", f.exposed_update},
                         {"link_bytes", p.h2d_bytes + p.d2h_bytes},
                         {"step_s", f.step},             {"tokens_per_s", tokens_per_step / f.step},
                         {"mfu", c.plan->options().step_flops / f.step / peak_flops}};
    }
    cands.push_back(cj);
  }
  j["candidates"] = cands;
  return j.dump(2) + "\n";
}

}  // namespace ght::tier
