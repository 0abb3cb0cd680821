// The MoE model as regions, and the plan scenarios of issue 4: seed-21b on gh200 with 96 GB and
// 141 GB of HBM, tiny on every profile, bench-h200 on pcie5 with GHT_HBM_BUDGET=40G.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "common/registry.hpp"
#include "tier/config.hpp"
#include "tier/error.hpp"
#include "tier/link.hpp"
#include "tier/plan.hpp"
#include "trainer/regions.hpp"

namespace ght::trainer {
namespace {

using tier::Plan;
using tier::Region;

std::map<TensorClass, std::uint64_t> bytes_by_class(const std::vector<Region>& rs) {
  std::map<TensorClass, std::uint64_t> m;
  for (const auto& r : rs) m[r.cls] += r.bytes;
  return m;
}

TEST(ModelRegions, BytesMatchTheParameterCounts) {
  for (const auto& name : preset_names()) {
    const ModelConfig c = preset(name);
    const auto rs = model_regions(c);
    tier::validate_regions(rs);
    const auto m = bytes_by_class(rs);
    const auto P = static_cast<std::uint64_t>(c.total_params());
    EXPECT_EQ(m.at(TensorClass::weight), 2 * P) << name;
    EXPECT_EQ(m.at(TensorClass::grad), 4 * P) << name;  // fp32, as the CUDA trainer accumulates
    EXPECT_EQ(m.at(TensorClass::master), 4 * P) << name;
    EXPECT_EQ(m.at(TensorClass::adam_m), 4 * P) << name;
    EXPECT_EQ(m.at(TensorClass::adam_v), 4 * P) << name;
    const auto act = activation_sizes(c);
    EXPECT_EQ(m.at(TensorClass::activation), act.keep_per_layer * static_cast<std::uint64_t>(c.layers));
    EXPECT_EQ(m.at(TensorClass::other), act.workspace);
    // Region count: embed + final norm + per layer (attn + experts) x 5 classes + activations.
    const std::size_t groups = 2 + static_cast<std::size_t>(c.layers) * (1 + c.experts);
    EXPECT_EQ(rs.size(), groups * 5 + static_cast<std::size_t>(c.layers) + 1) << name;
  }
}

TEST(ModelRegions, Bf16StateSizesMAndVAtTwoBytes) {
  const ModelConfig c = preset("bench-h200");
  const auto P = static_cast<std::uint64_t>(c.total_params());
  const auto fp32 = bytes_by_class(model_regions(c));
  ght::test::ScopedFlag bf16("GHT_OPT_STATE", "bf16");
  const auto rs = model_regions(c);
  tier::validate_regions(rs);
  const auto m = bytes_by_class(rs);
  EXPECT_EQ(m.at(TensorClass::master), 4 * P);
  EXPECT_EQ(m.at(TensorClass::adam_m), 2 * P);
  EXPECT_EQ(m.at(TensorClass::adam_v), 2 * P);
  EXPECT_EQ(m.at(TensorClass::weight), fp32.at(TensorClass::weight));
  EXPECT_EQ(m.at(TensorClass::grad), fp32.at(TensorClass::grad));
  // The optimizer's traffic follows the bytes: each moment read and written once per step.
  for (const Region& r : rs) {
    if (r.cls != TensorClass::adam_m && r.cls != TensorClass::adam_v) continue;
    ASSERT_EQ(r.access.size(), 1u) << r.name;
    EXPECT_EQ(r.access[0].gpu_read_bytes, static_cast<double>(r.bytes)) << r.name;
    EXPECT_EQ(r.access[0].gpu_write_bytes, static_cast<double>(r.bytes)) << r.name;
  }
  // The dma slots hold 8 bytes per parameter instead of 12.
  ght::test::ScopedFlag dma("GHT_OPT_LINK_MODE", "dma");
  tier::PlanOptions with_bf16, with_fp32;
  add_trainer_reservations(with_bf16, c);
  {
    ght::test::ScopedFlag back("GHT_OPT_STATE", "fp32");
    add_trainer_reservations(with_fp32, c);
  }
  EXPECT_GT(with_fp32.host_state_hbm_bytes, 0u);
  EXPECT_EQ(3 * with_bf16.host_state_hbm_bytes, 2 * with_fp32.host_state_hbm_bytes);
}

// ZeRO-1: one of N ranks holds ceil(params / N) of every group's master, m and v, and the
// optimizer moves only those; weights, gradients and activations stay whole.
TEST(ModelRegions, RanksShardTheStateOnly) {
  const ModelConfig c = preset("seed-21b");
  const auto one = model_regions(c);
  for (int n : {2, 3, 8}) {
    const auto rs = model_regions(c, {}, n);
    ASSERT_EQ(rs.size(), one.size());
    for (std::size_t i = 0; i < rs.size(); ++i) {
      const Region& a = one[i];
      const Region& b = rs[i];
      ASSERT_EQ(a.name, b.name);
      const bool state = a.cls == TensorClass::master || a.cls == TensorClass::adam_m || a.cls == TensorClass::adam_v;
      if (state) {
        const std::uint64_t elem = 4;  // fp32 master; m and v are fp32 by default
        const std::uint64_t params = a.bytes / elem;
        EXPECT_EQ(b.bytes, elem * ((params + n - 1) / n)) << b.name << " on " << n << " ranks";
        ASSERT_EQ(b.access.size(), 1u);
        EXPECT_NEAR(b.access[0].gpu_read_bytes, a.access[0].gpu_read_bytes / n, 1e-6 * a.access[0].gpu_read_bytes);
      } else {
        EXPECT_EQ(b.bytes, a.bytes) << b.name;
      }
      if (a.cls == TensorClass::grad) {
        EXPECT_TRUE(a.host_allowed);
        EXPECT_FALSE(b.host_allowed) << b.name << ": gradients are reduced in HBM";
      }
    }
  }
  EXPECT_THROW((void)model_regions(c, {}, 0), ght::logic_error);
}

TEST(ModelRegions, Seed21bShape) {
  const ModelConfig c = preset("seed-21b");
  const auto rs = model_regions(c);
  const auto act = activation_sizes(c);
  // Per token and layer, what CudaMoEModel saves for backward (d 4096, 40 q / 8 kv heads of 128,
  // 64 experts, top-4 of 800): the layer input, ln1, h_mid, ln2 (2d each, bf16), two rstds,
  // qkv (2 x 7168), q/k (2 x 6144), q and k rstd (4 x 40, 4 x 8), attention out (2 x 5120), lse
  // (4 x 40), router logits and probs (8 x 64), and per routed row 4 int/float words, gate_up,
  // act (6 x 800) and the expert output (2 x 4096); plus the 65 expert offsets per layer.
  const std::uint64_t per_token = 2 * 4 * 4096 + 8 + 2 * 7168 + 2 * 6144 + 4 * 40 + 4 * 8 + 2 * 5120 + 4 * 40 +
                                  8 * 64 + 4 * (16 + 6 * 800 + 2 * 4096);
  EXPECT_EQ(act.keep_per_layer, per_token * 4096 + 4 * 65);
  EXPECT_EQ(act.checkpoint_per_layer, 2ULL * 4096 * 4096);
  for (const auto& r : rs) {
    if (r.name == "layer7.expert12.weight") {
      EXPECT_EQ(r.bytes, 2ULL * 3 * 4096 * 800);
      EXPECT_DOUBLE_EQ(r.routing_frequency, 4.0 / 64);
      EXPECT_FALSE(r.host_allowed);
      EXPECT_EQ(r.layer, 7);
      EXPECT_EQ(r.expert, 12);
    }
    if (r.name == "layer7.attn.weight") {
      EXPECT_FALSE(r.host_allowed);
    }
    if (r.name == "layer7.attn.grad") {
      ASSERT_TRUE(r.host_bytes.has_value());
      EXPECT_EQ(*r.host_bytes, r.bytes);          // fp32 in HBM and on the host
      EXPECT_EQ(r.hbm_bytes_on_host, r.bytes / 2);  // streamed: the bf16 micro-batch gradient
      ASSERT_TRUE(r.host_access.has_value());
      // Accumulator traffic per step: (2 GA + 4 (GA-1)) B read and 4 GA B written per param,
      // the last micro-batch's share in a window of the backward left below layer 7.
      const double p = static_cast<double>(r.bytes) / 4;
      const auto& h = *r.host_access;
      ASSERT_EQ(h.size(), 6u);
      EXPECT_DOUBLE_EQ(h[1].cpu_read_bytes + h[3].cpu_read_bytes, p * (2 * 8 + 4 * 7));
      EXPECT_DOUBLE_EQ(h[1].cpu_write_bytes + h[3].cpu_write_bytes, p * 4 * 8);
      EXPECT_DOUBLE_EQ(h[0].times_per_step * h[0].gpu_write_bytes + h[2].gpu_write_bytes, 8 * 2 * p);
      EXPECT_DOUBLE_EQ(h[2].window_fraction, (2.25 / 3.25) * (7.0 / 30.0) / 8);  // rho 2.25: backward 2.25/3.25
      EXPECT_DOUBLE_EQ(h[4].gpu_read_bytes, 4 * p);
      EXPECT_EQ(h[4].gpu_path, tier::GpuPath::kernel);
      // The accumulator's read and write in the backward, 8 micro-batches, half exposed
      // (GHT_ASSUMED_ACC_EXPOSED): the same access in HBM and streamed.
      EXPECT_DOUBLE_EQ(h[5].times_per_step * h[5].backward_hbm_bytes, 8 * 2 * 4 * p);
      EXPECT_DOUBLE_EQ(h[5].backward_exposed, 0.5);
      EXPECT_EQ(h[5].gpu_read_bytes + h[5].gpu_write_bytes, 0.0);  // nothing crosses the link
      EXPECT_TRUE(std::find(r.access.begin(), r.access.end(), h[5]) != r.access.end());
    }
    if (r.name == "embed.grad") {
      EXPECT_FALSE(r.host_access->at(2).overlappable);  // finished last: critical path
      // The LM head's dW GEMM passes over it once per chunk (one of 4,096 rows), unhidden.
      const tier::Access& pass = r.host_access->at(5);
      EXPECT_EQ(pass.backward_exposed, kLmHeadAccumulatorExposed);
      EXPECT_DOUBLE_EQ(pass.times_per_step, 8.0);
      EXPECT_DOUBLE_EQ(pass.backward_hbm_bytes, 2.0 * static_cast<double>(r.bytes));
    }
  }
  EXPECT_DOUBLE_EQ(model_step_flops(c), c.flops_per_token() * 4096 * 8);

  Routing bad(3);
  EXPECT_THROW((void)model_regions(c, bad), ght::logic_error);
  Routing skew(c.layers, std::vector<double>(c.experts, 0.01));
  skew[2][5] = 0.9;
  const auto rs2 = model_regions(c, skew);
  for (const auto& r : rs2) {
    if (r.layer == 2 && r.expert == 5) {
      EXPECT_DOUBLE_EQ(r.routing_frequency, 0.9);
    }
  }
}

// GHT_GRAD_ACCUM=bf16: the HBM gradients the CUDA trainer accumulates into are bf16, and the plan
// counts 2 B/param for them (the host accumulator of streamed gradients stays fp32).
TEST(ModelRegions, Bf16GradientAccumulationHalvesTheGradientBytes) {
  const ModelConfig c = preset("small");
  const auto P = static_cast<std::uint64_t>(c.total_params());
  EXPECT_EQ(hbm_grad_type(), optimizer::GradType::fp32);  // the default
  const ght::test::ScopedFlag flag("GHT_GRAD_ACCUM", "bf16");
  EXPECT_EQ(hbm_grad_type(), optimizer::GradType::bf16);
  const auto rs = model_regions(c);
  EXPECT_EQ(bytes_by_class(rs).at(TensorClass::grad), 2 * P);
  for (const auto& r : rs) {
    if (r.cls == TensorClass::grad) {
      EXPECT_EQ(r.host_bytes.value_or(0), 2 * r.bytes) << r.name;
    }
  }
}

// The update's window: exact, the next step's first forward (1 / (1 + rho) of a micro-batch);
// with a speculation arena (auto by default), the last backward too; delayed, the stale
// micro-batches.
TEST(ModelRegions, UpdateWindowFollowsTheSchedule) {
  EXPECT_DOUBLE_EQ(backward_share(), 2.25 / 3.25);  // GHT_ASSUMED_BWD_RATIO's default
  EXPECT_TRUE(speculation_auto());  // GHT_OPT_SPECULATE's default: ght train sizes the arena
  EXPECT_TRUE(speculating_updates());
  EXPECT_DOUBLE_EQ(update_window_fraction(16), 1.0 / 16);
  {
    const ght::test::ScopedFlag off("GHT_OPT_SPECULATE", "0");
    EXPECT_FALSE(speculation_auto());
    EXPECT_FALSE(speculating_updates());
    EXPECT_DOUBLE_EQ(update_window_fraction(16), (1.0 / 3.25) / 16);
    {
      const ght::test::ScopedFlag ratio("GHT_ASSUMED_BWD_RATIO", "3");
      EXPECT_DOUBLE_EQ(update_window_fraction(16), 0.25 / 16);
    }
    const ght::test::ScopedFlag host("GHT_OPT_SPECULATE_HOST", "10%");
    EXPECT_TRUE(speculating_updates());
  }
  {
    const ght::test::ScopedFlag arena("GHT_OPT_SPECULATE", "8G");
    EXPECT_FALSE(speculation_auto());
    EXPECT_TRUE(speculating_updates());
    EXPECT_DOUBLE_EQ(update_window_fraction(16), 1.0 / 16);
  }
  const ght::test::ScopedFlag delay("GHT_OPT_DELAY", "1");
  const ght::test::ScopedFlag micro("GHT_OPT_DELAY_MICRO", "4");
  EXPECT_DOUBLE_EQ(update_window_fraction(16), 4.0 / 16);
  // The regions carry it on every optimizer access.
  ModelConfig c = preset("tiny");
  c.grad_accum = 16;
  for (const Region& r : model_regions(c)) {
    for (const tier::Access& a : r.access) {
      if (a.what == "optimizer") {
        EXPECT_DOUBLE_EQ(a.window_fraction, 4.0 / 16) << r.name;
      }
    }
  }
}

// GHT_OPT_SPECULATE's auto: the parameters the last micro-batch's backward hides over the link, at
// their undo bytes; every parameter and an eighth of the HBM budget at most; nothing without a link.
TEST(ModelRegions, AutoSpeculationArenaHoldsWhatTheLastBackwardHides) {
  ModelConfig c = preset("bench-h200");
  c.grad_accum = 64;
  tier::PlanOptions o;
  o.link = tier::builtin_profile("pcie5");
  o.link.h2d_bps = 50e9;
  o.link.d2h_bps = 48e9;
  o.step_flops = 2e15;
  o.assumed_tflops = 500;
  o.backward_ratio = 2.4;
  o.head_flops = 72e12;
  o.head_tflops = 720;
  o.budgets.hbm = std::uint64_t{1} << 40;
  // (2e15 / 500e12 x 2.4 / 3.4 + 0.1 s) / 64 of backward, 48 GB/s / 12 B per parameter (fp32 m/v).
  const double backward = (4.0 * 2.4 / 3.4 + 0.1) / 64;
  const double params = backward * 48e9 / 12;
  EXPECT_NEAR(static_cast<double>(auto_speculation_bytes(c, o)), params * 14, 64.0);
  {
    const ght::test::ScopedFlag q8("GHT_OPT_STATE", "q8");
    const double s = optimizer::state_bytes_per_param(optimizer::StateType::q8);
    EXPECT_NEAR(static_cast<double>(auto_speculation_bytes(c, o)), backward * 48e9 / s * (s + 2), 64.0);
  }
  c.grad_accum = 1;  // one long backward hides every parameter
  o.step_flops = 2e18;
  EXPECT_EQ(auto_speculation_bytes(c, o), static_cast<std::uint64_t>(static_cast<double>(c.total_params()) * 14));
  o.budgets.hbm = std::uint64_t{137} << 30;  // ... but not more than an eighth of HBM
  EXPECT_EQ(auto_speculation_bytes(c, o), static_cast<std::uint64_t>(137.0 * (1 << 30) / 8));
  o.link = tier::builtin_profile("none");
  EXPECT_EQ(auto_speculation_bytes(c, o), 0u);
}

// ---- scenarios --------------------------------------------------------------------------------

using ght::test::registry_with;

// What `ght plan --model NAME --profile PROFILE [--hbm X]` plans, through the same calls.
Plan plan_for(const std::string& model, const std::string& profile, std::vector<std::string> env) {
  const ModelConfig c = preset(model);
  const auto reg = registry_with(std::move(env));
  const tier::LinkNumbers link = tier::builtin_profile(profile);
  const auto caps = tier::nominal_capacities(profile);
  EXPECT_TRUE(caps.has_value());
  const auto options = tier::plan_options_from_config(reg, link, *caps, model_step_flops(c), model_head_flops(c));
  return plan_model(c, options).plan;
}

struct Census {
  std::map<std::pair<TensorClass, TierKind>, std::size_t> tiers;
  std::map<std::pair<TensorClass, tier::Mode>, std::size_t> modes;
  std::map<TensorClass, std::size_t> total;
};
Census census(const Plan& p) {
  Census c;
  for (std::size_t i = 0; i < p.regions().size(); ++i) {
    const auto cls = p.regions()[i].cls;
    ++c.tiers[{cls, p.decisions()[i].tier}];
    ++c.modes[{cls, p.decisions()[i].mode}];
    ++c.total[cls];
  }
  return c;
}

void expect_within_budgets(const Plan& p) {
  EXPECT_LE(p.prediction().hbm_bytes, p.options().budgets.hbm);
  EXPECT_LE(p.prediction().host_bytes, p.options().budgets.host);
  EXPECT_TRUE(std::isfinite(p.prediction().step_seconds));
}

TEST(PlanScenarios, Seed21bOnGh200With96GB) {
  const Plan p = plan_for("seed-21b", "gh200", {"GHT_HBM_BUDGET=96G"});
  SCOPED_TRACE(p.format_table(true));
  expect_within_budgets(p);
  Census c = census(p);
  using ght::TensorClass;
  EXPECT_EQ((c.tiers[{TensorClass::weight, TierKind::hbm}]), c.total[TensorClass::weight]);
  for (auto cls : {TensorClass::master, TensorClass::adam_m, TensorClass::adam_v}) {
    EXPECT_EQ((c.tiers[{cls, TierKind::host}]), c.total[cls]) << to_string(cls);
  }
  // bf16 grads do not fit beside the weights: they stream to the host accumulator.
  EXPECT_GT((c.modes[{TensorClass::grad, tier::Mode::stream}]), 0u);
  EXPECT_NE(p.mode_summary(TensorClass::grad), "accumulate");
  EXPECT_EQ(p.tier_for("layer3.expert5.grad", TensorClass::grad) == TierKind::host,
            p.find("layer3.expert5.grad")->mode == tier::Mode::stream);
}

TEST(PlanScenarios, Bf16StateShrinksTheHostStateAndItsLinkTime) {
  const Plan fp32 = plan_for("seed-21b", "gh200", {"GHT_HBM_BUDGET=96G"});
  ght::test::ScopedFlag bf16("GHT_OPT_STATE", "bf16");
  const Plan p = plan_for("seed-21b", "gh200", {"GHT_HBM_BUDGET=96G"});
  SCOPED_TRACE(p.format_table(true));
  expect_within_budgets(p);
  auto state_bytes = [](const Plan& plan) {
    std::uint64_t b = 0;
    for (const Region& r : plan.regions()) {
      if (r.cls == TensorClass::master || r.cls == TensorClass::adam_m || r.cls == TensorClass::adam_v) b += r.bytes;
    }
    return b;
  };
  const auto P = static_cast<std::uint64_t>(preset("seed-21b").total_params());
  EXPECT_EQ(state_bytes(fp32), 12 * P);
  EXPECT_EQ(state_bytes(p), 8 * P);
  EXPECT_LT(p.prediction().optimizer_link_seconds, fp32.prediction().optimizer_link_seconds);
  EXPECT_LE(p.prediction().step_seconds, fp32.prediction().step_seconds);
}

// q8 m and v: 260 bytes per 256 parameters each (whole block records per group), below bf16's
// 4, and less optimizer link time than bf16 state.
TEST(PlanScenarios, Q8StateShrinksTheHostStateBelowBf16) {
  auto state_of = [](const Plan& plan) {
    std::uint64_t b = 0;
    for (const Region& r : plan.regions()) {
      if (r.cls == TensorClass::master || r.cls == TensorClass::adam_m || r.cls == TensorClass::adam_v) b += r.bytes;
    }
    return b;
  };
  std::optional<Plan> bf16;
  {
    ght::test::ScopedFlag st("GHT_OPT_STATE", "bf16");
    bf16 = plan_for("seed-21b", "gh200", {"GHT_HBM_BUDGET=96G"});
  }
  ght::test::ScopedFlag st("GHT_OPT_STATE", "q8");
  const Plan p = plan_for("seed-21b", "gh200", {"GHT_HBM_BUDGET=96G"});
  SCOPED_TRACE(p.format_table(true));
  expect_within_budgets(p);
  const auto P = static_cast<double>(preset("seed-21b").total_params());
  EXPECT_NEAR(static_cast<double>(state_of(p)) / P, 4 + 2 * 260.0 / 256, 1e-4);
  EXPECT_LT(p.prediction().optimizer_link_seconds, bf16->prediction().optimizer_link_seconds);
  EXPECT_LE(p.prediction().step_seconds, bf16->prediction().step_seconds);
}

// Every layer gradient accumulates in HBM. The embedding's (the LM head's) may stream to the host:
// it is the largest, and the whole micro-batch's LM-head chunk is worth more of HBM than it.
TEST(PlanScenarios, Seed21bOnGh200With141GBKeepsGradsInHbm) {
  const Plan p = plan_for("seed-21b", "gh200", {"GHT_HBM_BUDGET=141G"});
  SCOPED_TRACE(p.format_table(true));
  expect_within_budgets(p);
  for (std::size_t i = 0; i < p.regions().size(); ++i) {
    const Region& r = p.regions()[i];
    if (r.cls != TensorClass::grad || r.name == "embed.grad") continue;
    EXPECT_EQ(p.decisions()[i].mode, tier::Mode::accumulate) << r.name;
  }
  Census c = census(p);
  EXPECT_EQ((c.tiers[{TensorClass::weight, TierKind::hbm}]), c.total[TensorClass::weight]);
  // More HBM: never slower than the 96 GB plan.
  const Plan small = plan_for("seed-21b", "gh200", {"GHT_HBM_BUDGET=96G"});
  EXPECT_LE(p.prediction().step_seconds, small.prediction().step_seconds);
}

TEST(PlanScenarios, TinyFitsInHbmOnEveryProfile) {
  for (const char* profile : {"gh200", "pcie5"}) {
    const Plan p = plan_for("tiny", profile, {});
    SCOPED_TRACE(std::string(profile) + "\n" + p.format_table(true));
    expect_within_budgets(p);
    for (std::size_t i = 0; i < p.regions().size(); ++i) {
      EXPECT_EQ(p.decisions()[i].tier, TierKind::hbm) << p.regions()[i].name << ": " << p.decisions()[i].reason;
      EXPECT_NE(p.decisions()[i].mode, tier::Mode::recompute) << p.regions()[i].name;
    }
    // Nothing crosses the link; what is exposed is the update of the state in HBM: per parameter
    // it reads the fp32 gradient (4 B), reads and writes master, m and v (24 B) and writes the
    // bf16 weight (2 B), at 0.8 of the profile's HBM bandwidth (GHT_ASSUMED_HBM_UPDATE).
    EXPECT_DOUBLE_EQ(p.prediction().h2d_bytes + p.prediction().d2h_bytes, 0.0);
    double params = 0;
    for (const auto& r : p.regions()) {
      if (r.cls == TensorClass::weight) params += static_cast<double>(r.bytes) / 2;
    }
    const double update = 30 * params / (0.8 * p.options().link.hbm_bps);
    EXPECT_NEAR(p.prediction().hbm_pass_seconds, update, 1e-3 * update);
    EXPECT_DOUBLE_EQ(p.prediction().exposed_seconds, p.prediction().hbm_pass_seconds);
    EXPECT_DOUBLE_EQ(p.prediction().step_seconds, p.prediction().compute_seconds + p.prediction().hbm_pass_seconds);
    // q8 m and v: 2 x 1.016 B read and written in place of 2 x 4; the pass is compute-bound at
    // GHT_ASSUMED_Q8_UPDATE = 83 Gparam/s unless 0.8 of the bandwidth is slower still.
    const ght::test::ScopedFlag q8("GHT_OPT_STATE", "q8");
    const Plan q = plan_for("tiny", profile, {"GHT_OPT_STATE=q8"});
    const double q8_bytes = 4 + 2 * optimizer::state_bytes_per_param(optimizer::StateType::q8) + 2;
    const double q8_update = std::max(params / 83e9, q8_bytes * params / (0.8 * q.options().link.hbm_bps));
    EXPECT_NEAR(q.prediction().hbm_pass_seconds, q8_update, 0.02 * q8_update);
    EXPECT_NEAR(q8_update, params / 83e9, 1e-12) << "both profiles' HBM outruns the q8 kernel";
    // A slower q8 kernel is charged as such.
    const ght::test::ScopedFlag slow("GHT_ASSUMED_Q8_UPDATE", "41.5");
    const Plan q_slow = plan_for("tiny", profile, {"GHT_OPT_STATE=q8", "GHT_ASSUMED_Q8_UPDATE=41.5"});
    EXPECT_NEAR(q_slow.prediction().hbm_pass_seconds, 2 * q8_update, 0.04 * q8_update);
  }
}

TEST(PlanScenarios, BenchH200OnPcie5With40GIsAValidMixedPlan) {
  const Plan p = plan_for("bench-h200", "pcie5", {"GHT_HBM_BUDGET=40G"});
  SCOPED_TRACE(p.format_table(true));
  expect_within_budgets(p);
  EXPECT_EQ(p.options().budgets.hbm, 40ULL << 30);
  std::set<TierKind> used;
  for (const auto& d : p.decisions()) used.insert(d.tier);
  EXPECT_EQ(used.size(), 2u) << "a mixed plan uses both tiers";
  Census c = census(p);
  EXPECT_EQ((c.tiers[{TensorClass::weight, TierKind::hbm}]), c.total[TensorClass::weight]);
  EXPECT_GT(p.prediction().hbm_bytes, (40ULL << 30) * 9 / 10) << "HBM is filled before offloading";
  // The plan survives its JSON.
  const Plan q = Plan::from_json(p.to_json(), "bench.json");
  EXPECT_TRUE(q == p);
}

// ---- the LM-head chunk (bench/NOTES.md, "LM head (issue 13)") ----

TEST(LmHeadChunk, WholeMicroBatchWhenItFitsElseEqualChunksUnderTheBudget) {
  const std::int64_t V = 151936;
  // bench-h200: 4096 rows x V bf16 = 1.16 GiB < 2 GiB, one chunk.
  EXPECT_EQ(default_ce_chunk_rows(4096, V), 4096);
  EXPECT_EQ(default_ce_chunk_rows(1000, V), 1000);
  // 16k rows: 2 GiB holds 7067 rows, 7040 as a multiple of 64, so 3 equal chunks of 5504 rows
  // would fit; the default rounds the count up to 4 (4096 rows each).
  EXPECT_EQ(ce_chunk_rows_within(16384, V, kLmHeadLogitsBudget), 5504);
  EXPECT_EQ(default_ce_chunk_rows(16384, V), 4096);
  // 2 chunks stay 2; 5 become 8; a count already a power of two is kept.
  EXPECT_EQ(default_ce_chunk_rows(12000, V), 6016);
  EXPECT_EQ(default_ce_chunk_rows(30000, V), 3776);
  EXPECT_EQ(default_ce_chunk_rows(28160, V), 7040);
  for (std::int64_t n : {7068, 9999, 16384, 20000, 30000, 65536, 100000}) {  // all over the budget
    const std::int64_t r = default_ce_chunk_rows(n, V);
    const std::int64_t chunks = (n + r - 1) / r;
    SCOPED_TRACE(::testing::Message() << "n=" << n << " rows=" << r);
    EXPECT_EQ(chunks & (chunks - 1), 0);  // a power of two
    EXPECT_EQ(r % 64, 0);
    EXPECT_LE(2 * static_cast<std::uint64_t>(r) * static_cast<std::uint64_t>(V), kLmHeadLogitsBudget);
  }
  // The first fixed chunk: 832 rows (5 chunks of a 4096-row micro-batch).
  EXPECT_EQ(ce_chunk_rows_within(4096, V, kLmHeadSmallLogits), 832);
  for (std::int64_t n : {1, 63, 64, 65, 777, 4096, 7040, 7041, 16384, 100000}) {
    for (std::int64_t v : {1, 256, 517, 32000, 151936}) {
      for (std::uint64_t budget : {kLmHeadSmallLogits, kLmHeadLogitsBudget}) {
        const std::int64_t r = ce_chunk_rows_within(n, v, budget);
        SCOPED_TRACE(::testing::Message() << "n=" << n << " v=" << v << " budget=" << budget << " rows=" << r);
        ASSERT_GE(r, 1);
        ASSERT_LE(r, n);
        const std::int64_t chunks = (n + r - 1) / r;
        if (2 * static_cast<std::uint64_t>(n * v) <= budget) {
          EXPECT_EQ(r, n);  // whole
          continue;
        }
        EXPECT_LE(2 * static_cast<std::uint64_t>(r * v), budget);  // within the budget
        // The fewest chunks the budget allows (its rows rounded down to 64), and equal ones: the
        // last chunk is at most 64 rows per chunk short of the others.
        std::int64_t most = static_cast<std::int64_t>(budget / (2 * static_cast<std::uint64_t>(v)));
        if (most >= 64) most = most / 64 * 64;
        EXPECT_EQ(chunks, (n + most - 1) / most);
        EXPECT_GE(n - (chunks - 1) * r, r - 64 * chunks);
        if (most >= 64) {
          EXPECT_EQ(r % 64, 0);
        }
      }
    }
  }
  EXPECT_THROW((void)ce_chunk_rows_within(0, V, kLmHeadLogitsBudget), ght::logic_error);
  EXPECT_THROW((void)ce_chunk_rows_within(8, 0, kLmHeadLogitsBudget), ght::logic_error);
}

TEST(LmHeadChunk, RowsOverrideAndWorkspace) {
  const ModelConfig c = preset("bench-h200");
  const std::uint64_t V = static_cast<std::uint64_t>(c.vocab);
  const auto whole = activation_sizes(c);  // 4096 rows
  const auto small = activation_sizes(c, 832);
  EXPECT_EQ(whole.workspace - small.workspace, (4096 - 832) * V * 2);
  EXPECT_EQ(whole.keep_per_layer, small.keep_per_layer);
  EXPECT_EQ(activation_sizes(c, 1 << 20).workspace, whole.workspace);  // capped at the micro-batch
  ght::test::ScopedFlag rows("GHT_LM_HEAD_ROWS", "1000");
  EXPECT_EQ(default_ce_chunk_rows(4096, c.vocab), 1000);
  EXPECT_EQ(default_ce_chunk_rows(512, c.vocab), 512);
  EXPECT_EQ(activation_sizes(c).workspace, activation_sizes(c, 1000).workspace);
}

// plan_model sizes the chunk: whole where the model fits with room; where the larger chunk would
// displace a region, whichever of the two plans predicts the shorter step (the small chunk passes
// over the head's gradient more often, the larger one moves state out of HBM); a forced
// GHT_LM_HEAD_ROWS as given.
TEST(LmHeadChunk, PlanModelTakesTheChunkWithTheShorterPredictedStep) {
  {
    const Plan p = plan_for("bench-h200", "pcie5", {"GHT_HBM_BUDGET=139G", "GHT_PLACE=master=hbm,adam_*=hbm"});
    for (std::size_t i = 0; i < p.decisions().size(); ++i) {
      EXPECT_EQ(p.decisions()[i].tier, TierKind::hbm) << p.regions()[i].name << ": " << p.decisions()[i].reason;
    }
    const ModelConfig c = preset("bench-h200");
    for (const auto& r : p.regions()) {
      if (r.name == "workspace") {
        EXPECT_EQ(r.bytes, activation_sizes(c, 4096).workspace);
      }
    }
  }
  int took_small = 0, took_wide_moving = 0;
  for (const char* hbm : {"GHT_HBM_BUDGET=40G", "GHT_HBM_BUDGET=96G", "GHT_HBM_BUDGET=70G"}) {
    for (const int micro_batch : {1, 2, 4}) {
      const std::string model = std::string(hbm) == "GHT_HBM_BUDGET=40G" ? "bench-h200" : "seed-21b";
      SCOPED_TRACE(model + " " + hbm + " micro-batch " + std::to_string(micro_batch));
      ModelConfig c = preset(model);
      c.micro_batch = micro_batch;
      const auto reg = registry_with({hbm});
      const std::string profile = model == "bench-h200" ? "pcie5" : "gh200";
      const auto caps = tier::nominal_capacities(profile);
      ASSERT_TRUE(caps.has_value());
      const auto options = tier::plan_options_from_config(reg, tier::builtin_profile(profile), *caps,
                                                          model_step_flops(c), model_head_flops(c));
      const std::int64_t N = 4096 * micro_batch;
      const std::int64_t small = ce_chunk_rows_within(N, c.vocab, kLmHeadSmallLogits);
      const std::int64_t fast = default_ce_chunk_rows(N, c.vocab);
      ASSERT_LT(small, fast);
      std::optional<Plan> plain;
      try {
        plain = tier::make_plan(model_regions(c, {}, 1, small), options);
      } catch (const tier::infeasible_plan&) {
        EXPECT_THROW((void)plan_model(c, options), tier::infeasible_plan);
        continue;
      }
      std::optional<Plan> wide;
      try {
        wide = tier::make_plan(model_regions(c, {}, 1, fast), options);
      } catch (const tier::infeasible_plan&) {
      }
      // Moved: some region's tier or mode differs (plan_model's test; reasons and gains may differ).
      const bool moves = wide && !std::equal(wide->decisions().begin(), wide->decisions().end(),
                                             plain->decisions().begin(), plain->decisions().end(),
                                             [](const tier::Decision& x, const tier::Decision& y) {
                                               return x.tier == y.tier && x.mode == y.mode;
                                             });
      const bool wide_wins = wide && (!moves || wide->prediction().step_seconds < plain->prediction().step_seconds);
      const ModelPlan mp = plan_model(c, options);
      EXPECT_EQ(mp.lm_head_rows, wide_wins ? fast : small);
      EXPECT_TRUE(mp.plan.decisions() == (wide_wins ? wide->decisions() : plain->decisions()));
      EXPECT_TRUE(mp.plan.prediction() == (wide_wins ? wide->prediction() : plain->prediction()));
      ASSERT_FALSE(mp.plan.notes().empty());
      const std::string& note = mp.plan.notes().back();
      EXPECT_NE(note.find("LM head: " + std::to_string(mp.lm_head_rows) + " of " + std::to_string(N) + " rows"),
                std::string::npos)
          << note;
      if (moves) {
        EXPECT_NE(note.find("predicted step"), std::string::npos) << note;
      }
      took_small += wide_wins ? 0 : 1;
      took_wide_moving += wide_wins && moves ? 1 : 0;
      const ght::test::ScopedFlag rows("GHT_LM_HEAD_ROWS", "4096");
      EXPECT_EQ(plan_model(c, options).lm_head_rows, 4096);
    }
  }
  // Both outcomes occur among these tight budgets, so the rule is exercised both ways.
  EXPECT_GT(took_small, 0);
  EXPECT_GT(took_wide_moving, 0);
}

// Each LM-head chunk's dW GEMM reads and writes the whole head gradient (the tied embedding's),
// unhidden: the plan's backward grows by that pass per extra chunk, and nothing else changes.
TEST(LmHeadChunk, EveryChunkPassesOverTheHeadGradientOnce) {
  ModelConfig c = preset("bench-h200");
  c.grad_accum = 16;
  tier::PlanOptions o;
  o.link = tier::builtin_profile("pcie5");
  o.step_flops = model_step_flops(c);
  o.head_flops = model_head_flops(c);
  o.budgets.hbm = std::uint64_t{1} << 40;
  o.budgets.host = std::uint64_t{1} << 40;
  const Plan one = tier::make_plan(model_regions(c, {}, 1, 4096), o);
  const Plan five = tier::make_plan(model_regions(c, {}, 1, 832), o);  // 4 x 832 + 768
  const double gb = static_cast<double>(optimizer::grad_type_size(hbm_grad_type()));
  const double pass = 2.0 * gb * static_cast<double>(c.vocab) * c.d_model / o.link.hbm_bps;
  EXPECT_NEAR(five.prediction().accumulate_seconds - one.prediction().accumulate_seconds,
              16 * 4 * pass * kLmHeadAccumulatorExposed, 1e-9);
  EXPECT_NEAR(five.prediction().forward_seconds, one.prediction().forward_seconds, 1e-12);
  EXPECT_GT(five.prediction().step_seconds, one.prediction().step_seconds);
  // An untied head's gradient takes the passes; the input embedding's scatter takes none.
  c.tied_embeddings = false;
  const auto untied = model_regions(c, {}, 1, 832);
  for (const auto& r : untied) {
    if (r.cls != TensorClass::grad || (r.name != "embed.grad" && r.name != "lm_head.grad")) continue;
    double exposed_passes = 0;
    for (const auto& a : r.access) exposed_passes += a.backward_exposed > 0 ? a.times_per_step : 0;
    EXPECT_DOUBLE_EQ(exposed_passes, r.name == "lm_head.grad" ? 16.0 * 5 : 0.0) << r.name;
  }
}

}  // namespace
}  // namespace ght::trainer
