#include "tier/plan.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_set>
#include <utility>

#include "tier/config.hpp"
#include "tier/cost_model.hpp"
#include "tier/place_rules.hpp"
#include "tier/topology.hpp"

namespace ght::tier {

namespace {

constexpr std::array<std::string_view, 2> kPathNames = {"copy", "kernel"};
constexpr std::array<std::string_view, 6> kModeNames = {"none",       "keep",  "recompute",
                                                        "offload",    "accumulate", "stream"};
constexpr std::array<std::string_view, 3> kPolicyNames = {"static", "greedy", "auto"};
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

template <typename E, std::size_t N>
std::optional<E> parse_in(const std::array<std::string_view, N>& names, std::string_view s) {
  std::string l(s);
  for (char& c : l) c = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  for (std::size_t i = 0; i < N; ++i) {
    if (names[i] == l) return static_cast<E>(i);
  }
  return std::nullopt;
}

std::string num(double v, int precision = 3) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", precision, v);
  return buf;
}

std::string gib(std::uint64_t b) { return config::format_bytes(b); }

std::string gb(double bytes) {
  if (!std::isfinite(bytes)) return "inf";
  return num(bytes / 1e9, 1) + " GB";
}

std::string secs(double s) {
  if (!std::isfinite(s)) return "inf";
  if (s != 0 && s < 0.01) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g ms", s * 1e3);
    return buf;
  }
  return num(s, 3) + " s";
}

bool is_state(TensorClass c) {
  return c == TensorClass::master || c == TensorClass::adam_m || c == TensorClass::adam_v;
}

// Parameters whose fp32 master lives on the host, by where their gradient is: the gradient
// region of the same group, layer and expert (the trainer's regions come in such sets); a master
// without one counts as having its gradient in HBM.
UpdateSplitInput host_state_params(const std::vector<Region>& regions,
                                   const std::vector<Decision>& decisions) {
  UpdateSplitInput in;
  double state_bytes = 0;  // master, m and v bytes of the host-state parameters
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const Region& r = regions[i];
    if (is_state(r.cls) && decisions[i].tier == TierKind::host) {
      state_bytes += static_cast<double>(r.host_bytes.value_or(r.bytes));
    }
  }
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const Region& m = regions[i];
    if (m.cls != TensorClass::master || decisions[i].tier != TierKind::host) continue;
    const std::uint64_t params = m.host_bytes.value_or(m.bytes) / kMasterBytesPerParam;
    bool grad_on_host = false;
    for (std::size_t j = 0; j < regions.size(); ++j) {
      const Region& g = regions[j];
      if (g.cls == TensorClass::grad && g.group_name() == m.group_name() && g.layer == m.layer &&
          g.expert == m.expert) {
        grad_on_host = decisions[j].tier == TierKind::host;
      }
    }
    (grad_on_host ? in.params_grad_host : in.params_grad_hbm) += params;
  }
  // The regions' own bytes: 12 per parameter, 8 with bf16 m and v, 6.03 with q8 (GHT_OPT_STATE).
  const auto n = static_cast<double>(in.params_grad_host + in.params_grad_hbm);
  if (n > 0) in.state_bytes_per_param = state_bytes / n;
  return in;
}

// Placements that switch on a fixed cost, counted over a whole placement (plus the delayed update's
// buffers, held whatever the placement): any streamed gradient
// needs the pinned stream staging (host), any master/m/v on the host the optimizer's dma slots
// (HBM), any recomputed layer the shared recompute scratch (HBM). Without a GPU none applies.
struct FixedCosts {
  std::int64_t streamed = 0, state_on_host = 0, recomputed = 0;
  /// sign +1 counts region r placed at p, -1 takes it back (a move).
  void count(const Region& r, const Placement& p, int sign) {
    if (p.tier == TierKind::host && r.cls == TensorClass::grad) streamed += sign;
    if (p.tier == TierKind::host && is_state(r.cls)) state_on_host += sign;
    if (p.tier == TierKind::hbm && p.mode == Mode::recompute) recomputed += sign;
  }
  [[nodiscard]] std::uint64_t hbm(const PlanOptions& o) const {
    if (o.link.kind == LinkKind::none) return 0;
    return (state_on_host > 0 ? o.host_state_hbm_bytes : 0) + (recomputed > 0 ? o.recompute_scratch_bytes : 0) +
           o.delayed_update_hbm_bytes;
  }
  [[nodiscard]] std::uint64_t host(const PlanOptions& o) const {
    // The gradient stream stages through pinned host slots only (optimizer/accumulate.hpp); the
    // bf16 gradient it copies from is the region's hbm_bytes_on_host.
    return o.link.kind != LinkKind::none && streamed > 0 ? o.stream_staging_bytes : 0;
  }
};

// HBM a region holds at placement p: none without a GPU, where every region lives in host memory
// (the bf16 buffer of a streamed gradient exists only on a GPU machine).
std::uint64_t placed_hbm_bytes(const Region& r, const Placement& p, const PlanOptions& o) {
  return o.link.kind == LinkKind::none ? 0 : hbm_bytes(r, p);
}

bool finite_nonneg(double v) { return std::isfinite(v) && v >= 0; }

