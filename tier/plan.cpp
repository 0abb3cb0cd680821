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
#include "tier/plan_detail.hpp"
#include "tier/topology.hpp"

namespace ght::tier {

using detail::fixed;
using detail::gib;
using detail::is_state;

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

// Placements that switch on a fixed cost, counted over a whole placement (plus the delayed update's
// buffers and FP8's copies, held whatever the placement): any streamed gradient
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
    return (state_on_host > 0 ? o.host_state_hbm_bytes + o.speculation_hbm_bytes : 0) +
           (recomputed > 0 ? o.recompute_scratch_bytes : 0) +
           o.delayed_update_hbm_bytes + o.fp8_hbm_bytes;
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
                                     const Capacities& caps, double step_flops, double head_flops) {
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
  o.backward_ratio = reg.get_float(Key::GHT_ASSUMED_BWD_RATIO);
  o.head_flops = head_flops;
  o.head_tflops = reg.get_float(Key::GHT_ASSUMED_HEAD_TFLOPS);
  o.stream_staging_bytes =
      2 * reg.get_size(Key::GHT_STAGING_BYTES).resolve(caps.hbm_total, "GHT_STAGING_BYTES");
  return o;
}

// ---- measurements ---------------------------------------------------------------------------

ComputeCalibration calibrate_compute(const MeasuredPhases& m, double head_tflops, double accumulate_seconds) {
  auto positive = [](double x) { return x > 0 && std::isfinite(x); };
  auto need = [](bool ok, const std::string& field, double x, const std::string& what) {
    if (!ok) throw config_error("measurements: phases." + field + " " + what + ", got " + std::to_string(x));
  };
  need(positive(m.step_flops), "step_flops", m.step_flops, "must be finite and > 0");
  need(m.recompute_flops >= 0 && std::isfinite(m.recompute_flops), "recompute_flops", m.recompute_flops,
       "must be finite and >= 0");
  need(positive(m.forward_seconds), "forward_seconds", m.forward_seconds, "must be finite and > 0");
  need(positive(m.backward_seconds), "backward_seconds", m.backward_seconds, "must be finite and > 0");
  need(m.head_flops >= 0 && std::isfinite(m.head_flops), "head_flops", m.head_flops, "must be finite and >= 0");
  GHT_EXPECTS(head_tflops > 0 && std::isfinite(head_tflops),
              "calibrate_compute: head TFLOP/s must be > 0, got " + std::to_string(head_tflops));
  const double r = m.recompute_flops / m.step_flops, f = m.forward_seconds, b = m.backward_seconds;
  const double h = m.head_flops / (head_tflops * 1e12) + std::max(0.0, accumulate_seconds);
  const double rho = (b - h - r * f) / (f * (1 + r));
  need(rho > 0, "backward_seconds", b,
       "leaves no backward besides the recompute, the LM head and the gradient accumulation (" + fixed(h, 3) +
           " s) the plan predicts");
  return {m.step_flops / (f * (1 + rho)) / 1e12, rho};
}

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
         p.backward_ratio == q.backward_ratio && p.head_flops == q.head_flops &&
         p.head_tflops == q.head_tflops &&
         p.stream_staging_bytes == q.stream_staging_bytes &&
         p.host_state_hbm_bytes == q.host_state_hbm_bytes &&
         p.recompute_scratch_bytes == q.recompute_scratch_bytes &&
         p.delayed_update_hbm_bytes == q.delayed_update_hbm_bytes && p.fp8_hbm_bytes == q.fp8_hbm_bytes &&
         p.fp8_saved_seconds == q.fp8_saved_seconds && p.speculation_hbm_bytes == q.speculation_hbm_bytes &&
         regions_ == o.regions_ &&
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
  p.head_seconds = options.head_seconds();
  p.accumulate_seconds = t.accumulate_seconds;
  // The backward_ratio split is the bf16 layers'; FP8's saving comes off the forward alone.
  p.forward_seconds = (t.compute_seconds - p.head_seconds - p.accumulate_seconds + options.fp8_saved_seconds) /
                          (1 + options.backward_ratio) -
                      options.fp8_saved_seconds;
  p.recompute_seconds = t.recompute_seconds;
  p.window_seconds = t.window_seconds;
  // The update of state in HBM runs on the critical path (measured: 88 ms of GPU time, 95 ms
  // exposed, for 7.4B parameters on the H100). It enters the prediction, not the placement: moving
  // state to the host to hide its update behind the window would trade it against a link update
  // that measures slower than its window model (0.74 of all-HBM against a 0.84 bound), so state
  // stays in HBM wherever it fits.
  p.hbm_pass_seconds = t.hbm_pass_seconds;
  p.exposed_seconds = t.exposed_seconds + t.hbm_pass_seconds;
  p.step_seconds = t.step_seconds + t.hbm_pass_seconds;
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
  const CostModel cm(options.link, options.timed_step_flops(), options.assumed_tflops, regions, options.head_seconds());
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

