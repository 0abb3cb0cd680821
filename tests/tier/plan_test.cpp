// The placement engine: properties over seeded random region sets and budgets (no budget
// exceeded, more memory never predicts a slower step, static rules honoured exactly, infeasible
// requests detected with the right shortfall), plus brute-force comparisons, the JSON formats,
// budgets from the registry and the auto policy's measurements.
#include <fnmatch.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "common/registry.hpp"
#include "tier/config.hpp"
#include "tier/link_fixtures.hpp"
#include "tier/cost_model.hpp"
#include "tier/place_rules.hpp"
#include "tier/plan.hpp"
#include "tier/regions_json.hpp"

namespace ght::tier {
namespace {

using test::gh200_numbers;
using test::pcie_numbers;

constexpr std::uint64_t MiB = 1ULL << 20;
constexpr std::uint64_t GiB = 1ULL << 30;

// ---- random region sets ------------------------------------------------------------------------

struct Gen {
  explicit Gen(std::uint64_t seed) : rng(seed) {}
  std::mt19937_64 rng;
  double uni(double a, double b) { return std::uniform_real_distribution<double>(a, b)(rng); }
  int pick(int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng); }
  bool chance(double p) { return uni(0, 1) < p; }

  Access access(double bytes, bool expert) {
    Access a;
    static const char* whats[] = {"compute", "optimizer", "grad_stream", "accumulate"};
    a.what = whats[pick(0, 3)];
    if (chance(0.7)) a.gpu_read_bytes = uni(0, 4) * bytes;
    if (chance(0.5)) a.gpu_write_bytes = uni(0, 4) * bytes;
    if (chance(0.2)) a.cpu_read_bytes = uni(0, 3) * bytes;
    if (chance(0.2)) a.cpu_write_bytes = uni(0, 3) * bytes;
    a.times_per_step = pick(1, 8);
    a.overlappable = chance(0.8);
    static const double windows[] = {1.0, 0.5, 0.125, 0.3};
    a.window_fraction = windows[pick(0, 3)];
    a.gpu_path = chance(0.5) ? GpuPath::copy : GpuPath::kernel;
    if (expert && chance(0.5)) a.routing_tokens = pick(1, 4096);
    return a;
  }

  std::vector<Region> regions(int n) {
    std::vector<Region> out;
    for (int i = 0; i < n; ++i) {
      Region r;
      r.name = "r" + std::to_string(i);
      r.cls = static_cast<TensorClass>(pick(0, kNumTensorClasses - 1));
      r.group = chance(0.5) ? std::string("g") + std::to_string(pick(0, 3)) : std::string();
      r.bytes = static_cast<std::uint64_t>(pick(1, 1000)) * MiB;
      if (r.cls == TensorClass::grad) {
        r.host_bytes = 2 * r.bytes;
      } else if (chance(0.3)) {
        r.host_bytes = r.bytes * static_cast<std::uint64_t>(pick(1, 3));
      }
      r.layer = pick(0, 3);
      if (chance(0.4)) {
        r.expert = pick(0, 7);
        r.routing_frequency = uni(0, 0.5);
      }
      const int k = pick(0, 3);
      for (int j = 0; j < k; ++j) r.access.push_back(access(static_cast<double>(r.bytes), r.expert >= 0));
      if (chance(0.3)) {
        std::vector<Access> h;
        const int m = pick(0, 3);
        for (int j = 0; j < m; ++j) h.push_back(access(static_cast<double>(r.bytes), r.expert >= 0));
        r.host_access = h;
      }
      const double u = uni(0, 1);
      if (u < 0.1) r.host_allowed = false;
      if (u > 0.9) r.hbm_allowed = false;
      if (r.hbm_allowed && (r.cls == TensorClass::activation || chance(0.1))) {
        r.recompute_bytes = r.bytes / static_cast<std::uint64_t>(pick(2, 16));
        r.recompute_flops = uni(1e10, 1e14);
      }
      out.push_back(std::move(r));
    }
    return out;
  }