void check_access(const Region& r, const std::vector<Access>& list, const char* field) {
  for (std::size_t i = 0; i < list.size(); ++i) {
    const Access& a = list[i];
    const std::string where =
        "region '" + r.name + "': " + field + "[" + std::to_string(i) + "].";
    auto nonneg = [&](double v, const char* name) {
      GHT_EXPECTS(finite_nonneg(v), where + name + " must be finite and >= 0, got " + std::to_string(v));
    };
    nonneg(a.gpu_read_bytes, "gpu_read_bytes");
    nonneg(a.gpu_write_bytes, "gpu_write_bytes");
    nonneg(a.cpu_read_bytes, "cpu_read_bytes");
    nonneg(a.cpu_write_bytes, "cpu_write_bytes");
    nonneg(a.times_per_step, "times_per_step");
    nonneg(a.routing_tokens, "routing_tokens");
    GHT_EXPECTS(std::isfinite(a.window_fraction) && a.window_fraction >= 0 && a.window_fraction <= 1,
                where + "window_fraction must be within [0, 1], got " + std::to_string(a.window_fraction));
  }
}

// Tier holding most bytes of each class; hbm when the class is absent.
std::array<TierKind, kNumTensorClasses> class_tiers(const std::vector<Region>& regions,
                                                   const std::vector<Decision>& decisions) {
  std::array<std::array<std::uint64_t, kNumTiers>, kNumTensorClasses> bytes{};
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const TierKind t = decisions[i].tier;
    bytes[static_cast<int>(regions[i].cls)][static_cast<int>(t)] += regions[i].bytes_on(t);
  }
  std::array<TierKind, kNumTensorClasses> out{};
  for (int c = 0; c < kNumTensorClasses; ++c) {
    out[c] = bytes[c][1] > bytes[c][0] ? TierKind::host : TierKind::hbm;
  }
  return out;
}

}  // namespace

// ---- enums ---------------------------------------------------------------------------------

std::string_view to_string(GpuPath p) noexcept { return kPathNames[static_cast<int>(p)]; }
std::string_view to_string(Mode m) noexcept { return kModeNames[static_cast<int>(m)]; }
std::string_view to_string(Policy p) noexcept { return kPolicyNames[static_cast<int>(p)]; }
std::optional<GpuPath> parse_gpu_path(std::string_view s) noexcept {
  try { return parse_in<GpuPath>(kPathNames, s); } catch (...) { return std::nullopt; }
}
std::optional<Mode> parse_mode(std::string_view s) noexcept {
  try { return parse_in<Mode>(kModeNames, s); } catch (...) { return std::nullopt; }
}
std::optional<Policy> parse_policy(std::string_view s) noexcept {
  try { return parse_in<Policy>(kPolicyNames, s); } catch (...) { return std::nullopt; }
}

std::string_view Region::group_name() const {
  return group.empty() ? to_string(cls) : std::string_view(group);
}

void validate_regions(const std::vector<Region>& regions) {
  std::unordered_set<std::string_view> names;
  for (const Region& r : regions) {
    GHT_EXPECTS(!r.name.empty(), "region with an empty name (class " + std::string(to_string(r.cls)) + ")");
    GHT_EXPECTS(names.insert(r.name).second, "region name '" + r.name + "' appears twice");
    GHT_EXPECTS(r.hbm_allowed || r.host_allowed,
                "region '" + r.name + "': neither HBM nor host is allowed");
    if (r.recompute_bytes) {
      GHT_EXPECTS(*r.recompute_bytes <= r.bytes,
                  "region '" + r.name + "': recompute_bytes (" + std::to_string(*r.recompute_bytes) +
                      ") exceeds bytes (" + std::to_string(r.bytes) + ")");
    }
    GHT_EXPECTS(finite_nonneg(r.recompute_flops),
                "region '" + r.name + "': recompute_flops must be finite and >= 0");
    GHT_EXPECTS(std::isfinite(r.routing_frequency) && r.routing_frequency >= 0 && r.routing_frequency <= 1,
                "region '" + r.name + "': routing_frequency must be within [0, 1], got " +
                    std::to_string(r.routing_frequency));
    check_access(r, r.access, "access");
    if (r.host_access) check_access(r, *r.host_access, "host_access");
  }
}

// ---- options (budgets come from budget.cpp) -------------------------------------------------

PlanOptions plan_options_from_config(const config::Registry& reg, const LinkNumbers& link,
                                     const Capacities& caps, double step_flops) {
  using config::Key;
  PlanOptions o;
  const auto policy = parse_policy(reg.get_string(Key::GHT_POLICY));
  GHT_EXPECTS(policy.has_value(), "GHT_POLICY: unknown policy '" + reg.get_string(Key::GHT_POLICY) + "'");
  o.policy = *policy;
  o.place = reg.get_string(Key::GHT_PLACE);
  o.budgets = resolve_budgets(caps, reg);
  o.link = link;
  o.step_flops = step_flops;
  o.assumed_tflops = reg.get_float(Key::GHT_ASSUMED_TFLOPS);
  o.stream_staging_bytes =
      2 * reg.get_size(Key::GHT_STAGING_BYTES).resolve(caps.hbm_total, "GHT_STAGING_BYTES");
  return o;
}

// ---- measurements ---------------------------------------------------------------------------