/// The index of `c`'s placement with the most HBM bytes, starting the search at `from` (the first
/// of equals wins).
int most_hbm(const Candidates& c, int from) {
  int top = from;
  for (int j = 0; j < static_cast<int>(c.opts.size()); ++j) {
    if (c.hbm[j] > c.hbm[top]) top = j;
  }
  return top;
}

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
  const int top = most_hbm(c, cur);
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

/// What every step of make_plan reads: the regions, the options, the GHT_PLACE rules and which
/// one matches each region (-1: none), the cost model and the policy.
struct PlanInputs {
  const std::vector<Region>& regions;
  const PlanOptions& options;
  const std::vector<PlaceRule>& rules;
  const std::vector<int>& match;
  const CostModel& cm;
  bool no_gpu;
  bool is_static;

  const PlaceRule* rule(std::size_t i) const { return match[i] >= 0 ? &rules[match[i]] : nullptr; }
};

/// Policy auto: the regions re-counted and the compute rates set from `measured` when there are
/// measurements; a note either way.
void apply_auto_policy(std::vector<Region>& regions, PlanOptions& options, const Measurements* measured,
                       std::vector<std::string>& notes) {
  if (options.policy != Policy::auto_replan) return;
  if (measured != nullptr) {
    regions = apply_measurements(std::move(regions), *measured);
    notes.push_back("auto: re-planned on measured counts (" +
                    std::to_string(measured->expert_tokens.size()) + " expert token counts, " +
                    std::to_string(measured->link_bytes.size()) + " regions' link bytes)");
    if (measured->phases.present()) {
      const ComputeCalibration c =
          calibrate_compute(measured->phases, options.head_tflops, hbm_accumulate_seconds(regions, options.link));
      notes.push_back("auto: compute rates from measured phases (forward " + fixed(measured->phases.forward_seconds, 3) +
                      " s, backward " + fixed(measured->phases.backward_seconds, 3) + " s): " + fixed(c.tflops, 0) +
                      " TFLOP/s sustained (GHT_ASSUMED_TFLOPS " + fixed(options.assumed_tflops, 0) +
                      "), backward " + fixed(c.backward_ratio, 2) + "x the forward (GHT_ASSUMED_BWD_RATIO " +
                      fixed(options.backward_ratio, 2) + ")");
      options.assumed_tflops = c.tflops;
      options.backward_ratio = c.backward_ratio;
    }
  } else {
    notes.push_back("auto: no measurements yet; planned as greedy until a warm-up step supplies them");
  }
}

/// The placements region `i` may take under the link, its rule and the policy; `fixed_reason`
/// says why when the policy alone leaves it one.
std::vector<Placement> allowed_placements(const PlanInputs& in, std::size_t i, std::string& fixed_reason) {
  const Region& r = in.regions[i];
  const PlaceRule* rule = in.rule(i);
  if (in.no_gpu) {
    if (rule != nullptr && rule->target != RuleTarget::host && rule->target != RuleTarget::stream) {
      throw config_error(rule->describe() + ": region '" + r.name +
                         "' cannot go to HBM: there is no GPU (link none)");
    }
    // The CPU computes on host memory the way the GPU would on HBM: same modes, no link.
    fixed_reason = "no GPU (link none): every region lives in host memory";
    return {{TierKind::host, default_mode(r, TierKind::hbm)}};
  }
  if (rule != nullptr) {
    std::vector<Placement> opts = placements_allowed_by(*rule, r);
    if (in.is_static) opts = {opts.back()};  // static: the rule's tier, HBM-heaviest mode
    return opts;
  }
  if (in.is_static) {
    fixed_reason = r.hbm_allowed ? "static: no GHT_PLACE rule matches it; HBM by default"
                                 : "static: no GHT_PLACE rule matches it; host (HBM not allowed)";
    return {placements(r).back()};  // HBM by default, host only when HBM is not allowed
  }
  return placements(r);
}