  PlanOptions options(Policy policy = Policy::greedy) {
    PlanOptions o;
    o.policy = policy;
    o.link = chance(0.5) ? gh200_numbers() : pcie_numbers();
    o.step_flops = uni(1e12, 5e14);
    o.assumed_tflops = 450;
    o.stream_staging_bytes = chance(0.5) ? static_cast<std::uint64_t>(pick(0, 64)) * MiB : 0;
    o.budgets.hbm_origin = "test hbm";
    o.budgets.host_origin = "test host";
    return o;
  }
};

std::uint64_t sum_hbm(const std::vector<Region>& rs) {
  std::uint64_t s = 0;
  for (const auto& r : rs) s += r.bytes;
  return s;
}
std::uint64_t sum_host(const std::vector<Region>& rs) {
  std::uint64_t s = 0;
  for (const auto& r : rs) s += r.host_bytes.value_or(r.bytes);
  return s;
}

// Bytes recomputed from the decisions, independently of the engine's bookkeeping.
std::pair<std::uint64_t, std::uint64_t> used_bytes(const Plan& p) {
  std::uint64_t hbm = 0, host = 0;
  bool streams = false;
  for (std::size_t i = 0; i < p.regions().size(); ++i) {
    const Region& r = p.regions()[i];
    const Decision& d = p.decisions()[i];
    if (d.tier == TierKind::hbm) {
      hbm += d.mode == Mode::recompute ? *r.recompute_bytes : r.bytes;
    } else {
      hbm += r.hbm_bytes_on_host;  // a streamed gradient's micro-batch buffer
      host += r.host_bytes.value_or(r.bytes);
      streams |= r.cls == TensorClass::grad;
    }
  }
  // The stream stages through pinned host memory only.
  if (streams && p.options().link.kind != LinkKind::none) host += p.options().stream_staging_bytes;
  return {hbm, host};
}

void expect_valid(const Plan& p) {
  const auto [hbm, host] = used_bytes(p);
  EXPECT_EQ(hbm, p.prediction().hbm_bytes);
  EXPECT_EQ(host, p.prediction().host_bytes);
  EXPECT_LE(hbm, p.options().budgets.hbm);
  EXPECT_LE(host, p.options().budgets.host);
  for (std::size_t i = 0; i < p.regions().size(); ++i) {
    const Region& r = p.regions()[i];
    const Decision& d = p.decisions()[i];
    const auto allowed = placements(r);
    EXPECT_NE(std::find(allowed.begin(), allowed.end(), Placement{d.tier, d.mode}), allowed.end())
        << r.name << " placed " << to_string(d.tier) << "/" << to_string(d.mode);
    EXPECT_FALSE(d.reason.empty()) << r.name;
  }
  // The stored prediction is what predict() computes for the same placement.
  EXPECT_EQ(predict(p.regions(), p.decisions(), p.options()), p.prediction());
}

// ---- properties -------------------------------------------------------------------------------

TEST(PlanProperties, NoBudgetIsEverExceeded) {
  int feasible = 0, infeasible = 0;
  for (std::uint64_t seed = 1; seed <= 300; ++seed) {
    Gen g(seed);
    const auto regions = g.regions(g.pick(1, 40));
    PlanOptions o = g.options(seed % 3 == 0 ? Policy::auto_replan : Policy::greedy);
    o.budgets.hbm = static_cast<std::uint64_t>(g.uni(0, 1.2) * static_cast<double>(sum_hbm(regions)));
    o.budgets.host = static_cast<std::uint64_t>(g.uni(0, 1.2) * static_cast<double>(sum_host(regions)));
    try {
      const Plan p = make_plan(regions, o);
      SCOPED_TRACE("seed " + std::to_string(seed));
      expect_valid(p);
      ++feasible;
    } catch (const infeasible_plan& e) {
      EXPECT_GT(e.missing_bytes(), 0u);
      ++infeasible;
    }
  }
  // Both outcomes must occur, or the property was tested vacuously.
  EXPECT_GT(feasible, 60);
  EXPECT_GT(infeasible, 20);
}

TEST(PlanProperties, MoreMemoryNeverPredictsASlowerStep) {
  int checked = 0;
  for (std::uint64_t seed = 1000; seed < 1200; ++seed) {
    Gen g(seed);
    const auto regions = g.regions(g.pick(2, 40));
    PlanOptions o = g.options();
    const bool vary_hbm = seed % 2 == 0;
    const double total = static_cast<double>(vary_hbm ? sum_hbm(regions) : sum_host(regions));
    if (vary_hbm) {
      o.budgets.host = sum_host(regions) + o.stream_staging_bytes;
    } else {
      o.budgets.hbm = static_cast<std::uint64_t>(g.uni(0.2, 1.0) * static_cast<double>(sum_hbm(regions)));
    }
    std::vector<double> fractions;
    for (int i = 0; i < 14; ++i) fractions.push_back(g.uni(0, 1.15));
    std::sort(fractions.begin(), fractions.end());
    bool was_feasible = false;
    double prev = std::numeric_limits<double>::infinity();
    for (double f : fractions) {
      (vary_hbm ? o.budgets.hbm : o.budgets.host) =
          static_cast<std::uint64_t>(f * total) + (vary_hbm ? 0 : o.stream_staging_bytes);
      try {
        const Plan p = make_plan(regions, o);
        const double step = p.prediction().step_seconds;
        EXPECT_LE(step, prev * (1 + 1e-12)) << "seed " << seed << " budget fraction " << f;
        prev = step;
        was_feasible = true;
        ++checked;
      } catch (const infeasible_plan&) {
        EXPECT_FALSE(was_feasible) << "seed " << seed << ": a larger budget became infeasible";
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

// Reference matcher for the rules the test generates, written against fnmatch(3).
struct RefRule {
  std::string text;
  enum { cls, name, hot, cold } kind;
  std::string glob;
  int n = 0;
  TierKind tier;
};

bool ref_class(const std::string& glob, TensorClass c) {
  return fnmatch(glob.c_str(), std::string(to_string(c)).c_str(), FNM_CASEFOLD) == 0;
}

std::vector<int> ref_match(const std::vector<RefRule>& rules, const std::vector<Region>& regions,
                           bool* some_rule_matches_nothing) {
  std::vector<int> m(regions.size(), -1);
  *some_rule_matches_nothing = false;
  for (std::size_t k = 0; k < rules.size(); ++k) {
    const RefRule& rule = rules[k];
    bool any = false;
    for (std::size_t i = 0; i < regions.size(); ++i) {
      const Region& r = regions[i];
      bool hit = false;
      if (rule.kind == RefRule::cls) hit = ref_class(rule.glob, r.cls);
      if (rule.kind == RefRule::name) hit = fnmatch(rule.glob.c_str(), r.name.c_str(), 0) == 0;
      if ((rule.kind == RefRule::hot || rule.kind == RefRule::cold) && r.expert >= 0 &&
          ref_class(rule.glob, r.cls)) {
        // Rank the experts of r's layer by their (max) frequency.
        std::map<int, double> f;
        for (const Region& q : regions) {
          if (q.expert >= 0 && q.layer == r.layer) f[q.expert] = std::max(f[q.expert], q.routing_frequency);
        }
        std::vector<std::pair<double, int>> v;
        for (auto [e, x] : f) v.push_back({rule.kind == RefRule::hot ? -x : x, e});
        std::sort(v.begin(), v.end());
        for (int j = 0; j < std::min<int>(rule.n, static_cast<int>(v.size())); ++j) {
          hit |= v[j].second == r.expert;
        }
      }
      if (hit) {
        m[i] = static_cast<int>(k);
        any = true;
      }
    }
    if (!any) *some_rule_matches_nothing = true;
  }
  return m;
}

TEST(PlanProperties, StaticRulesAreHonouredExactly) {
  const std::vector<std::string> class_globs = {"weight", "grad", "master", "adam_*", "adam_m",
                                                "activation", "other", "*", "ADAM_V", "*t"};
  const std::vector<std::string> name_globs = {"r1*", "r?", "*5", "r2?", "name:r3*"};
  int honoured = 0, rejected = 0;
  for (std::uint64_t seed = 2000; seed < 2300; ++seed) {
    Gen g(seed);
    const auto regions = g.regions(g.pick(1, 30));
    std::vector<RefRule> rules;
    std::string text;
    const int nr = g.pick(1, 4);
    for (int k = 0; k < nr; ++k) {
      RefRule r;
      r.tier = g.chance(0.5) ? TierKind::hbm : TierKind::host;
      const int kind = g.pick(0, 2);
      std::string sel;
      if (kind == 0) {
        r.kind = RefRule::cls;
        r.glob = class_globs[g.pick(0, static_cast<int>(class_globs.size()) - 1)];
        sel = r.glob;
      } else if (kind == 1) {
        r.kind = RefRule::name;
        sel = name_globs[g.pick(0, static_cast<int>(name_globs.size()) - 1)];
        r.glob = sel.rfind("name:", 0) == 0 ? sel.substr(5) : sel;
      } else {
        r.kind = g.chance(0.5) ? RefRule::hot : RefRule::cold;
        r.n = g.pick(1, 4);
        r.glob = class_globs[g.pick(0, static_cast<int>(class_globs.size()) - 1)];
        sel = std::string("experts[") + (r.kind == RefRule::hot ? "hot:" : "cold:") +
              std::to_string(r.n) + "]." + r.glob;
      }
      r.text = sel + "=" + (r.tier == TierKind::hbm ? "hbm" : "host");
      text += (k ? " , " : "") + r.text;
      rules.push_back(r);
    }
    bool unmatched_rule = false;
    const std::vector<int> m = ref_match(rules, regions, &unmatched_rule);
    bool forbidden = false;
    for (std::size_t i = 0; i < regions.size(); ++i) {
      if (m[i] < 0) continue;
      const TierKind t = rules[m[i]].tier;
      forbidden |= t == TierKind::hbm ? !regions[i].hbm_allowed : !regions[i].host_allowed;
    }
    for (Policy policy : {Policy::static_rules, Policy::greedy}) {
      PlanOptions o = g.options(policy);
      o.place = text;
      o.budgets.hbm = sum_hbm(regions) + o.stream_staging_bytes;
      o.budgets.host = sum_host(regions) + o.stream_staging_bytes;
      SCOPED_TRACE("seed " + std::to_string(seed) + " GHT_PLACE=" + text);
      if (unmatched_rule || forbidden) {
        EXPECT_THROW((void)make_plan(regions, o), config_error);
        ++rejected;
        continue;
      }
      const Plan p = make_plan(regions, o);
      expect_valid(p);
      for (std::size_t i = 0; i < regions.size(); ++i) {
        const Decision& d = p.decisions()[i];
        if (m[i] >= 0) {
          EXPECT_EQ(d.tier, rules[m[i]].tier) << regions[i].name;
          EXPECT_EQ(d.rule, m[i] + 1) << regions[i].name;
        } else if (policy == Policy::static_rules) {
          EXPECT_EQ(d.tier, regions[i].hbm_allowed ? TierKind::hbm : TierKind::host) << regions[i].name;
          EXPECT_EQ(d.rule, 0);
        }
        if (policy == Policy::static_rules && d.tier == TierKind::hbm) {
          EXPECT_NE(d.mode, Mode::recompute) << "static keeps activations unless told otherwise";
        }
      }
      ++honoured;
    }
  }
  EXPECT_GT(honoured, 100);
  EXPECT_GT(rejected, 50);
}

TEST(PlanProperties, InfeasibleRequestsNameTheBudgetAndTheShortfall) {
  int hbm_cases = 0, host_cases = 0;
  for (std::uint64_t seed = 3000; seed < 3300; ++seed) {
    Gen g(seed);
    const auto regions = g.regions(g.pick(1, 40));
    PlanOptions o = g.options();
    o.stream_staging_bytes = 0;  // keeps the minimum footprints exact sums
    std::uint64_t min_hbm = 0, min_host = 0;
    for (const Region& r : regions) {
      if (!r.host_allowed) min_hbm += r.recompute_bytes.value_or(r.bytes);
      if (!r.hbm_allowed) min_host += r.host_bytes.value_or(r.bytes);
    }
    if (seed % 2 == 0 && min_hbm > 0) {
      o.budgets.hbm = min_hbm - 1 - static_cast<std::uint64_t>(g.pick(0, 1000)) % min_hbm;
      o.budgets.host = sum_host(regions);
      try {
        (void)make_plan(regions, o);
        ADD_FAILURE() << "seed " << seed << ": infeasible HBM request accepted";
      } catch (const infeasible_plan& e) {
        EXPECT_EQ(e.tier(), TierKind::hbm);
        EXPECT_EQ(e.needed_bytes(), min_hbm);
        EXPECT_EQ(e.missing_bytes(), min_hbm - o.budgets.hbm);
        EXPECT_NE(std::string(e.what()).find("GHT_HBM_BUDGET"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(std::to_string(min_hbm - o.budgets.hbm) + " bytes"),
                  std::string::npos)
            << e.what();
        ++hbm_cases;
      }
    } else if (seed % 2 == 1 && min_host > 0) {
      o.budgets.hbm = sum_hbm(regions);
      o.budgets.host = min_host - 1 - static_cast<std::uint64_t>(g.pick(0, 1000)) % min_host;
      try {
        (void)make_plan(regions, o);
        ADD_FAILURE() << "seed " << seed << ": infeasible host request accepted";
      } catch (const infeasible_plan& e) {
        EXPECT_EQ(e.tier(), TierKind::host);
        EXPECT_EQ(e.needed_bytes(), min_host);
        EXPECT_NE(std::string(e.what()).find("GHT_HOST_BUDGET"), std::string::npos) << e.what();
        ++host_cases;
      }
    }
  }
  EXPECT_GT(hbm_cases, 30);
  EXPECT_GT(host_cases, 30);
}

// Exhaustive search over every placement of small sets: the engine's plan must fit, must be
// found whenever any placement fits with room to spare, and must never beat the optimum.
TEST(PlanProperties, AgreesWithBruteForceOnSmallSets) {
  int compared = 0, optimal = 0;
  for (std::uint64_t seed = 4000; seed < 4250; ++seed) {
    Gen g(seed);
    const auto regions = g.regions(g.pick(1, 7));
    PlanOptions o = g.options();
    o.budgets.hbm = static_cast<std::uint64_t>(g.uni(0, 1.1) * static_cast<double>(sum_hbm(regions)));
    o.budgets.host = static_cast<std::uint64_t>(g.uni(0.3, 1.2) * static_cast<double>(sum_host(regions)));
    std::vector<std::vector<Placement>> opts;
    for (const auto& r : regions) opts.push_back(placements(r));
    std::vector<std::size_t> idx(regions.size(), 0);
    double best = std::numeric_limits<double>::infinity();
    bool feasible_with_slack = false;
    std::uint64_t largest = 0;
    for (const auto& r : regions) largest = std::max({largest, r.bytes, r.host_bytes.value_or(r.bytes)});
    while (true) {
      std::vector<Decision> d(regions.size());
      for (std::size_t i = 0; i < regions.size(); ++i) {
        d[i].tier = opts[i][idx[i]].tier;
        d[i].mode = opts[i][idx[i]].mode;
      }
      const Prediction p = predict(regions, d, o);
      if (p.hbm_bytes <= o.budgets.hbm && p.host_bytes <= o.budgets.host) {
        best = std::min(best, p.step_seconds);
        if (p.hbm_bytes + largest <= o.budgets.hbm && p.host_bytes + largest <= o.budgets.host) {
          feasible_with_slack = true;
        }
      }
      std::size_t k = 0;
      while (k < idx.size() && ++idx[k] == opts[k].size()) idx[k++] = 0;
      if (k == idx.size()) break;
    }
    SCOPED_TRACE("seed " + std::to_string(seed));
    try {
      const Plan p = make_plan(regions, o);
      expect_valid(p);
      EXPECT_GE(p.prediction().step_seconds, best * (1 - 1e-9));
      ++compared;
      if (p.prediction().step_seconds <= best * (1 + 1e-9)) ++optimal;
    } catch (const infeasible_plan&) {
      EXPECT_FALSE(feasible_with_slack) << "engine missed a placement that fits with room to spare";
    }
  }
  EXPECT_GT(compared, 100);
  // The greedy is a heuristic; on these adversarial random sets it should still usually be exact.
  EXPECT_GT(optimal, compared * 7 / 10) << optimal << " of " << compared << " optimal";
  std::printf("brute force: %d of %d plans optimal\n", optimal, compared);
}

// ---- focused behaviour -------------------------------------------------------------------------

Region make_region(const std::string& name, TensorClass cls, std::uint64_t bytes) {
  Region r;
  r.name = name;
  r.cls = cls;
  r.bytes = bytes;
  return r;
}

// A small "model": bf16 weights the GPU must hold, grads, fp32 optimizer state, activations.
std::vector<Region> small_model(double params, int grad_accum) {
  const auto P = static_cast<std::uint64_t>(params);
  const double w = 1.0 / grad_accum;
  Region weight = make_region("w", TensorClass::weight, 2 * P);
  weight.host_allowed = false;
  Region grad = make_region("g", TensorClass::grad, 2 * P);
  grad.host_bytes = 4 * P;
  Access s;
  s.what = "grad_stream";
  s.gpu_write_bytes = 2 * params;
  s.times_per_step = grad_accum;
  Access acc;
  acc.what = "accumulate";
  acc.cpu_read_bytes = 6 * params * grad_accum;
  acc.cpu_write_bytes = 4 * params * grad_accum;
  Access opt_read;
  opt_read.what = "optimizer";
  opt_read.gpu_read_bytes = 4 * params;
  opt_read.gpu_path = GpuPath::kernel;
  opt_read.window_fraction = w;
  grad.host_access = std::vector<Access>{s, acc, opt_read};
  std::vector<Region> out = {weight, grad};
  for (const char* n : {"master", "adam_m", "adam_v"}) {
    Region r = make_region(n, *parse_tensor_class(n), 4 * P);
    Access a;
    a.what = "optimizer";
    a.gpu_read_bytes = 4 * params;
    a.gpu_write_bytes = 4 * params;
    a.gpu_path = GpuPath::kernel;
    a.window_fraction = w;
    r.access = {a};
    out.push_back(r);
  }
  Region act = make_region("act", TensorClass::activation, P);
  act.host_allowed = false;
  act.recompute_bytes = P / 32;
  act.recompute_flops = 2 * params * 4096 * grad_accum;
  out.push_back(act);
  return out;
}

PlanOptions model_options(std::uint64_t hbm, std::uint64_t host, double params) {
  PlanOptions o;
  o.link = gh200_numbers();
  o.step_flops = 6 * params * 4096 * 8;
  o.assumed_tflops = 450;  // the seconds these tests work out by hand
  o.budgets = {hbm, host, "test hbm", "test host"};
  o.stream_staging_bytes = 64 * MiB;
  return o;
}

TEST(Plan, GradientsStreamWhenTheyDoNotFitBesideTheWeights) {
  const double params = 1e9;
  const auto regions = small_model(params, 8);
  // Weights 2 GB + activation 1 GB fit; grads (2 GB) do not.
  const Plan p = make_plan(regions, model_options(3'500'000'000ULL, 100 * GiB, params));
  expect_valid(p);
  EXPECT_EQ(p.find("w")->tier, TierKind::hbm);
  EXPECT_EQ(p.find("g")->mode, Mode::stream);
  EXPECT_EQ(p.find("master")->tier, TierKind::host);
  EXPECT_EQ(p.mode_summary(TensorClass::grad), "stream");
  EXPECT_EQ(p.tier_for("g", TensorClass::grad), TierKind::host);
  // Staging is charged on both tiers while gradients stream.
  EXPECT_EQ(p.prediction().host_bytes, 12 * 1'000'000'000ULL + 4'000'000'000ULL + 64 * MiB);

  // With room, the grads accumulate in HBM and the optimizer state starts moving in.
  const Plan big = make_plan(regions, model_options(20 * GiB, 100 * GiB, params));
  expect_valid(big);
  EXPECT_EQ(big.find("g")->mode, Mode::accumulate);
  EXPECT_EQ(big.find("act")->mode, Mode::keep);
  EXPECT_EQ(big.find("master")->tier, TierKind::hbm);
  // On the C2C link everything the small plan streams hides behind compute: equal steps.
  EXPECT_LE(big.prediction().step_seconds, p.prediction().step_seconds);
  EXPECT_DOUBLE_EQ(p.prediction().exposed_seconds, 0.0);
  // Unknown names fall back to the tier holding most bytes of the class.
  EXPECT_EQ(big.tier_for("not-a-region", TensorClass::adam_m), TierKind::hbm);
  EXPECT_EQ(p.tier_for("not-a-region", TensorClass::adam_m), TierKind::host);
  EXPECT_EQ(p.tier_for("not-a-region", TensorClass::activation), TierKind::hbm);
}

TEST(Plan, ActivationsAreRecomputedWhenHbmIsShort) {
  const double params = 1e9;
  auto regions = small_model(params, 8);
  // 2 GB weights + 2 GB grads fit, the 1 GB activation only as a checkpoint. Over PCIe,
  // streaming the grads instead costs 0.28 s of host-memory time beyond the window; a cheap
  // recompute (0.02 s) is the better use of HBM.
  regions[5].recompute_flops = 9e12;
  PlanOptions o = model_options(4'100'000'000ULL, 100 * GiB, params);
  o.link = pcie_numbers();
  const Plan p = make_plan(regions, o);
  expect_valid(p);
  EXPECT_EQ(p.find("act")->mode, Mode::recompute) << p.format_table(true);
  EXPECT_DOUBLE_EQ(p.prediction().recompute_seconds, 0.02);
  EXPECT_EQ(p.find("g")->mode, Mode::accumulate);
  // An expensive recompute (0.15 s) loses to streaming the grads: the activation is kept.
  regions[5].recompute_flops = 2 * params * 4096 * 8;
  const Plan q = make_plan(regions, o);
  expect_valid(q);
  EXPECT_EQ(q.find("act")->mode, Mode::keep);
  EXPECT_EQ(q.find("g")->mode, Mode::stream);
  EXPECT_NE(p.format_table(true).find("why:"), std::string::npos);
}

TEST(Plan, StaticPolicyAndRuleErrors) {
  const double params = 1e8;
  const auto regions = small_model(params, 4);
  PlanOptions o = model_options(100 * GiB, 100 * GiB, params);
  o.policy = Policy::static_rules;
  o.place = "master=host, adam_*=host, grad=stream, activation=recompute";
  const Plan p = make_plan(regions, o);
  expect_valid(p);
  EXPECT_EQ(p.find("master")->tier, TierKind::host);
  EXPECT_EQ(p.find("master")->rule, 1);
  EXPECT_EQ(p.find("adam_v")->rule, 2);
  EXPECT_EQ(p.find("g")->mode, Mode::stream);
  EXPECT_EQ(p.find("act")->mode, Mode::recompute);
  EXPECT_EQ(p.find("w")->tier, TierKind::hbm);
  EXPECT_EQ(p.find("w")->rule, 0);

  o.place = "weight=host";  // the weight does not allow the host tier
  try {
    (void)make_plan(regions, o);
    FAIL();
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("rule 1 'weight=host'"), std::string::npos) << e.what();
  }
  o.place = "master=recompute";
  EXPECT_THROW((void)make_plan(regions, o), config_error);
  o.place = "mastr=host";  // matches nothing: a typo is an error, not a silent no-op
  EXPECT_THROW((void)make_plan(regions, o), config_error);
  o.place = "master=host,";
  EXPECT_THROW((void)make_plan(regions, o), config_error);

  // Static rules that cannot fit name the budget.
  o.place = "master=hbm";
  o.budgets.hbm = 1 * GiB;
  EXPECT_THROW((void)make_plan(regions, o), infeasible_plan);
}

TEST(Plan, NoGpuPutsEverythingOnTheHost) {
  const double params = 1e7;
  const auto regions = small_model(params, 1);
  PlanOptions o = model_options(0, 10 * GiB, params);
  o.link = LinkNumbers{};
  o.link.name = "none";
  o.link.kind = LinkKind::none;
  const Plan p = make_plan(regions, o);
  for (const auto& d : p.decisions()) EXPECT_EQ(d.tier, TierKind::host);
  EXPECT_EQ(p.find("g")->mode, Mode::accumulate);  // the CPU accumulates in place
  EXPECT_EQ(p.find("act")->mode, Mode::keep);
  EXPECT_EQ(p.prediction().hbm_bytes, 0u);  // no GPU: no staging either
  EXPECT_EQ(p.prediction().host_bytes, 12 * 10'000'000ULL + 4 * 10'000'000ULL + 2 * 10'000'000ULL +
                                           10'000'000ULL);
  EXPECT_DOUBLE_EQ(p.prediction().link_seconds, 0.0);
  EXPECT_DOUBLE_EQ(p.prediction().step_seconds, p.prediction().compute_seconds);
  o.place = "weight=hbm";
  EXPECT_THROW((void)make_plan(regions, o), config_error);
}

TEST(Plan, AutoPolicyUsesMeasuredRouting) {
  // Two experts' weights in one layer, HBM for one: the measured hot expert must win.
  std::vector<Region> regions;
  for (int e = 0; e < 2; ++e) {
    Region r = make_region("l0.e" + std::to_string(e) + ".weight", TensorClass::weight, GiB);
    r.layer = 0;
    r.expert = e;
    r.routing_frequency = 0.001;
    Access a;
    a.gpu_read_bytes = 2.0 * GiB;
    a.times_per_step = 8;
    a.routing_tokens = 1000;
    r.access = {a};
    regions.push_back(r);
  }
  PlanOptions o = model_options(GiB + GiB / 2, 10 * GiB, 1e9);
  o.policy = Policy::auto_replan;
  const Plan before = make_plan(regions, o);
  EXPECT_EQ(before.find("l0.e0.weight")->tier, TierKind::hbm);  // tie: lower index first
  Measurements m;
  m.step_tokens = 1000;
  m.expert_tokens = {{0, 0, 1.0}, {0, 1, 500.0}};
  const Plan after = make_plan(regions, o, &m);
  EXPECT_EQ(after.find("l0.e1.weight")->tier, TierKind::hbm);
  EXPECT_EQ(after.find("l0.e0.weight")->tier, TierKind::host);
  EXPECT_DOUBLE_EQ(after.regions()[1].routing_frequency, 0.5);
  EXPECT_NE(after.notes().front().find("measured"), std::string::npos);

  // Measured link bytes rescale the host-side accesses.
  Measurements lb;
  lb.link_bytes = {{"l0.e0.weight", 1e9, 0}};
  const auto scaled = apply_measurements(regions, lb);
  const CostModel cm(o.link, 0, 450, scaled);
  EXPECT_NEAR(cm.evaluate(cm.load(scaled[0], {TierKind::host, Mode::none})).h2d_bytes, 1e9, 1e-3);
  lb.link_bytes = {{"nope", 1, 1}};
  EXPECT_THROW((void)apply_measurements(regions, lb), ght::logic_error);
  m.expert_tokens = {{0, 9, 1.0}};
  EXPECT_THROW((void)apply_measurements(regions, m), ght::logic_error);
}

TEST(Plan, ValidationNamesTheRegion) {
  std::vector<Region> rs = {make_region("a", TensorClass::weight, 10), make_region("a", TensorClass::grad, 10)};
  try {
    validate_regions(rs);
    FAIL();
  } catch (const ght::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("'a' appears twice"), std::string::npos);
  }
  rs[1].name = "b";
  rs[1].recompute_bytes = 11;
  EXPECT_THROW(validate_regions(rs), ght::logic_error);
  rs[1].recompute_bytes.reset();
  rs[1].access = {Access{}};
  rs[1].access[0].window_fraction = 2;
  EXPECT_THROW(validate_regions(rs), ght::logic_error);
}

// ---- JSON -----------------------------------------------------------------------------------------

TEST(PlanJson, RoundTripsExactly) {
  for (std::uint64_t seed = 5000; seed < 5040; ++seed) {
    Gen g(seed);
    const auto regions = g.regions(g.pick(1, 30));
    PlanOptions o = g.options(static_cast<Policy>(seed % 3));
    o.budgets.hbm = sum_hbm(regions) + o.stream_staging_bytes;
    o.budgets.host = sum_host(regions) + o.stream_staging_bytes;
    const Plan p = make_plan(regions, o);
    const std::string text = p.to_json();
    const Plan q = Plan::from_json(text, "mem.json");
    EXPECT_TRUE(q == p) << "seed " << seed;
    EXPECT_EQ(q.to_json(), text);
    for (const auto& r : regions) EXPECT_EQ(q.tier_for(r.name, r.cls), p.tier_for(r.name, r.cls));

    const std::string rj = regions_to_json(regions, o.step_flops);
    const RegionSet back = regions_from_json(rj, "regions.json");
    EXPECT_EQ(back.regions, regions);
    EXPECT_EQ(back.step_flops, o.step_flops);
    EXPECT_EQ(regions_to_json(back.regions, back.step_flops), rj);
  }
}

TEST(PlanJson, ErrorsNameTheFileAndTheKey) {
  auto expect_error = [](const std::string& text, const std::string& needle) {
    try {
      (void)regions_from_json(text, "my.json");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const io_error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("my.json"), std::string::npos) << e.what();
    }
  };
  expect_error("{\"regions\": [{\"name\": \"a\", \"class\": \"weight\", \"bytes\": 1, \"colour\": 2}]}",
               "regions[0].colour: unknown key");
  expect_error("{\"regions\": [{\"name\": \"a\", \"class\": \"wieght\", \"bytes\": 1}]}",
               "regions[0].class: unknown class 'wieght'");
  expect_error("{\"regions\": [{\"name\": \"a\", \"class\": \"weight\", \"bytes\": -1}]}",
               "regions[0].bytes: must be >= 0");
  expect_error("{\"regions\": [{\"name\": \"a\", \"class\": \"weight\"}]}", "regions[0].bytes: missing");
  expect_error("{\"regions\": [{\"name\": \"a\", \"class\": \"weight\", \"bytes\": 1, "
               "\"access\": [{\"gpu_path\": \"dma\"}]}]}",
               "regions[0].access[0].gpu_path");
  expect_error("[{\"name\": \"a\", \"class\": \"weight\", \"bytes\": 1}, "
               "{\"name\": \"a\", \"class\": \"grad\", \"bytes\": 1}]",
               "'a' appears twice");
  expect_error("{not json", "not valid JSON");
  // A bare array is accepted too.
  EXPECT_EQ(regions_from_json("[{\"name\": \"a\", \"class\": \"weight\", \"bytes\": 1}]", "x").regions.size(), 1u);
  EXPECT_THROW((void)Plan::from_json("{\"format\": \"other\"}", "p.json"), io_error);

  // A saved plan that puts a region where it may not go is rejected, naming it.
  std::vector<Region> rs = {make_region("w", TensorClass::weight, 100)};
  rs[0].host_allowed = false;
  PlanOptions o;
  o.link = gh200_numbers();
  o.budgets = {1000, 1000, "h", "o"};
  std::string text = make_plan(rs, o).to_json();
  const auto at = text.find("\"tier\":\"hbm\"");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 12, "\"tier\":\"host\"");
  try {
    (void)Plan::from_json(text, "edited.json");
    ADD_FAILURE() << "accepted a weight on the host";
  } catch (const io_error& e) {
    EXPECT_NE(std::string(e.what()).find("edited.json: regions[0]: region 'w' does not allow tier host"),
              std::string::npos)
        << e.what();
  }
}

// ---- budgets from the registry ----------------------------------------------------------------

using ght::test::registry_with;

TEST(PlanBudgets, FromTheRegistry) {
  const Capacities caps{"test machine", 100 * GiB, 90 * GiB, 400 * GiB, 300 * GiB};
  {
    const auto reg = registry_with({});
    const Budgets b = resolve_budgets(caps, reg);
    EXPECT_EQ(b.hbm, 88 * GiB);                        // free minus 2 GiB headroom
    EXPECT_EQ(b.host, 300 * GiB - 40 * GiB);           // available minus 10% of 400 GiB
    EXPECT_NE(b.hbm_origin.find("GHT_HBM_HEADROOM=2GiB (default)"), std::string::npos) << b.hbm_origin;
  }
  {
    auto reg = registry_with({"GHT_HBM_BUDGET=40G", "GHT_HOST_BUDGET=50%"});
    Budgets b = resolve_budgets(caps, reg);
    EXPECT_EQ(b.hbm, 40 * GiB);
    EXPECT_EQ(b.host, 200 * GiB);
    EXPECT_NE(b.hbm_origin.find("GHT_HBM_BUDGET=40G (env)"), std::string::npos) << b.hbm_origin;
    reg.set_flag("GHT_HBM_BUDGET", "96G");
    b = resolve_budgets(caps, reg);
    EXPECT_EQ(b.hbm, 96 * GiB);
    EXPECT_NE(b.hbm_origin.find("(flag)"), std::string::npos);
  }
  {
    const auto reg = registry_with({"GHT_HOST_BUDGET=10%"});
    EXPECT_THROW((void)resolve_budgets(Capacities{"none", 0, 0, 0, 0}, reg), config_error);
  }
  {
    const auto reg = registry_with({"GHT_POLICY=static", "GHT_PLACE=grad=hbm", "GHT_STAGING_BYTES=1MiB",
                                    "GHT_ASSUMED_TFLOPS=300", "GHT_ASSUMED_HEAD_TFLOPS=650"});
    const PlanOptions o = plan_options_from_config(reg, gh200_numbers(), caps, 1e15, 6.5e14);
    EXPECT_EQ(o.head_flops, 6.5e14);
    EXPECT_EQ(o.head_tflops, 650);
    EXPECT_DOUBLE_EQ(o.head_seconds(), 1.0);
    EXPECT_EQ(o.policy, Policy::static_rules);
    EXPECT_EQ(o.place, "grad=hbm");
    EXPECT_EQ(o.stream_staging_bytes, 2 * MiB);
    EXPECT_EQ(o.assumed_tflops, 300);
    EXPECT_EQ(o.step_flops, 1e15);
  }
  {
    // A PlanOptions built in code (tests, tools) assumes the rates the registry defaults to.
    const PlanOptions from_registry = plan_options_from_config(registry_with({}), gh200_numbers(), caps, 1e15, 0);
    const PlanOptions in_code;
    EXPECT_EQ(in_code.assumed_tflops, from_registry.assumed_tflops);
    EXPECT_EQ(in_code.backward_ratio, from_registry.backward_ratio);
    EXPECT_EQ(in_code.head_tflops, from_registry.head_tflops);
  }
  ASSERT_TRUE(nominal_capacities("gh200").has_value());
  EXPECT_EQ(nominal_capacities("gh200")->host_total, 480'000'000'000ULL);
  EXPECT_FALSE(nominal_capacities("measured").has_value());
}

}  // namespace
// ---- the update split's assignment (GHT_OPTIMIZER=split) ---------------------------------------

TEST(UpdateSplitAssignment, PrefixSharesFollowTheTargetAndTheEndsAreExact) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<std::uint64_t> size(1, 5'000'000);
  std::vector<std::uint64_t> params(300);
  for (auto& p : params) p = size(rng);
  const std::uint64_t largest = *std::max_element(params.begin(), params.end());
  for (double f : {0.0, 0.088, 0.25, 0.5, 0.9, 1.0}) {
    SCOPED_TRACE("share " + std::to_string(f));
    const std::vector<bool> cpu = assign_update_split(params, f);
    ASSERT_EQ(cpu.size(), params.size());
    double total = 0, on_cpu = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      total += static_cast<double>(params[i]);
      if (cpu[i]) on_cpu += static_cast<double>(params[i]);
      // Error diffusion: every prefix is within half the largest region of its target.
      EXPECT_LE(std::abs(on_cpu - f * total), 0.5 * static_cast<double>(largest) + 1e-6) << "prefix " << i;
    }
    if (f == 0.0) {
      EXPECT_EQ(on_cpu, 0.0);
    }
    if (f == 1.0) {
      EXPECT_EQ(on_cpu, total);
    }
  }
  // One region larger than the share stays on the link; ties go to the link too.
  EXPECT_EQ(assign_update_split({100}, 0.4), std::vector<bool>{false});
  EXPECT_EQ(assign_update_split({100}, 0.5), std::vector<bool>{false});
  EXPECT_EQ(assign_update_split({100}, 0.6), std::vector<bool>{true});
  EXPECT_EQ(assign_update_split({10, 10, 10, 10}, 0.5), (std::vector<bool>{false, true, false, true}));
  EXPECT_TRUE(assign_update_split({}, 0.3).empty());
  EXPECT_THROW((void)assign_update_split({1}, 1.5), ght::logic_error);
}

}  // namespace ght::tier