std::vector<Region> apply_measurements(std::vector<Region> regions, const Measurements& m) {
  if (!m.expert_tokens.empty()) {
    GHT_EXPECTS(m.step_tokens > 0 && std::isfinite(m.step_tokens),
                "measurements: step_tokens must be > 0 when expert token counts are given");
    for (const ExpertTokens& e : m.expert_tokens) {
      GHT_EXPECTS(finite_nonneg(e.tokens), "measurements: token count of layer " +
                                               std::to_string(e.layer) + " expert " +
                                               std::to_string(e.expert) + " must be >= 0");
      const double f = std::min(1.0, e.tokens / m.step_tokens);
      bool any = false;
      for (Region& r : regions) {
        if (r.expert == e.expert && r.layer == e.layer) {
          r.routing_frequency = f;
          any = true;
        }
      }
      GHT_EXPECTS(any, "measurements: layer " + std::to_string(e.layer) + " expert " +
                           std::to_string(e.expert) + " names no region");
    }
  }
  for (const RegionLinkBytes& lb : m.link_bytes) {
    auto it = std::find_if(regions.begin(), regions.end(),
                           [&](const Region& r) { return r.name == lb.region; });
    GHT_EXPECTS(it != regions.end(), "measurements: link bytes name unknown region '" + lb.region + "'");
    GHT_EXPECTS(finite_nonneg(lb.h2d_bytes) && finite_nonneg(lb.d2h_bytes),
                "measurements: link bytes of '" + lb.region + "' must be finite and >= 0");
    Region& r = *it;
    std::vector<Access>& list = r.host_access ? *r.host_access : r.access;
    double up = 0, down = 0;
    for (const Access& a : list) {
      const double k = a.times_per_step * routing_factor(r, a);
      up += k * a.gpu_read_bytes;
      down += k * a.gpu_write_bytes;
    }
    Access extra;
    extra.what = "measured";
    for (Access& a : list) {
      if (up > 0) a.gpu_read_bytes *= lb.h2d_bytes / up;
      if (down > 0) a.gpu_write_bytes *= lb.d2h_bytes / down;
    }
    // Traffic the profile did not predict at all becomes one measured, overlappable access.
    if (up <= 0) extra.gpu_read_bytes = lb.h2d_bytes;
    if (down <= 0) extra.gpu_write_bytes = lb.d2h_bytes;
    if (extra.gpu_read_bytes > 0 || extra.gpu_write_bytes > 0) list.push_back(extra);
  }
  return regions;
}

// ---- Plan -------------------------------------------------------------------------------------

Plan::Plan(PlanOptions options, std::vector<Region> regions, std::vector<Decision> decisions,
           Prediction prediction, std::vector<std::string> notes)
    : options_(std::move(options)),
      regions_(std::move(regions)),
      decisions_(std::move(decisions)),
      prediction_(prediction),
      notes_(std::move(notes)) {
  GHT_EXPECTS(regions_.size() == decisions_.size(),
              "plan: " + std::to_string(regions_.size()) + " regions but " +
                  std::to_string(decisions_.size()) + " decisions");
  index_.reserve(regions_.size());
  for (std::size_t i = 0; i < regions_.size(); ++i) index_.emplace(regions_[i].name, i);
  class_tier_ = class_tiers(regions_, decisions_);
}

const Decision* Plan::find(std::string_view region) const {
  const auto it = index_.find(std::string(region));
  return it == index_.end() ? nullptr : &decisions_[it->second];
}

TierKind Plan::tier_for(std::string_view region, TensorClass cls) const {
  if (const Decision* d = find(region)) return d->tier;
  return class_tier_[static_cast<int>(cls)];
}

std::string Plan::mode_summary(TensorClass cls) const {
  std::optional<Mode> seen;
  for (std::size_t i = 0; i < regions_.size(); ++i) {
    if (regions_[i].cls != cls) continue;
    if (!seen) {
      seen = decisions_[i].mode;
    } else if (*seen != decisions_[i].mode) {
      return "mixed";
    }
  }
  return seen ? std::string(to_string(*seen)) : std::string("-");
}

bool Plan::operator==(const Plan& o) const {
  const LinkNumbers &a = options_.link, &b = o.options_.link;
  const bool link_eq = a.name == b.name && a.source == b.source && a.kind == b.kind &&
                       a.h2d_bps == b.h2d_bps && a.d2h_bps == b.d2h_bps &&
                       a.bidir_bps == b.bidir_bps && a.kernel_read_bps == b.kernel_read_bps &&
                       a.kernel_write_bps == b.kernel_write_bps &&
                       a.host_triad_bps == b.host_triad_bps && a.hbm_bps == b.hbm_bps;
  const PlanOptions &p = options_, &q = o.options_;
  return link_eq && p.policy == q.policy && p.place == q.place && p.budgets == q.budgets &&
         p.step_flops == q.step_flops && p.assumed_tflops == q.assumed_tflops &&
         p.stream_staging_bytes == q.stream_staging_bytes &&
         p.host_state_hbm_bytes == q.host_state_hbm_bytes &&
         p.recompute_scratch_bytes == q.recompute_scratch_bytes &&
         p.delayed_update_hbm_bytes == q.delayed_update_hbm_bytes && regions_ == o.regions_ &&
         decisions_ == o.decisions_ && prediction_ == o.prediction_ && notes_ == o.notes_;
}

// ---- prediction ---------------------------------------------------------------------------------