/// A placement whose traffic needs a bandwidth the link lacks is unusable when another exists:
/// drops those from `c` (all infinite: keeps the first).
void drop_unusable(Candidates& c, const CostModel& cm, const PlaceRule* rule, std::string& fixed_reason) {
  if (c.opts.size() <= 1) return;
  std::vector<std::size_t> keep;
  for (std::size_t j = 0; j < c.opts.size(); ++j) {
    if (std::isfinite(cm.total_seconds(c.loads[j]))) keep.push_back(j);
  }
  // All infinite: moving between them would subtract inf from inf; keep the first.
  if (keep.empty()) keep.push_back(0);
  if (keep.size() == c.opts.size()) return;
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
    fixed_reason = "only " + std::string(to_string(c.opts[0].tier)) +
                   " is usable: the link profile has no bandwidth for its other placements";
  }
}

/// Region `i`'s usable placements with their loads, bytes and scores; the start is the smallest
/// HBM footprint (the fastest of equals).
Candidates region_candidates(const PlanInputs& in, std::size_t i, std::string& fixed_reason) {
  const Region& r = in.regions[i];
  Candidates c;
  c.opts = allowed_placements(in, i, fixed_reason);
  for (const Placement& p : c.opts) {
    Load l = in.cm.load(r, p);
    const double total = in.cm.total_seconds(l);
    c.loads.push_back(std::move(l));
    c.hbm.push_back(placed_hbm_bytes(r, p, in.options));
    c.host.push_back(host_bytes(r, p));
    c.score.push_back({clamp_score(total), clamp_score(in.cm.serial_seconds(c.loads.back())) + 1e-3 * clamp_score(total),
                       clamp_score(in.cm.unhidable_seconds(c.loads.back())) + 1e-3 * clamp_score(total)});
  }
  drop_unusable(c, in.cm, in.rule(i), fixed_reason);
  for (int j = 1; j < static_cast<int>(c.opts.size()); ++j) {
    if (c.hbm[j] < c.hbm[c.start] ||
        (c.hbm[j] == c.hbm[c.start] && c.score[j][0] < c.score[c.start][0])) {
      c.start = j;
    }
  }
  return c;
}

/// The totals with every region at its start placement.
Totals start_totals(const PlanInputs& in, const std::vector<Candidates>& cands) {
  Totals base;
  base.load = in.cm.zero();
  for (std::size_t i = 0; i < in.regions.size(); ++i) {
    const Candidates& c = cands[i];
    base.load.add(c.loads[c.start]);
    base.hbm += c.hbm[c.start];
    base.host += c.host[c.start];
    base.fixed.count(in.regions[i], c.opts[c.start], +1);
  }
  return base;
}

/// `order` (sorted by gain) with its large moves (over 1/256 of all the bytes the moves bring
/// into HBM) put at the end, each region's moves kept in sequence; then `forced`.
std::vector<Move> large_moves_last(const std::vector<Move>& order, const std::vector<Move>& forced,
                                   const std::vector<Candidates>& cands) {
  const auto by_gain = [](const Move& a, const Move& b) { return a.gain > b.gain; };
  const auto bytes = [&](const Move& m) { return cands[m.region].hbm[m.to] - cands[m.region].hbm[m.from]; };
  std::uint64_t moved_bytes = 0;
  for (const Move& m : order) moved_bytes += bytes(m);
  const std::uint64_t large = moved_bytes / 256;
  std::vector<Move> deferred;
  std::vector<Move> big;
  for (const Move& m : order) (bytes(m) > large ? big : deferred).push_back(m);
  // Keep a region's moves in sequence: once one is deferred, its later moves are too.
  std::vector<bool> region_deferred(cands.size(), false);
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
  return deferred;
}

/// The candidate orders: per score, its moves by gain, and the same with large moves deferred.
/// A prefix stops at the first move that does not fit, so one large region can strand HBM: hence
/// the deferred orders. Every order is fixed before the budgets are looked at, so a larger budget
/// only adds candidates: it can never predict a slower step.
std::array<std::vector<Move>, kOrders> candidate_orders(const std::vector<Candidates>& cands) {
  std::array<std::vector<Move>, kOrders> orders;
  for (int v = 0; v < kScores; ++v) {
    std::vector<Move> forced;
    for (std::size_t i = 0; i < cands.size(); ++i) hull_moves(cands[i], i, v, orders[v], forced);
    const auto by_gain = [](const Move& a, const Move& b) { return a.gain > b.gain; };
    std::stable_sort(orders[v].begin(), orders[v].end(), by_gain);
    std::stable_sort(forced.begin(), forced.end(), by_gain);
    orders[kScores + v] = large_moves_last(orders[v], forced, cands);
    orders[v].insert(orders[v].end(), forced.begin(), forced.end());
  }
  return orders;
}

