#include "trainer/plan_decide.hpp"

#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include "tier/config.hpp"
#include "trainer/cuda/op_costs.hpp"  // Roofline (pure C++)
#include "trainer/fp8_experts.hpp"

namespace ght::trainer {

namespace {

// The candidate's settings in the registry for as long as it is planned: every function that
// reads them (model_regions, add_trainer_reservations, the LM-head chunk) then sees exactly what
// the run would. The registry is restored as it was afterwards. With `honour_pins` a user-set
// option keeps its value; without, the candidate overrides it (listing what would fit). The plan
// is made on the starting thread, before any other thread reads the registry.
class PlannedSettings {
 public:
  PlannedSettings(const tier::Settings& s, bool honour_pins) : saved_(config::cfg()) {
    for (const auto& [option, value] : s) {
      if (option == kMicroBatchOption) continue;  // the model's shape (with_planned_shape), not a GHT_* option
      if (honour_pins) {
        config::cfg().set_planned(option, value);
      } else {
        config::cfg().force_planned(option, value);
      }
    }
  }
  ~PlannedSettings() { config::cfg() = saved_; }
  PlannedSettings(const PlannedSettings&) = delete;
  PlannedSettings& operator=(const PlannedSettings&) = delete;

 private:
  config::Registry saved_;
};

ModelPlan plan_settings(const ModelConfig& cfg, const tier::PlanOptions& base, int ranks,
                        const tier::Measurements* measured) {
  tier::PlanOptions o = base;
  add_trainer_reservations(o, cfg, ranks);
  return plan_model(cfg, o, ranks, measured);
}

tier::SearchResult search(const ModelConfig& cfg, const tier::PlanOptions& base, const PlanScope& scope,
                          const tier::Measurements* measured, bool honour_pins) {
  const tier::Tolerance tolerance =
      tier::parse_tolerance(config::cfg().get_string(config::Key::GHT_PLAN_TOLERANCE));
  const tier::Ledger ledger = tier::Ledger::from_config();
  auto plan_one = [&](const tier::Settings& s) {
    PlannedSettings scoped(s, honour_pins);
    return plan_settings(with_planned_shape(cfg, s), base, scope.ranks, measured).plan;
  };
  return tier::search_plans(plan_dimensions(cfg, base, scope, honour_pins), plan_one, ledger, tolerance);
}

// The refusal: the nearest plans within the user's settings, or, where nothing fits with them,
// the plans that would fit if the user's settings changed.
std::string refusal(const ModelConfig& cfg, const tier::PlanOptions& base, const PlanScope& scope,
                    const tier::Measurements* measured, const tier::SearchResult& pinned) {
  const double tokens = static_cast<double>(cfg.tokens_per_step());
  std::string m = tier::refusal_message(pinned, tokens);
  bool any_fits = false;
  for (const tier::Candidate& c : pinned.candidates) any_fits = any_fits || c.plan.has_value();
  bool any_pin = false;
  for (const tier::Dimension& d : pinned.dimensions) any_pin = any_pin || d.pinned.has_value();
  if (any_fits || !any_pin) return m;
  const tier::SearchResult open = search(cfg, base, scope, measured, false);
  std::string fits;
  int listed = 0;
  for (const tier::Candidate& c : open.candidates) {
    if (!c.plan || listed == 3) continue;
    char b[80];
    std::snprintf(b, sizeof b, " (predicted %.2f s/step, %.0f tok/s)", c.step_seconds(), tokens / c.step_seconds());
    fits += "\n  set " + c.changes(open.dimensions) + b + (c.admitted ? "" : "; beyond the tolerance: " + c.refused);
    ++listed;
  }
  if (fits.empty()) return m;
  return m + "\nWith other values of the options you set, these fit:" + fits;
}

}  // namespace

ModelConfig with_planned_shape(const ModelConfig& cfg, const tier::Settings& settings) {
  ModelConfig c = cfg;
  for (const auto& [option, value] : settings) {
    if (option != kMicroBatchOption) continue;
    const int mb = std::stoi(value);
    const std::int64_t per = static_cast<std::int64_t>(c.seq_len) * mb, tokens = cfg.tokens_per_step();
    GHT_EXPECTS(mb >= 1 && tokens % per == 0, std::string(kMicroBatchOption) + "=" + value + ": " +
                                                  std::to_string(tokens) + " tokens per step are not a multiple of " +
                                                  std::to_string(per) + " (seq_len x micro_batch)");
    c.micro_batch = mb;
    c.grad_accum = static_cast<int>(tokens / per);
  }
  return c;
}

PlanScope local_plan_scope(const ModelConfig& cfg, int ranks, bool allow_delay) {
  PlanScope s{ranks, allow_delay};
  s.fp8_why_not = fp8_shape_refusal(cfg);
  if (s.fp8_why_not.empty()) s.fp8_why_not = fp8_unavailable_here();
  s.fp8 = s.fp8_why_not.empty();
  return s;
}

double plan_peak_flops() { return Roofline::bf16_dense_datasheet_flops; }

namespace {

// Where GHT_FP8 stands on the search's menu: searched where the user set it, or where it can run
// (scope.fp8: CUTLASS, an sm_90 GPU, the model's shapes) and the ledger prices it. Without a verdict
// no tolerance admits it, and listing what cannot run here among the plans that fit would offer a
// setting that fails: priced but unable to run, it is left out (and the plan says why).
enum class Fp8Menu { absent, searched, left_out };
Fp8Menu fp8_menu(const config::Registry& reg, const tier::PlanOptions& options, const PlanScope& scope) {
  if (options.link.kind == LinkKind::none) return Fp8Menu::absent;
  if (reg.source(config::Key::GHT_FP8) > config::Source::Plan) return Fp8Menu::searched;
  if (tier::Ledger::from_config().find("GHT_FP8", "experts") == nullptr) return Fp8Menu::absent;
  return scope.fp8 ? Fp8Menu::searched : Fp8Menu::left_out;
}

}  // namespace

namespace {

// The micro-batch dimension (plan_decide.hpp): the configured micro-batch first (the exact default
// of the table's "changes"), then 2, 4 and 8 times it where the accumulation steps divide and the
// micro-batch stays within kMaxPlannedMicroBatchTokens. Absent when pinned or when only one value
// is possible.
std::optional<tier::Dimension> micro_batch_dimension(const ModelConfig& cfg, bool honour_pins) {
  if (honour_pins && cfg.micro_batch_pinned) return std::nullopt;
  tier::Dimension d{kMicroBatchOption, "micro-batch", {}, std::nullopt, kPreferConfiguredMicroBatchWithin};
  for (int f = 1; f <= 8; f *= 2) {
    const std::int64_t tokens = static_cast<std::int64_t>(cfg.seq_len) * cfg.micro_batch * f;
    if (cfg.grad_accum % f != 0 || (f > 1 && tokens > kMaxPlannedMicroBatchTokens)) continue;
    d.values.push_back({std::to_string(cfg.micro_batch * f), true});
  }
  if (d.values.size() < 2) return std::nullopt;
  return d;
}

}  // namespace

std::vector<tier::Dimension> plan_dimensions(const ModelConfig& cfg, const tier::PlanOptions& options,
                                             const PlanScope& scope, bool honour_pins) {
  const config::Registry& reg = config::cfg();
  const bool gpu = options.link.kind != LinkKind::none;
  std::vector<tier::Dimension> dims;
  dims.push_back(tier::make_dimension(reg, "GHT_OPT_STATE", "m/v", {{"fp32", true}, {"bf16", false}, {"q8", false}},
                                      honour_pins));
  if (gpu) {
    dims.push_back(
        tier::make_dimension(reg, "GHT_GRAD_ACCUM", "grad accum", {{"fp32", true}, {"bf16", false}}, honour_pins));
  }
  if (gpu && scope.ranks == 1 && scope.allow_delay) {
    dims.push_back(tier::make_dimension(reg, "GHT_OPT_DELAY", "delay", {{"off", true}, {"on", false}}, honour_pins));
  }
  // The undo arena of updates during the last backward, sized by the trainer (empty: auto) or
  // none: exact either way; it costs HBM while state is on the host, and widens the update's window.
  if (gpu && scope.ranks == 1) {
    dims.push_back(tier::make_dimension(reg, "GHT_OPT_SPECULATE", "undo arena", {{"", true}, {"0", true}}, honour_pins));
  }
  if (fp8_menu(reg, options, scope) == Fp8Menu::searched) {
    dims.push_back(tier::make_dimension(reg, "GHT_FP8", "FP8", {{"off", true}, {"experts", false}}, honour_pins));
  }
  if (gpu && scope.ranks == 1) {
    if (auto d = micro_batch_dimension(cfg, honour_pins)) dims.push_back(std::move(*d));
  }
  return dims;
}

tier::SearchResult search_model_plans(const ModelConfig& cfg, const tier::PlanOptions& base, const PlanScope& scope,
                                      const tier::Measurements* measured) {
  return search(cfg, base, scope, measured, true);
}

DecidedPlan decide_plan(const ModelConfig& cfg, const tier::PlanOptions& base, const PlanScope& scope,
                        const tier::Measurements* measured) {
  DecidedPlan d;
  d.search = search(cfg, base, scope, measured, true);
  if (!d.search.chosen) throw tier::plan_refused(refusal(cfg, base, scope, measured, d.search));
  const tier::Candidate& best = d.search.best();
  for (const auto& [option, value] : best.settings) {
    if (option != kMicroBatchOption) config::cfg().set_planned(option, value);
  }
  d.shape = with_planned_shape(cfg, best.settings);
  for (const tier::Price& p : best.inexact) d.taken.push_back("inexact choice taken: " + p.describe());
  if (fp8_menu(config::cfg(), base, scope) == Fp8Menu::left_out && !scope.fp8_why_not.empty()) {
    d.left_out.push_back("FP8 experts not searched, though the accuracy ledger prices them: " + scope.fp8_why_not);
  }
  if (d.shape.micro_batch != cfg.micro_batch) {
    d.reshaped = "micro-batch chosen: " + std::to_string(d.shape.micro_batch) + " x " + std::to_string(d.shape.seq_len) +
                 " tokens, " + std::to_string(d.shape.grad_accum) + " accumulation steps (the configuration's " +
                 std::to_string(cfg.micro_batch) + " x " + std::to_string(cfg.grad_accum) +
                 "; set model.micro_batch to keep one)";
  }
  d.model = plan_settings(d.shape, base, scope.ranks, measured);
  const tier::Plan& p = d.model.plan;
  std::vector<std::string> notes = p.notes();
  notes.insert(notes.end(), d.taken.begin(), d.taken.end());
  notes.insert(notes.end(), d.left_out.begin(), d.left_out.end());
  if (!d.reshaped.empty()) notes.push_back(d.reshaped);
  d.model.plan = tier::Plan(p.options(), p.regions(), p.decisions(), p.prediction(), std::move(notes));
  return d;
}

std::string DecidedPlan::table(const ModelConfig& cfg) const {
  std::string t = tier::format_search(search, static_cast<double>(cfg.tokens_per_step()), plan_peak_flops());
  for (const std::string& line : taken) t += "  " + line + "\n";
  for (const std::string& line : left_out) t += "  " + line + "\n";
  if (!reshaped.empty()) t += "  " + reshaped + "\n";
  return t;
}

}  // namespace ght::trainer
