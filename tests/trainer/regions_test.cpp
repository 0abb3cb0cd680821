// The MoE model as regions, and the plan scenarios of issue 4: seed-21b on gh200 with 96 GB and
// 141 GB of HBM, tiny on every profile, bench-h200 on pcie5 with GHT_HBM_BUDGET=40G.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
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
      ASSERT_EQ(h.size(), 5u);
      EXPECT_DOUBLE_EQ(h[1].cpu_read_bytes + h[3].cpu_read_bytes, p * (2 * 8 + 4 * 7));
      EXPECT_DOUBLE_EQ(h[1].cpu_write_bytes + h[3].cpu_write_bytes, p * 4 * 8);
      EXPECT_DOUBLE_EQ(h[0].times_per_step * h[0].gpu_write_bytes + h[2].gpu_write_bytes, 8 * 2 * p);
      EXPECT_DOUBLE_EQ(h[2].window_fraction, (2.0 / 3.0) * (7.0 / 30.0) / 8);
      EXPECT_DOUBLE_EQ(h[4].gpu_read_bytes, 4 * p);
      EXPECT_EQ(h[4].gpu_path, tier::GpuPath::kernel);
    }
    if (r.name == "embed.grad") {
      EXPECT_FALSE(r.host_access->at(2).overlappable);  // finished last: critical path
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

// ---- scenarios --------------------------------------------------------------------------------

using ght::test::registry_with;

// What `ght plan --model NAME --profile PROFILE [--hbm X]` plans, through the same calls.
Plan plan_for(const std::string& model, const std::string& profile, std::vector<std::string> env) {
  const ModelConfig c = preset(model);
  const auto reg = registry_with(std::move(env));
  const tier::LinkNumbers link = tier::builtin_profile(profile);
  const auto caps = tier::nominal_capacities(profile);
  EXPECT_TRUE(caps.has_value());
  const auto options = tier::plan_options_from_config(reg, link, *caps, model_step_flops(c));
  return tier::make_plan(model_regions(c), options);
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

TEST(PlanScenarios, Seed21bOnGh200With141GBKeepsGradsInHbm) {
  const Plan p = plan_for("seed-21b", "gh200", {"GHT_HBM_BUDGET=141G"});
  SCOPED_TRACE(p.format_table(true));
  expect_within_budgets(p);
  EXPECT_EQ(p.mode_summary(TensorClass::grad), "accumulate");
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
      EXPECT_EQ(p.decisions()[i].tier, TierKind::hbm) << p.regions()[i].name;
      EXPECT_NE(p.decisions()[i].mode, tier::Mode::recompute) << p.regions()[i].name;
    }
    EXPECT_DOUBLE_EQ(p.prediction().exposed_seconds, 0.0);
    EXPECT_DOUBLE_EQ(p.prediction().h2d_bytes + p.prediction().d2h_bytes, 0.0);
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

}  // namespace
}  // namespace ght::trainer