/// `t` after move `m`.
void apply_move(Totals& t, const Move& m, const std::vector<Candidates>& cands,
                const std::vector<Region>& regions) {
  const Candidates& c = cands[m.region];
  t.load.add(c.loads[m.to]);
  t.load.add(c.loads[m.from], -1.0);
  t.hbm += c.hbm[m.to] - c.hbm[m.from];
  t.host = t.host + c.host[m.to] - c.host[m.from];
  t.fixed.count(regions[m.region], c.opts[m.from], -1);
  t.fixed.count(regions[m.region], c.opts[m.to], +1);
}

/// The fastest prefix of any order within both budgets; infeasible_plan when none fits.
Best search_orders(const PlanInputs& in, const std::array<std::vector<Move>, kOrders>& orders,
                   const Totals& base, const std::vector<Candidates>& cands) {
  const Budgets& B = in.options.budgets;
  auto eff_hbm = [&](const Totals& t) { return t.hbm + t.fixed.hbm(in.options); };
  auto eff_host = [&](const Totals& t) { return t.host + t.fixed.host(in.options); };
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
          const double step = in.cm.evaluate(t.load).step_seconds;
          // Ties go to the plan with more of the regions' bytes in HBM (not counting the
          // reservations, which a plan with a region left on the host would win on).
          if (!best.found || step < best.step || (step == best.step && t.hbm > best.hbm)) {
            best = {true, step, t.hbm, v, k};
          }
        }
      }
      if (k == mv.size()) break;
      apply_move(t, mv[k], cands, in.regions);
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
  return best;
}

/// The chosen prefix replayed: each region's placement, the gain of its last move taken, and
/// where its first move stands in the order (order.size(): none).
struct Replay {
  std::vector<int> chosen;
  std::vector<double> last_gain;
  std::vector<std::size_t> first_move_pos;
};

Replay replay_prefix(const std::vector<Candidates>& cands, const std::vector<Move>& order, std::size_t prefix) {
  Replay r;
  r.chosen.resize(cands.size());
  for (std::size_t i = 0; i < cands.size(); ++i) r.chosen[i] = cands[i].start;
  r.last_gain.assign(cands.size(), 0.0);
  for (std::size_t k = 0; k < prefix; ++k) {
    r.chosen[order[k].region] = order[k].to;
    r.last_gain[order[k].region] = order[k].gain;
  }
  r.first_move_pos.assign(cands.size(), order.size());
  for (std::size_t k = order.size(); k-- > 0;) r.first_move_pos[order[k].region] = k;
  return r;
}

/// Time the most-HBM usable placement saves against the start, per GiB (0: none).
double gain_ms_per_gib(const Candidates& c) {
  const int top = most_hbm(c, c.start);
  if (top == c.start) return 0.0;
  const double saved = c.score[c.start][0] - c.score[top][0];
  return saved > 0 && saved < 1e29
             ? 1e3 * saved / (static_cast<double>(c.hbm[top] - c.hbm[c.start]) / kGiB)
             : 0.0;
}

/// Why the greedy search left region `i` (no rule, more than one placement) where decision `d` puts it.
std::string greedy_reason(const Decision& d, std::size_t i, bool moved, const Replay& rp,
                          const std::vector<Move>& order, int variant) {
  if (moved) {
    if (rp.last_gain[i] < 0) return "greedy: HBM although it is slower there: the host budget cannot hold it";
    if (rp.last_gain[i] == 0) return "greedy: HBM; it saves no time, but HBM had room";
    if (d.mode == Mode::keep) return "greedy: kept; the recompute time it saves is worth its HBM bytes";
    return "greedy: HBM; the link and host time it saves is worth its HBM bytes";
  }
  const std::string where = "greedy: " + std::string(d.mode == Mode::none ? to_string(d.tier) : to_string(d.mode));
  const std::size_t pos = rp.first_move_pos[i];
  if (pos < order.size() && order[pos].gain > 0) {
    return where + "; " +
           (order[pos].deferred ? std::string("a large region: the chosen order fills HBM with smaller ones first")
                                : std::string(kLeftOutWhy[variant % kScores]));
  }
  return where + "; HBM would not make the step faster";
}