namespace {

Prediction predict_with(const CostModel& cm, const std::vector<Region>& regions,
                        const std::vector<Placement>& choice, const PlanOptions& options) {
  Load total = cm.zero(), opt = cm.zero();
  Prediction p;
  FixedCosts fixed;
  const bool no_gpu = options.link.kind == LinkKind::none;
  for (std::size_t i = 0; i < regions.size(); ++i) {
    if (!no_gpu) {  // without a GPU nothing crosses a link: the CPU works in place
      total.add(cm.load(regions[i], choice[i]));
      opt.add(cm.load(regions[i], choice[i], "optimizer"));
    }
    p.hbm_bytes += placed_hbm_bytes(regions[i], choice[i], options);
    p.host_bytes += host_bytes(regions[i], choice[i]);
    fixed.count(regions[i], choice[i], +1);
  }
  p.hbm_bytes += fixed.hbm(options);
  p.host_bytes += fixed.host(options);
  const StepTime t = cm.evaluate(total);
  p.h2d_bytes = t.h2d_bytes;
  p.d2h_bytes = t.d2h_bytes;
  p.h2d_seconds = t.h2d_seconds;
  p.d2h_seconds = t.d2h_seconds;
  p.link_seconds = t.link_seconds;
  p.host_traffic_bytes = t.host_bytes;
  p.host_seconds = t.host_seconds;
  p.compute_seconds = t.compute_seconds;
  p.recompute_seconds = t.recompute_seconds;
  p.window_seconds = t.window_seconds;
  p.exposed_seconds = t.exposed_seconds;
  p.step_seconds = t.step_seconds;
  const StepTime to = cm.evaluate(opt);
  p.optimizer_link_seconds = to.link_seconds;
  return p;
}

}  // namespace

std::vector<bool> assign_update_split(const std::vector<std::uint64_t>& params, double cpu_fraction) {
  GHT_EXPECTS(cpu_fraction >= 0 && cpu_fraction <= 1,
              "assign_update_split: the CPU share must be in [0, 1], got " + std::to_string(cpu_fraction));
  std::vector<bool> on_cpu(params.size(), false);
  double total = 0, cpu = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto n = static_cast<double>(params[i]);
    total += n;
    const double target = cpu_fraction * total;
    if (std::abs(cpu + n - target) < std::abs(cpu - target)) {
      on_cpu[i] = true;
      cpu += n;
    }
  }
  return on_cpu;
}

Prediction predict(const std::vector<Region>& regions, const std::vector<Decision>& decisions,
                   const PlanOptions& options) {
  GHT_EXPECTS(regions.size() == decisions.size(), "predict: regions and decisions differ in count");
  const CostModel cm(options.link, options.step_flops, options.assumed_tflops, regions);
  std::vector<Placement> choice(regions.size());
  for (std::size_t i = 0; i < regions.size(); ++i) choice[i] = {decisions[i].tier, decisions[i].mode};
  return predict_with(cm, regions, choice, options);
}

// ---- the engine -----------------------------------------------------------------------------------

namespace {

/// One region's candidate placements and what each costs.
struct Candidates {
  std::vector<Placement> opts;
  std::vector<Load> loads;
  std::vector<std::uint64_t> hbm, host;
  std::vector<std::array<double, 3>> score;  // per order variant
  int start = 0;
};

struct Move {
  std::size_t region;
  int from, to;
  double gain;            // score saved per HBM byte
  bool deferred = false;  // a large move put at the end of its order
};

// Candidate orders: three scores, each also with large moves deferred (see make_plan).
constexpr int kScores = 3;
constexpr int kOrders = 2 * kScores;
constexpr std::array<std::string_view, kScores> kOrderNames = {
    "all seconds per byte", "critical-path seconds first", "seconds that cannot hide first"};
// Why a region that the chosen order did not reach stayed where it is.
constexpr std::array<std::string_view, kScores> kLeftOutWhy = {
    "the HBM budget went to regions that save more time per byte",
    "the HBM budget went first to regions that save critical-path time (recompute, serial transfers)",
    "the HBM budget went first to regions whose traffic cannot hide behind compute"};

// Scores are clamped so that differences never meet inf - inf.
double clamp_score(double s) { return std::min(s, 1e30); }

/// Moves along the lower convex hull of (HBM bytes, score) from the start placement into
/// `out`; then, when HBM would be slower for the rest of the way, one move to the region's
/// largest HBM placement into `forced` (negative gain: only taken when the host is too small).
void hull_moves(const Candidates& c, std::size_t region, int v, std::vector<Move>& out,
                std::vector<Move>& forced) {
  int cur = c.start;
  while (true) {
    int best = -1;
    double best_slope = 0;
    for (int j = 0; j < static_cast<int>(c.opts.size()); ++j) {
      if (c.hbm[j] <= c.hbm[cur]) continue;
      const double slope = (c.score[j][v] - c.score[cur][v]) /
                           static_cast<double>(c.hbm[j] - c.hbm[cur]);
      if (slope > 0) continue;  // HBM would make it slower: never a move
      if (best < 0 || slope < best_slope || (slope == best_slope && c.hbm[j] < c.hbm[best])) {
        best = j;
        best_slope = slope;
      }
    }
    if (best < 0) break;
    out.push_back({region, cur, best, -best_slope});
    cur = best;
  }
  int top = cur;
  for (int j = 0; j < static_cast<int>(c.opts.size()); ++j) {
    if (c.hbm[j] > c.hbm[top]) top = j;
  }
  if (top != cur) {
    const double slope = (c.score[top][v] - c.score[cur][v]) / static_cast<double>(c.hbm[top] - c.hbm[cur]);
    forced.push_back({region, cur, top, -slope});
  }
}

struct Totals {
  Load load;
  std::uint64_t hbm = 0, host = 0;
  FixedCosts fixed;
};

struct Best {
  bool found = false;
  double step = 0;
  std::uint64_t hbm = 0;
  int variant = -1;
  std::size_t prefix = 0;
};

std::string infeasible_message(TierKind t, std::uint64_t needed, const Budgets& b,
                               const std::string& extra) {
  const bool hbm = t == TierKind::hbm;
  const std::uint64_t budget = hbm ? b.hbm : b.host;
  return std::string("plan infeasible: the regions need at least ") + gib(needed) + " of " +
         (hbm ? "HBM" : "host memory") + " but the " + (hbm ? "HBM" : "host") + " budget is " +
         gib(budget) + " [" + (hbm ? b.hbm_origin : b.host_origin) + "]; " + gib(needed - budget) +
         " (" + std::to_string(needed - budget) + " bytes) missing: raise " +
         (hbm ? "GHT_HBM_BUDGET (ght plan --hbm)" : "GHT_HOST_BUDGET (ght plan --host)") +
         " to at least " + gib(needed) + extra;
}

}  // namespace

Plan make_plan(std::vector<Region> regions, const PlanOptions& options, const Measurements* measured) {
  validate_regions(regions);
  std::vector<std::string> notes;
  if (options.policy == Policy::auto_replan) {
    if (measured != nullptr) {
      regions = apply_measurements(std::move(regions), *measured);
      notes.push_back("auto: re-planned on measured counts (" +
                      std::to_string(measured->expert_tokens.size()) + " expert token counts, " +
                      std::to_string(measured->link_bytes.size()) + " regions' link bytes)");
    } else {
      notes.push_back("auto: no measurements yet; planned as greedy until a warm-up step supplies them");
    }
  }
  const std::vector<PlaceRule> rules = parse_place_rules(options.place);
  const std::vector<int> match =
      rules.empty() ? std::vector<int>(regions.size(), -1) : match_place_rules(rules, regions);
  const CostModel cm(options.link, options.step_flops, options.assumed_tflops, regions);
  const bool no_gpu = options.link.kind == LinkKind::none;
  const bool is_static = options.policy == Policy::static_rules;

  // ---- candidates per region
  std::vector<Candidates> cands(regions.size());
  std::vector<std::string> fixed_reason(regions.size());
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const Region& r = regions[i];
    Candidates& c = cands[i];
    const PlaceRule* rule = match[i] >= 0 ? &rules[match[i]] : nullptr;
    if (no_gpu) {
      if (rule != nullptr && rule->target != RuleTarget::host && rule->target != RuleTarget::stream) {
        throw config_error(rule->describe() + ": region '" + r.name +
                           "' cannot go to HBM: there is no GPU (link none)");
      }
      // The CPU computes on host memory the way the GPU would on HBM: same modes, no link.
      c.opts = {{TierKind::host, default_mode(r, TierKind::hbm)}};
      fixed_reason[i] = "no GPU (link none): every region lives in host memory";
    } else if (rule != nullptr) {
      c.opts = placements_allowed_by(*rule, r);
      if (is_static) c.opts = {c.opts.back()};  // static: the rule's tier, HBM-heaviest mode
    } else if (is_static) {
      const std::vector<Placement> all = placements(r);
      c.opts = {all.back()};  // HBM by default, host only when HBM is not allowed
      fixed_reason[i] = r.hbm_allowed ? "static: no GHT_PLACE rule matches it; HBM by default"
                                      : "static: no GHT_PLACE rule matches it; host (HBM not allowed)";
    } else {
      c.opts = placements(r);
    }
    for (const Placement& p : c.opts) {
      Load l = cm.load(r, p);
      const double total = cm.total_seconds(l);
      c.loads.push_back(std::move(l));
      c.hbm.push_back(placed_hbm_bytes(r, p, options));
      c.host.push_back(host_bytes(r, p));
      c.score.push_back({clamp_score(total), clamp_score(cm.serial_seconds(c.loads.back())) + 1e-3 * clamp_score(total),
                         clamp_score(cm.unhidable_seconds(c.loads.back())) + 1e-3 * clamp_score(total)});
    }
    // A placement whose traffic needs a bandwidth the link lacks is unusable when another exists.
    if (c.opts.size() > 1) {
      std::vector<std::size_t> keep;
      for (std::size_t j = 0; j < c.opts.size(); ++j) {
        if (std::isfinite(cm.total_seconds(c.loads[j]))) keep.push_back(j);
      }
      // All infinite: moving between them would subtract inf from inf; keep the first.
      if (keep.empty()) keep.push_back(0);
      if (keep.size() < c.opts.size()) {
        Candidates k;
        for (std::size_t j : keep) {
          k.opts.push_back(c.opts[j]);
          k.loads.push_back(c.loads[j]);
          k.hbm.push_back(c.hbm[j]);
          k.host.push_back(c.host[j]);
          k.score.push_back(c.score[j]);
        }
        c = std::move(k);
        if (c.opts.size() == 1 && rule == nullptr) {
          fixed_reason[i] = "only " + std::string(to_string(c.opts[0].tier)) +
                            " is usable: the link profile has no bandwidth for its other placements";
        }
      }
    }
    for (int j = 1; j < static_cast<int>(c.opts.size()); ++j) {
      if (c.hbm[j] < c.hbm[c.start] ||
          (c.hbm[j] == c.hbm[c.start] && c.score[j][0] < c.score[c.start][0])) {
        c.start = j;
      }
    }
  }

  // ---- start totals (every region at its smallest HBM footprint)
  Totals base;
  base.load = cm.zero();
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const Candidates& c = cands[i];
    base.load.add(c.loads[c.start]);
    base.hbm += c.hbm[c.start];
    base.host += c.host[c.start];
    base.fixed.count(regions[i], c.opts[c.start], +1);
  }
  const Budgets& B = options.budgets;
  auto eff_hbm = [&](const Totals& t) { return t.hbm + t.fixed.hbm(options); };
  auto eff_host = [&](const Totals& t) { return t.host + t.fixed.host(options); };

  // ---- candidate orders and their prefixes
  // A prefix stops at the first move that does not fit, so one large region can strand HBM.
  // Each score therefore also gets an order with its large moves (over 1/256 of all the bytes
  // the moves would bring into HBM) deferred to the end. Every order is fixed before the budgets
  // are looked at, so a larger budget only adds candidates: it can never predict a slower step.
  std::array<std::vector<Move>, kOrders> orders;
  for (int v = 0; v < kScores; ++v) {
    std::vector<Move> forced;
    for (std::size_t i = 0; i < regions.size(); ++i) hull_moves(cands[i], i, v, orders[v], forced);
    const auto by_gain = [](const Move& a, const Move& b) { return a.gain > b.gain; };
    std::stable_sort(orders[v].begin(), orders[v].end(), by_gain);
    std::stable_sort(forced.begin(), forced.end(), by_gain);
    std::uint64_t moved_bytes = 0;
    for (const Move& m : orders[v]) moved_bytes += cands[m.region].hbm[m.to] - cands[m.region].hbm[m.from];
    const std::uint64_t large = moved_bytes / 256;
    std::vector<Move>& deferred = orders[kScores + v];
    std::vector<Move> big;
    for (const Move& m : orders[v]) {
      const bool is_big = cands[m.region].hbm[m.to] - cands[m.region].hbm[m.from] > large;
      (is_big ? big : deferred).push_back(m);
    }
    // Keep a region's moves in sequence: once one is deferred, its later moves are too.
    std::vector<bool> region_deferred(regions.size(), false);
    for (const Move& m : big) region_deferred[m.region] = true;
    std::vector<Move> small;
    for (const Move& m : deferred) {
      (region_deferred[m.region] ? big : small).push_back(m);
    }
    std::stable_sort(big.begin(), big.end(), by_gain);
    for (Move& m : big) m.deferred = true;
    deferred = std::move(small);
    deferred.insert(deferred.end(), big.begin(), big.end());
    deferred.insert(deferred.end(), forced.begin(), forced.end());
    orders[v].insert(orders[v].end(), forced.begin(), forced.end());
  }
  Best best;
  std::uint64_t min_hbm = std::numeric_limits<std::uint64_t>::max();
  std::uint64_t min_host_hbm_ok = std::numeric_limits<std::uint64_t>::max();
  for (int v = 0; v < kOrders; ++v) {
    Totals t = base;
    const std::vector<Move>& mv = orders[v];
    for (std::size_t k = 0;; ++k) {
      const std::uint64_t h = eff_hbm(t), o = eff_host(t);
      min_hbm = std::min(min_hbm, h);
      if (h <= B.hbm) {
        min_host_hbm_ok = std::min(min_host_hbm_ok, o);
        if (o <= B.host) {
          const double step = cm.evaluate(t.load).step_seconds;
          // Ties go to the plan with more of the regions' bytes in HBM (not counting the
          // reservations, which a plan with a region left on the host would win on).
          if (!best.found || step < best.step || (step == best.step && t.hbm > best.hbm)) {
            best = {true, step, t.hbm, v, k};
          }
        }
      }
      if (k == mv.size()) break;
      const Move& m = mv[k];
      const Candidates& c = cands[m.region];
      t.load.add(c.loads[m.to]);
      t.load.add(c.loads[m.from], -1.0);
      t.hbm += c.hbm[m.to] - c.hbm[m.from];
      t.host = t.host + c.host[m.to] - c.host[m.from];
      t.fixed.count(regions[m.region], c.opts[m.from], -1);
      t.fixed.count(regions[m.region], c.opts[m.to], +1);
    }
  }
  if (!best.found) {
    if (min_hbm > B.hbm) {
      throw infeasible_plan(infeasible_message(TierKind::hbm, min_hbm, B, ""), TierKind::hbm,
                            min_hbm, B.hbm);
    }
    throw infeasible_plan(
        infeasible_message(TierKind::host, min_host_hbm_ok, B,
                           " (a larger HBM budget can also relieve the host)"),
        TierKind::host, min_host_hbm_ok, B.host);
  }

  // ---- replay the chosen prefix
  std::vector<int> chosen(regions.size());
  for (std::size_t i = 0; i < regions.size(); ++i) chosen[i] = cands[i].start;
  const std::vector<Move>& order = orders[best.variant];
  std::vector<double> last_gain(regions.size(), 0.0);
  for (std::size_t k = 0; k < best.prefix; ++k) {
    chosen[order[k].region] = order[k].to;
    last_gain[order[k].region] = order[k].gain;
  }
  std::vector<std::size_t> first_move_pos(regions.size(), order.size());
  for (std::size_t k = order.size(); k-- > 0;) first_move_pos[order[k].region] = k;

  // ---- decisions and reasons
  std::vector<Decision> decisions(regions.size());
  std::vector<Placement> choice(regions.size());
  std::size_t moved = 0;
  for (std::size_t i = 0; i < regions.size(); ++i) {
    const Candidates& c = cands[i];
    const int j = chosen[i];
    Decision& d = decisions[i];
    choice[i] = c.opts[j];
    d.tier = c.opts[j].tier;
    d.mode = c.opts[j].mode;
    // Time its most-HBM usable placement saves against its start, per GiB.
    int top = c.start;
    for (int q = 0; q < static_cast<int>(c.opts.size()); ++q) {
      if (c.hbm[q] > c.hbm[top]) top = q;
    }
    if (top != c.start) {
      const double saved = c.score[c.start][0] - c.score[top][0];
      d.gain_ms_per_gib = saved > 0 && saved < 1e29
                              ? 1e3 * saved / (static_cast<double>(c.hbm[top] - c.hbm[c.start]) / kGiB)
                              : 0.0;
    }
    if (match[i] >= 0) {
      d.rule = rules[match[i]].number;
      d.reason = rules[match[i]].describe();
      if (c.opts.size() > 1) d.reason += "; greedy chose " + std::string(to_string(d.mode));
      if (j != c.start) ++moved;
    } else if (!fixed_reason[i].empty()) {
      d.reason = fixed_reason[i];
    } else if (c.opts.size() == 1) {
      d.reason = regions[i].host_allowed
                     ? "host only: HBM is not allowed for it"
                     : "HBM only: the GPU computes on it in place (host not allowed)";
    } else if (j != c.start) {
      ++moved;
      if (last_gain[i] < 0) {
        d.reason = "greedy: HBM although it is slower there: the host budget cannot hold it";
      } else if (last_gain[i] == 0) {
        d.reason = "greedy: HBM; it saves no time, but HBM had room";
      } else if (d.mode == Mode::keep) {
        d.reason = "greedy: kept; the recompute time it saves is worth its HBM bytes";
      } else {
        d.reason = "greedy: HBM; the link and host time it saves is worth its HBM bytes";
      }
    } else if (first_move_pos[i] < order.size() && order[first_move_pos[i]].gain > 0) {
      d.reason = "greedy: " +
                 std::string(d.mode == Mode::none ? to_string(d.tier) : to_string(d.mode)) + "; " +
                 (order[first_move_pos[i]].deferred
                      ? std::string("a large region: the chosen order fills HBM with smaller ones first")
                      : std::string(kLeftOutWhy[best.variant % kScores]));
    } else {
      d.reason = "greedy: " +
                 std::string(d.mode == Mode::none ? to_string(d.tier) : to_string(d.mode)) +
                 "; HBM would not make the step faster";
    }
  }
  if (!no_gpu && !is_static) {
    notes.push_back("greedy: order '" + std::string(kOrderNames[best.variant % kScores]) +
                    (best.variant >= kScores ? " (large regions last)" : "") + "', " +
                    std::to_string(best.prefix) + " of " + std::to_string(order.size()) +
                    " moves into HBM taken (" + std::to_string(moved) + " regions moved)");
    if (best.prefix < order.size()) {
      const Move& next = order[best.prefix];
      const Candidates& c = cands[next.region];
      notes.push_back("greedy: next move would be '" + regions[next.region].name + "' to " +
                      std::string(to_string(c.opts[next.to].tier)) + "/" +
                      std::string(to_string(c.opts[next.to].mode)) + " (+" +
                      gib(c.hbm[next.to] - c.hbm[next.from]) + " HBM)");
    }
  }
  Prediction p = predict_with(cm, regions, choice, options);
  if (!no_gpu && !is_static && best.prefix < order.size() && p.hbm_bytes < B.hbm) {
    notes.push_back("greedy: " + gib(B.hbm - p.hbm_bytes) +
                    " of the HBM budget left unused: the next move does not fit");
  }
  // The replayed plan must satisfy what the search checked (guards the running sums).
  GHT_EXPECTS(p.hbm_bytes <= B.hbm && p.host_bytes <= B.host,
              "plan: internal error: chosen placement exceeds a budget");
  return Plan(options, std::move(regions), std::move(decisions), p, std::move(notes));
}