/// The decision and its reason for each region; `moved` counts the regions moved off their start.
std::vector<Decision> decide(const PlanInputs& in, const std::vector<Candidates>& cands,
                             const std::vector<std::string>& fixed_reason, const Replay& rp,
                             const std::vector<Move>& order, int variant, std::size_t& moved) {
  std::vector<Decision> decisions(in.regions.size());
  moved = 0;
  for (std::size_t i = 0; i < in.regions.size(); ++i) {
    const Candidates& c = cands[i];
    const int j = rp.chosen[i];
    Decision& d = decisions[i];
    d.tier = c.opts[j].tier;
    d.mode = c.opts[j].mode;
    d.gain_ms_per_gib = gain_ms_per_gib(c);
    if (const PlaceRule* rule = in.rule(i)) {
      d.rule = rule->number;
      d.reason = rule->describe();
      if (c.opts.size() > 1) d.reason += "; greedy chose " + std::string(to_string(d.mode));
      if (j != c.start) ++moved;
    } else if (!fixed_reason[i].empty()) {
      d.reason = fixed_reason[i];
    } else if (c.opts.size() == 1) {
      d.reason = in.regions[i].host_allowed
                     ? "host only: HBM is not allowed for it"
                     : "HBM only: the GPU computes on it in place (host not allowed)";
    } else {
      if (j != c.start) ++moved;
      d.reason = greedy_reason(d, i, j != c.start, rp, order, variant);
    }
  }
  return decisions;
}

/// The greedy search's notes: the order taken, the next move, the HBM left unused.
void add_greedy_notes(const PlanInputs& in, const std::vector<Candidates>& cands, const Best& best,
                      const std::vector<Move>& order, std::size_t moved, const Prediction& p,
                      std::vector<std::string>& notes) {
  if (in.no_gpu || in.is_static) return;
  notes.push_back("greedy: order '" + std::string(kOrderNames[best.variant % kScores]) +
                  (best.variant >= kScores ? " (large regions last)" : "") + "', " +
                  std::to_string(best.prefix) + " of " + std::to_string(order.size()) +
                  " moves into HBM taken (" + std::to_string(moved) + " regions moved)");
  if (best.prefix >= order.size()) return;
  const Move& next = order[best.prefix];
  const Candidates& c = cands[next.region];
  notes.push_back("greedy: next move would be '" + in.regions[next.region].name + "' to " +
                  std::string(to_string(c.opts[next.to].tier)) + "/" +
                  std::string(to_string(c.opts[next.to].mode)) + " (+" +
                  gib(c.hbm[next.to] - c.hbm[next.from]) + " HBM)");
  if (p.hbm_bytes < in.options.budgets.hbm) {
    notes.push_back("greedy: " + gib(in.options.budgets.hbm - p.hbm_bytes) +
                    " of the HBM budget left unused: the next move does not fit");
  }
}

}  // namespace

Plan make_plan(std::vector<Region> regions, const PlanOptions& requested, const Measurements* measured) {
  validate_regions(regions);
  std::vector<std::string> notes;
  PlanOptions options = requested;
  apply_auto_policy(regions, options, measured, notes);
  const std::vector<PlaceRule> rules = parse_place_rules(options.place);
  const std::vector<int> match =
      rules.empty() ? std::vector<int>(regions.size(), -1) : match_place_rules(rules, regions);
  const CostModel cm(options.link, options.timed_step_flops(), options.assumed_tflops, regions, options.head_seconds());
  const PlanInputs in{regions, options, rules, match, cm, options.link.kind == LinkKind::none,
                      options.policy == Policy::static_rules};

  std::vector<Candidates> cands(regions.size());
  std::vector<std::string> fixed_reason(regions.size());
  for (std::size_t i = 0; i < regions.size(); ++i) cands[i] = region_candidates(in, i, fixed_reason[i]);

  const std::array<std::vector<Move>, kOrders> orders = candidate_orders(cands);
  const Best best = search_orders(in, orders, start_totals(in, cands), cands);
  const std::vector<Move>& order = orders[best.variant];
  const Replay rp = replay_prefix(cands, order, best.prefix);

  std::size_t moved = 0;
  std::vector<Decision> decisions = decide(in, cands, fixed_reason, rp, order, best.variant, moved);
  std::vector<Placement> choice(regions.size());
  for (std::size_t i = 0; i < regions.size(); ++i) choice[i] = {decisions[i].tier, decisions[i].mode};
  const Prediction p = predict_with(cm, regions, choice, options);
  add_greedy_notes(in, cands, best, order, moved, p, notes);
  // The replayed plan must satisfy what the search checked (guards the running sums).
  GHT_EXPECTS(p.hbm_bytes <= options.budgets.hbm && p.host_bytes <= options.budgets.host,
              "plan: internal error: chosen placement exceeds a budget");
  return Plan(options, std::move(regions), std::move(decisions), p, std::move(notes));
}

}  // namespace ght::tier