// ---- the table ----------------------------------------------------------------------------------

std::string Plan::format_table(bool explain) const {
  std::ostringstream os;
  const PlanOptions& o = options_;
  const Prediction& p = prediction_;
  os << "plan: " << regions_.size() << " regions, policy " << to_string(o.policy) << ", link "
     << o.link.name << " (" << to_string(o.link.kind) << ", " << o.link.source << ")\n";
  if (!o.place.empty()) {
    if (o.place_origin.empty()) {
      os << "rules: GHT_PLACE=" << o.place << "\n";
    } else {
      os << "rules: " << o.place << " (from " << o.place_origin << ")\n";
    }
  }
  os << "budgets: HBM " << gib(o.budgets.hbm) << "  [" << o.budgets.hbm_origin << "]\n"
     << "         host " << gib(o.budgets.host) << "  [" << o.budgets.host_origin << "]\n\n";

  struct Row {
    std::size_t group_rank = 0;
    int cls_rank = 0, tier_rank = 0, mode_rank = 0;
    std::string group, cls, tier, mode;
    std::size_t count = 0;
    std::uint64_t bytes = 0;
    std::map<std::string, std::size_t> reasons;
    double gain_lo = std::numeric_limits<double>::infinity(), gain_hi = 0;
  };
  std::vector<Row> rows;
  std::map<std::string, std::size_t> row_of;
  std::map<std::string, std::size_t> group_rank;  // groups in order of first appearance
  for (std::size_t i = 0; i < regions_.size(); ++i) {
    const Region& r = regions_[i];
    const Decision& d = decisions_[i];
    const std::string key = std::string(r.group_name()) + "|" + std::string(to_string(r.cls)) + "|" +
                            std::string(to_string(d.tier)) + "|" + std::string(to_string(d.mode));
    auto [it, fresh] = row_of.try_emplace(key, rows.size());
    if (fresh) {
      Row row;
      row.group_rank = group_rank.try_emplace(std::string(r.group_name()), group_rank.size()).first->second;
      row.cls_rank = static_cast<int>(r.cls);
      row.tier_rank = static_cast<int>(d.tier);
      row.mode_rank = static_cast<int>(d.mode);
      row.group = std::string(r.group_name());
      row.cls = std::string(to_string(r.cls));
      row.tier = std::string(to_string(d.tier));
      row.mode = d.mode == Mode::none ? std::string("-") : std::string(to_string(d.mode));
      rows.push_back(std::move(row));
    }
    Row& row = rows[it->second];
    ++row.count;
    row.bytes += d.mode == Mode::recompute ? r.recompute_bytes.value_or(r.bytes) : r.bytes_on(d.tier);
    ++row.reasons[d.reason];
    if (d.gain_ms_per_gib > 0) {
      row.gain_lo = std::min(row.gain_lo, d.gain_ms_per_gib);
      row.gain_hi = std::max(row.gain_hi, d.gain_ms_per_gib);
    }
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
    return std::tie(a.group_rank, a.cls_rank, a.tier_rank, a.mode_rank) <
           std::tie(b.group_rank, b.cls_rank, b.tier_rank, b.mode_rank);
  });
  char line[256];
  std::snprintf(line, sizeof line, "%-14s %-10s %-5s %-10s %8s %14s\n", "group", "class", "tier",
                "mode", "regions", "bytes");
  os << line;
  for (const Row& row : rows) {
    std::snprintf(line, sizeof line, "%-14s %-10s %-5s %-10s %8zu %14s\n", row.group.c_str(),
                  row.cls.c_str(), row.tier.c_str(), row.mode.c_str(), row.count,
                  gib(row.bytes).c_str());
    os << line;
    if (explain) {
      for (const auto& [reason, n] : row.reasons) {
        os << "    why: " << reason;
        if (row.reasons.size() > 1) os << " (" << n << " regions)";
        os << "\n";
      }
      if (row.gain_hi > 0) {
        os << "         in HBM it saves " << num(row.gain_lo, 3)
           << (row.gain_hi > row.gain_lo ? "-" + num(row.gain_hi, 3) : std::string())
           << " ms of link, host-memory or recompute work per step per GiB\n";
      }
    }
  }
  auto pct = [](std::uint64_t a, std::uint64_t b) {
    return b == 0 ? std::string("-") : num(100.0 * static_cast<double>(a) / static_cast<double>(b), 1) + "%";
  };
  os << "\ntotals: HBM " << gib(p.hbm_bytes) << " of " << gib(o.budgets.hbm) << " ("
     << pct(p.hbm_bytes, o.budgets.hbm) << ")   host " << gib(p.host_bytes) << " of "
     << gib(o.budgets.host) << " (" << pct(p.host_bytes, o.budgets.host) << ")\n";
  os << "modes:  grad " << mode_summary(TensorClass::grad) << "   activation "
     << mode_summary(TensorClass::activation) << "\n";
  if (o.stream_staging_bytes > 0 && o.link.kind != LinkKind::none &&
      mode_summary(TensorClass::grad) != "accumulate" && mode_summary(TensorClass::grad) != "-") {
    os << "        (gradient stream staging " << gib(o.stream_staging_bytes)
       << " counted in host memory)\n";
  }
  char flops[32];
  std::snprintf(flops, sizeof flops, "%.3g", o.step_flops);
  os << "\nper step: compute " << secs(p.compute_seconds) << " (" << flops << " FLOP at "
     << num(o.assumed_tflops, 0) << " TFLOP/s, GHT_ASSUMED_TFLOPS)\n"
     << "  link H2D      " << gb(p.h2d_bytes) << "  " << secs(p.h2d_seconds) << "\n"
     << "  link D2H      " << gb(p.d2h_bytes) << "  " << secs(p.d2h_seconds) << "\n"
     << "  link both     " << secs(p.link_seconds) << " sharing the link (optimizer alone "
     << secs(p.optimizer_link_seconds) << ")\n"
     << "  host memory   " << gb(p.host_traffic_bytes) << "  " << secs(p.host_seconds) << "\n";
  const UpdateSplitInput state = host_state_params(regions_, decisions_);
  if (o.link.kind != LinkKind::none && state.params_grad_hbm + state.params_grad_host > 0) {
    // A prediction only: the optimizer runs one path per region (cost_model.hpp).
    const UpdateSplit u = predict_update_split(state, o.link);
    const double n = static_cast<double>(state.params_grad_hbm + state.params_grad_host);
    os << "  update split  " << num(n / 1e9, 2) << "B host-state params: all over the link "
       << secs(u.all_link_seconds) << ", all on the host cores " << secs(u.all_cpu_seconds)
       << ", best " << num(100 * u.cpu_fraction, 1) << "% on the host cores " << secs(u.seconds)
       << " (limit " << u.limit << ")\n"
       << "                (prediction; CPU AdamW at host triad / "
       << num(adamw_bytes_per_param(kHostGradBytes, state.state_bytes_per_param), 0)
       << " B, host memory shared with the link, not in the step above; GHT_OPTIMIZER=split runs\n"
       << "                both paths at once at this share, GHT_OPT_CPU_SHARE forces another)\n";
  }
  os << "  recompute     " << secs(p.recompute_seconds) << "\n"
     << "  window        " << secs(p.window_seconds) << " of compute to hide transfers behind\n"
     << "  exposed       " << secs(p.exposed_seconds) << "   predicted step " << secs(p.step_seconds)
     << "\n";
  if (explain && !notes_.empty()) {
    os << "\nnotes:\n";
    for (const auto& n : notes_) os << "  " << n << "\n";
  }
  return os.str();
}

}  // namespace ght::tier
