// The plan decides (trainer/plan_decide.hpp) on three fixed machines, planned on the CPU:
//   h200   an H200 over PCIe 5 with the budgets of a 128 GiB host (ght plan --profile pcie5
//          --hbm 137G --host 112G);
//   gh200  a GH200: 96 GB HBM and 480 GB LPDDR5X over NVLink-C2C (the gh200 profile's nominal
//          memory);
//   pcie24 a 24 GB PCIe GPU in a 64 GiB host.
// The ledger is a fixed test file (GHT_PLAN_LEDGER), so that the choices follow the rules and not
// whatever the repository's ledger measured last.
#include "trainer/plan_decide.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "common/registry.hpp"
#include "tier/budget.hpp"
#include "tier/config.hpp"
#include "tier/detail/topology_detail.hpp"
#include "tier/link.hpp"
#include "tier/topology.hpp"
#include "trainer/fp8_experts.hpp"

namespace ght::trainer {
namespace {

namespace fs = std::filesystem;
using ght::test::registry_with;

// q8 and bf16 m/v and bf16 accumulation inside the noise; the delay outside it.
constexpr const char* kLedger = R"({"format": 1, "verdicts": [
 {"option": "GHT_OPT_STATE", "value": "q8", "model": "small", "params": 7.6e6, "steps": 2000, "lr": 2e-3,
  "exact_seeds": 3, "eval_loss_delta": 0.001, "noise_band": 0.006, "extra_tokens": 0.01, "within_noise": true,
  "measured": "2026-12-05", "source": "test"},
 {"option": "GHT_OPT_STATE", "value": "bf16", "model": "small", "params": 7.6e6, "steps": 2000, "lr": 2e-3,
  "exact_seeds": 3, "eval_loss_delta": 0.0, "noise_band": 0.006, "extra_tokens": 0.0, "within_noise": true,
  "measured": "2026-12-05", "source": "test"},
 {"option": "GHT_GRAD_ACCUM", "value": "bf16", "model": "small", "params": 7.6e6, "steps": 2000, "lr": 2e-3,
  "exact_seeds": 3, "eval_loss_delta": 0.002, "noise_band": 0.006, "extra_tokens": 0.02, "within_noise": true,
  "measured": "2026-12-05", "source": "test"},
 {"option": "GHT_OPT_DELAY", "value": "on", "model": "small", "params": 7.6e6, "steps": 2000, "lr": 2e-3,
  "exact_seeds": 3, "eval_loss_delta": 0.15, "noise_band": 0.006, "within_noise": false,
  "measured": "2026-12-05", "source": "test"}]})";

struct Machine {
  std::string profile;
  std::vector<std::string> env;  // budgets
};
const Machine kH200{"pcie5", {"GHT_HBM_BUDGET=137G", "GHT_HOST_BUDGET=112G"}};
const Machine kGh200{"gh200", {}};
const Machine kPcie24{"pcie5", {"GHT_HBM_BUDGET=22G", "GHT_HOST_BUDGET=58G"}};

class PlanDecide : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = config::cfg();
    ledger_ = fs::temp_directory_path() / ("ght_plan_decide_ledger_" + std::to_string(::getpid()) + ".json");
    std::ofstream(ledger_) << kLedger;
  }
  void TearDown() override {
    config::cfg() = saved_;
    fs::remove(ledger_);
  }
  // The process-wide registry as `ght plan` would load it with these variables and the machine's.
  tier::PlanOptions machine(const Machine& m, const ModelConfig& c, std::vector<std::string> env) {
    env.insert(env.end(), m.env.begin(), m.env.end());
    env.push_back("GHT_LINK_PROFILE=" + m.profile);
    env.push_back("GHT_PLAN_LEDGER=" + ledger_.string());
    config::cfg() = registry_with(env);
    const auto caps = tier::nominal_capacities(m.profile);
    return tier::plan_options_from_config(config::cfg(), tier::builtin_profile(m.profile),
                                          caps ? *caps : tier::machine_capacities(), model_step_flops(c),
                                          model_head_flops(c));
  }
  static std::string chosen(const tier::SearchResult& r) {
    return r.chosen ? r.best().changes(r.dimensions) : std::string("(refused)");
  }

  config::Registry saved_;
  fs::path ledger_;
};

// The LM head's dW passes over its (tied) gradient per step, as model_regions counts them: one per
// chunk of each micro-batch, unhidden (kLmHeadAccumulatorExposed).
double head_pass_seconds(const ModelConfig& shape, std::int64_t rows, double grad_bytes, const tier::PlanOptions& o) {
  const std::int64_t N = static_cast<std::int64_t>(shape.seq_len) * shape.micro_batch;
  const auto chunks = static_cast<double>((N + rows - 1) / rows);
  return shape.grad_accum * chunks * 2 * grad_bytes * static_cast<double>(shape.embedding_params()) *
         kLmHeadAccumulatorExposed / o.link.hbm_bps;
}

ModelConfig at_tokens(const char* name, std::int64_t tokens) {
  ModelConfig c = preset(name);
  c.grad_accum = static_cast<int>(tokens / (static_cast<std::int64_t>(c.seq_len) * c.micro_batch));
  return c;
}

TEST_F(PlanDecide, Seed21bOnTheH200FitsWithNoOptionsAndAppliesWhatItChose) {
  const ModelConfig c = at_tokens("seed-21b", 1 << 20);
  const tier::PlanOptions o = machine(kH200, c, {});
  const DecidedPlan d = decide_plan(c, o, PlanScope{});
  SCOPED_TRACE(d.table(c));
  const tier::Candidate& best = d.search.best();
  // fp32 state (230 GiB) cannot fit a 112 GiB host beside HBM's 137: something smaller is chosen.
  EXPECT_NE(config::cfg().get_string(config::Key::GHT_OPT_STATE), "fp32");
  EXPECT_EQ(config::cfg().source(config::Key::GHT_OPT_STATE), config::Source::Plan);
  for (const tier::Price& p : best.inexact) {
    ASSERT_TRUE(p.verdict.has_value()) << p.option;
    EXPECT_TRUE(p.verdict->within_noise) << p.option;
  }
  EXPECT_FALSE(config::cfg().get_bool(config::Key::GHT_OPT_DELAY));  // outside the noise
  // What was applied is what was planned, and it fits.
  const tier::Prediction& p = d.model.plan.prediction();
  EXPECT_LE(p.hbm_bytes, o.budgets.hbm);
  EXPECT_LE(p.host_bytes, o.budgets.host);
  EXPECT_NEAR(p.step_seconds, best.step_seconds(), 1e-9 * best.step_seconds());
  // Every combination was priced (3 precisions x 2 accumulations x 2 delays x the undo arena or
  // none x micro-batches of 1, 2 and 4 sequences), and the 36 with the delay, which the tolerance
  // refuses, were not planned: admitted plans fit.
  EXPECT_EQ(d.search.candidates.size(), 72u);
  for (const tier::Candidate& cand : d.search.candidates) EXPECT_EQ(cand.planned, cand.admitted);
  RecordProperty("search_seconds", std::to_string(d.search.search_seconds));
  std::printf("seed-21b search on this machine: %.2f s for %zu combinations\n", d.search.search_seconds,
              d.search.candidates.size());
}

TEST_F(PlanDecide, Seed21bWithFp32StatePinnedIsRefusedAndTheRefusalListsWhatFits) {
  const ModelConfig c = at_tokens("seed-21b", 1 << 20);
  const tier::PlanOptions o = machine(kH200, c, {"GHT_OPT_STATE=fp32"});
  try {
    (void)decide_plan(c, o, PlanScope{});
    ADD_FAILURE() << "fp32 state on a 112 GiB host was admitted";
  } catch (const tier::plan_refused& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no plan within GHT_PLAN_TOLERANCE=noise fits"), std::string::npos) << m;
    EXPECT_NE(m.find("With other values of the options you set, these fit:"), std::string::npos) << m;
    EXPECT_NE(m.find("set GHT_OPT_STATE=q8"), std::string::npos) << m;
  }
  // Nothing was applied.
  EXPECT_EQ(config::cfg().source(config::Key::GHT_GRAD_ACCUM), config::Source::Default);
}

TEST_F(PlanDecide, OnTheGh200Seed21bKeepsFp32StateOnTheHostUnderExact) {
  const ModelConfig c = at_tokens("seed-21b", 1 << 20);
  const tier::PlanOptions o = machine(kGh200, c, {"GHT_PLAN_TOLERANCE=exact"});
  const DecidedPlan d = decide_plan(c, o, PlanScope{});
  SCOPED_TRACE(d.table(c));
  // Exact settings only (the undo arena, exact either way, may be left out where HBM is short).
  EXPECT_TRUE(d.search.best().inexact.empty()) << chosen(d.search);
  EXPECT_EQ(config::cfg().get_string(config::Key::GHT_OPT_STATE), "fp32");
  const tier::Plan& p = d.model.plan;
  for (std::size_t i = 0; i < p.regions().size(); ++i) {
    if (p.regions()[i].cls == TensorClass::master) {
      EXPECT_EQ(p.decisions()[i].tier, TierKind::host) << p.regions()[i].name;
    }
  }
}

TEST_F(PlanDecide, OnTheGh200TheDefaultToleranceTakesOnlyPricedChoicesThatPay) {
  const ModelConfig c = at_tokens("seed-21b", 1 << 20);
  const tier::PlanOptions o = machine(kGh200, c, {});
  const tier::SearchResult noise = search_model_plans(c, o, PlanScope{});
  SCOPED_TRACE(tier::format_search(noise, 1 << 20, plan_peak_flops()));
  ASSERT_TRUE(noise.chosen.has_value());
  // The exact plan fits; anything inexact chosen must beat it by more than kPreferExactWithin.
  double exact = 0;
  for (const tier::Candidate& cand : noise.candidates) {
    if (cand.inexact.empty() && cand.plan) exact = cand.step_seconds();
  }
  ASSERT_GT(exact, 0);
  const tier::Candidate& best = noise.best();
  if (!best.inexact.empty()) {
    EXPECT_LT(best.step_seconds(), exact * (1 - tier::kPreferExactWithin));
  }
  // The chosen plan is the fastest of those the ledger admits, to within kPreferExactWithin.
  for (const tier::Candidate& cand : noise.candidates) {
    if (cand.plan && cand.admitted) {
      EXPECT_LE(best.step_seconds(), cand.step_seconds() * (1 + tier::kPreferExactWithin));
    }
  }
}

TEST_F(PlanDecide, OnA24GBCardBenchH200TakesQ8StateUnderNoiseAndIsRefusedUnderExact) {
  ModelConfig c = preset("bench-h200");
  c.layers = 9;  // 5.3B parameters: fp32 state (64 GB) does not fit the host; q8 state does
  {
    const tier::PlanOptions o = machine(kPcie24, c, {});
    const tier::SearchResult r = search_model_plans(c, o, PlanScope{});
    SCOPED_TRACE(tier::format_search(r, static_cast<double>(c.tokens_per_step()), plan_peak_flops()));
    ASSERT_TRUE(r.chosen.has_value());
    EXPECT_NE(chosen(r).find("GHT_OPT_STATE="), std::string::npos) << chosen(r);  // fp32 state does not fit
  }
  const tier::PlanOptions o = machine(kPcie24, c, {"GHT_PLAN_TOLERANCE=exact"});
  const tier::SearchResult r = search_model_plans(c, o, PlanScope{});
  EXPECT_FALSE(r.chosen.has_value());
  const std::string m = tier::refusal_message(r, static_cast<double>(c.tokens_per_step()));
  EXPECT_NE(m.find("GHT_PLAN_TOLERANCE=exact"), std::string::npos) << m;
  EXPECT_NE(m.find("set GHT_OPT_STATE="), std::string::npos) << m;  // the nearest plans that fit
}

TEST_F(PlanDecide, AUserSettingIsNeverOverriddenAndADelayOutsideTheNoiseIsTakenOnlyUnderACost) {
  const ModelConfig c = at_tokens("seed-21b", 1 << 18);
  {
    const tier::PlanOptions o = machine(kGh200, c, {"GHT_GRAD_ACCUM=fp32"});
    const DecidedPlan d = decide_plan(c, o, PlanScope{});
    EXPECT_EQ(config::cfg().get_string(config::Key::GHT_GRAD_ACCUM), "fp32");
    EXPECT_EQ(config::cfg().source(config::Key::GHT_GRAD_ACCUM), config::Source::Env);
    for (const tier::Dimension& dim : d.search.dimensions) {
      if (dim.option == "GHT_GRAD_ACCUM") {
        EXPECT_EQ(dim.values.size(), 1u);
      }
    }
  }
  // bench-h200 on the H200 has the HBM for the delay's second weight and gradient buffers.
  const ModelConfig b = preset("bench-h200");
  const tier::PlanOptions o = machine(kH200, b, {"GHT_PLAN_TOLERANCE=0.5"});
  const tier::SearchResult r = search_model_plans(b, o, PlanScope{});
  ASSERT_TRUE(r.chosen.has_value());
  bool delay_admitted = false;
  for (const tier::Candidate& cand : r.candidates) {
    for (std::size_t i = 0; i < cand.settings.size(); ++i) {
      if (cand.settings[i] == std::pair<std::string, std::string>{"GHT_OPT_DELAY", "on"} && cand.plan) {
        delay_admitted = delay_admitted || cand.admitted;
      }
    }
  }
  EXPECT_TRUE(delay_admitted);  // 15% < 50%
  // The CPU backend's scope has no gradient accumulation or delay to choose.
  const tier::PlanOptions none = machine(Machine{"none", {}}, c, {});
  const auto dims = plan_dimensions(c, none, PlanScope{});
  ASSERT_EQ(dims.size(), 1u);
  EXPECT_EQ(dims[0].option, "GHT_OPT_STATE");
}

// The GH200 as its topology fixture describes it (tests/data/gh200-topology.xml through hwloc's
// XML import, with the CUDA attributes a GH200 reports): the plan's capacities come from that
// topology, not from the gh200 profile's nominal figures, and seed-21b at 1M tokens/step keeps
// fp32 state on the Grace node, as in the seed.
TEST_F(PlanDecide, TheGh200TopologyFixtureGivesTheCapacitiesAndThePlanKeepsFp32StateOnTheHost) {
  tier::GpuInfo g;
  g.name = "NVIDIA GH200 480GB";
  g.pci_bus_id = "0009:01:00.0";
  g.sm_count = 132;
  g.cc_major = 9;
  g.hbm_total_bytes = 102005473280;
  g.pageable_memory_access = g.pageable_uses_host_page_tables = g.host_native_atomics = true;
  g.concurrent_managed_access = g.can_use_host_pointer_for_registered_mem = true;
  g.memory_numa_node = 1;
  g.driver_host_numa_node = 0;
  const tier::Topology t = tier::detail::topology_from_hwloc_xml(
      std::string(GHT_SOURCE_DIR) + "/tests/data/gh200-topology.xml", {g});
  ASSERT_EQ(t.link, LinkKind::c2c);
  tier::Capacities caps;
  caps.origin = "gh200 topology fixture";
  caps.hbm_total = caps.hbm_free = t.capacity(TierKind::hbm);
  caps.host_total = caps.host_available = t.capacity(TierKind::host);
  EXPECT_GT(caps.host_total, 400ull << 30);  // the Grace node's LPDDR5X, not the HBM node's 95 GiB
  const ModelConfig c = at_tokens("seed-21b", 1 << 20);
  config::cfg() = registry_with({"GHT_PLAN_LEDGER=" + ledger_.string()});
  const tier::PlanOptions o =
      tier::plan_options_from_config(config::cfg(), tier::builtin_profile("gh200"), caps, model_step_flops(c),
                                     model_head_flops(c));
  const DecidedPlan d = decide_plan(c, o, PlanScope{});
  SCOPED_TRACE(d.table(c));
  const tier::Plan& p = d.model.plan;
  for (std::size_t i = 0; i < p.regions().size(); ++i) {
    if (p.regions()[i].cls == TensorClass::master) {
      EXPECT_EQ(p.decisions()[i].tier, TierKind::host) << p.regions()[i].name;
    }
  }
  EXPECT_EQ(config::cfg().get_string(config::Key::GHT_OPT_STATE), "fp32");  // q8 would gain under 1%
  EXPECT_LE(p.prediction().host_bytes, o.budgets.host);
  EXPECT_LE(p.prediction().hbm_bytes, o.budgets.hbm);
}

// FP8 experts (GHT_FP8): searched only where the user set it or the ledger prices it; when set,
// the plan counts its HBM copies and takes its saving off the forward.
TEST_F(PlanDecide, Fp8IsSearchedWhereSetOrPricedAndThePlanCountsItsCopiesAndItsForward) {
  ModelConfig c = preset("bench-h200");
  c.grad_accum = 16;
  c.micro_batch_pinned = true;  // the same shape with and without FP8
  {
    const tier::PlanOptions o = machine(kH200, c, {});
    for (const tier::Dimension& dim : plan_dimensions(c, o, PlanScope{})) EXPECT_NE(dim.option, "GHT_FP8");
  }
  const tier::PlanOptions off_o = machine(kH200, c, {"GHT_OPT_STATE=fp32", "GHT_GRAD_ACCUM=fp32"});
  const tier::Prediction off = decide_plan(c, off_o, PlanScope{}).model.plan.prediction();
  const tier::PlanOptions on_o = machine(kH200, c, {"GHT_OPT_STATE=fp32", "GHT_GRAD_ACCUM=fp32", "GHT_FP8=experts"});
  const DecidedPlan on = decide_plan(c, on_o, PlanScope{});
  SCOPED_TRACE(on.table(c));
  const tier::Plan& p = on.model.plan;
  EXPECT_EQ(p.options().fp8_hbm_bytes, fp8_expert_sizes(c).total());
  const double saved = p.options().fp8_saved_seconds;
  EXPECT_GT(saved, 0.0);
  EXPECT_NEAR(p.prediction().compute_seconds, off.compute_seconds - saved, 1e-9);
  EXPECT_NEAR(p.prediction().forward_seconds, off.forward_seconds - saved, 1e-9);
  // The user's FP8 is taken without a verdict and said so.
  ASSERT_EQ(on.search.best().inexact.size(), 1u);
  EXPECT_EQ(on.search.best().inexact[0].option, "GHT_FP8");
  EXPECT_FALSE(on.search.best().inexact[0].verdict.has_value());
  EXPECT_NE(p.format_table(false).find("FP8 GEMMs"), std::string::npos);
  // A ledger verdict inside the noise puts it on the menu, and a faster plan takes it.
  const fs::path ledger = ledger_.string() + ".fp8";
  std::string text = kLedger;
  text.insert(text.rfind(']'), R"(, {"option": "GHT_FP8", "value": "experts", "model": "ledger-1b", "params": 1.03e9,
  "steps": 1000, "lr": 5e-4, "exact_seeds": 3, "eval_loss_delta": 0.001, "noise_band": 0.008, "within_noise": true,
  "measured": "2026-12-07", "source": "test"})");
  std::ofstream(ledger) << text;
  const tier::PlanOptions priced = machine(kH200, c, {"GHT_ASSUMED_FP8_GEMM=1.6"});  // a saving past 1%
  config::cfg().set_flag("GHT_PLAN_LEDGER", ledger.string());
  // Where FP8 cannot run (no CUTLASS, no sm_90 GPU, shapes the GEMM cannot take) the verdict does
  // not put it on the menu.
  for (const tier::Dimension& dim : plan_dimensions(c, priced, PlanScope{})) EXPECT_NE(dim.option, "GHT_FP8");
  PlanScope cannot_run;
  cannot_run.fp8_why_not = "no sm_90 device here";
  const DecidedPlan without = decide_plan(c, priced, cannot_run);
  EXPECT_NE(without.table(c).find("FP8 experts not searched, though the accuracy ledger prices them: no sm_90 device "
                                  "here"),
            std::string::npos)
      << without.table(c);
  EXPECT_EQ(config::cfg().get_string(config::Key::GHT_FP8), "off");
  PlanScope can_run;
  can_run.fp8 = true;
  const DecidedPlan d = decide_plan(c, priced, can_run);
  EXPECT_TRUE(d.left_out.empty());
  fs::remove(ledger);
  EXPECT_EQ(config::cfg().get_string(config::Key::GHT_FP8), "experts") << d.table(c);
  EXPECT_EQ(config::cfg().source(config::Key::GHT_FP8), config::Source::Plan);
}

// The weight-gradient GEMMs read and write every layer gradient in HBM once per micro-batch
// (bench/results/2026-12-07-h100-backward-gradient-accumulation.md): bf16 accumulators halve the
// bytes, so the backward is shorter by half the exposed traffic, and the forward is unchanged.
TEST_F(PlanDecide, Bf16AccumulationShortensTheBackwardByHalfTheAccumulatorTraffic) {
  ModelConfig c = at_tokens("bench-h200", 1 << 16);
  c.micro_batch_pinned = true;  // 16 micro-batches
  std::int64_t rows = 0;
  auto predict = [&](const char* accum) {
    const tier::PlanOptions o = machine(kH200, c, {"GHT_OPT_STATE=q8", std::string("GHT_GRAD_ACCUM=") + accum,
                                                   "GHT_OPT_SPECULATE=0"});
    const DecidedPlan d = decide_plan(c, o, PlanScope{});
    rows = d.model.lm_head_rows;
    return std::pair{d.model.plan.prediction(), o};
  };
  const auto [fp32, o] = predict("fp32");
  const std::int64_t fp32_rows = rows;
  const tier::Prediction bf16 = predict("bf16").first;
  EXPECT_EQ(rows, fp32_rows);
  // Every layer gradient in HBM, 16 micro-batches, 8 B or 4 B moved per parameter, half of it
  // exposed (GHT_ASSUMED_ACC_EXPOSED's default); the embedding's is the LM head's, once per chunk.
  const double layer_params = static_cast<double>(c.total_params() - c.embedding_params());
  const double want = c.grad_accum * layer_params * 8 * 0.5 / o.link.hbm_bps;
  EXPECT_NEAR(fp32.accumulate_seconds, want + head_pass_seconds(c, rows, 4, o), 0.01 * want);
  EXPECT_NEAR(bf16.accumulate_seconds, want / 2 + head_pass_seconds(c, rows, 2, o), 0.01 * want);
  EXPECT_NEAR(fp32.forward_seconds, bf16.forward_seconds, 1e-9);
  EXPECT_NEAR(fp32.compute_seconds - bf16.compute_seconds, want / 2 + head_pass_seconds(c, rows, 2, o),
              0.01 * want);
  // The table says it.
  const tier::Plan p = decide_plan(c, o, PlanScope{}).model.plan;
  EXPECT_NE(p.format_table(false).find("+ gradient accumulation"), std::string::npos);
}

// The micro-batch (model.micro_batch): on a GPU machine with one rank, the configured one and 2, 4, 8
// times it where the accumulation steps divide and the micro-batch stays within
// kMaxPlannedMicroBatchTokens; pinned by the configuration, absent on the CPU and with ranks.
TEST_F(PlanDecide, TheMicroBatchIsSearchedWhereTheConfigurationLeavesItOpen) {
  ModelConfig c = at_tokens("bench-h200", 1 << 16);  // 1 x 4096 tokens, 16 steps
  const tier::PlanOptions o = machine(kH200, c, {});
  auto values = [&](const ModelConfig& m, const tier::PlanOptions& po, const PlanScope& scope) {
    std::vector<std::string> v;
    for (const tier::Dimension& d : plan_dimensions(m, po, scope)) {
      if (d.option != kMicroBatchOption) continue;
      for (const auto& x : d.values) {
        EXPECT_TRUE(x.exact) << x.value;
        v.push_back(x.value);
      }
    }
    return v;
  };
  EXPECT_EQ(values(c, o, PlanScope{}), (std::vector<std::string>{"1", "2", "4"}));  // 8 x 4096 > 16384
  PlanScope two;
  two.ranks = 2;
  EXPECT_TRUE(values(c, o, two).empty());
  EXPECT_TRUE(values(c, machine(Machine{"none", {}}, c, {}), PlanScope{}).empty());
  ModelConfig odd = c;
  odd.grad_accum = 6;  // 2 divides, 4 does not
  EXPECT_EQ(values(odd, o, PlanScope{}), (std::vector<std::string>{"1", "2"}));
  ModelConfig pinned = c;
  pinned.micro_batch_pinned = true;
  EXPECT_TRUE(values(pinned, o, PlanScope{}).empty());
  // The shape of a setting keeps the tokens per step; one that cannot is refused by name.
  const ModelConfig four = with_planned_shape(c, {{kMicroBatchOption, "4"}});
  EXPECT_EQ(four.micro_batch, 4);
  EXPECT_EQ(four.grad_accum, 4);
  EXPECT_EQ(four.tokens_per_step(), c.tokens_per_step());
  EXPECT_EQ(with_planned_shape(c, {{"GHT_OPT_STATE", "q8"}}).micro_batch, 1);
  try {
    (void)with_planned_shape(c, {{kMicroBatchOption, "3"}});
    ADD_FAILURE() << "micro-batch 3 of 16 x 4096 tokens accepted";
  } catch (const ght::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("model.micro_batch=3"), std::string::npos) << e.what();
  }
}

// With room in HBM, fewer and larger micro-batches read and write the gradients fewer times: the
// plan takes the largest micro-batch that it can where that gains more than
// kPreferConfiguredMicroBatchWithin, its accumulation term falls by that factor, and it plans the
// activations of that micro-batch. Under that share, or pinned, the configured micro-batch stays.
TEST_F(PlanDecide, WithRoomInHbmTheLargerMicroBatchHalvesTheAccumulationAndIsChosen) {
  const ModelConfig c = at_tokens("bench-h200", 1 << 16);
  {
    // The H200's HBM: 16 accumulation passes of bf16 gradients cost 2% of the step, and 4 of
    // them save under 2.5% of it. The configured micro-batch stays, and the plan says nothing.
    const tier::PlanOptions h200 =
        machine(kH200, c, {"GHT_OPT_STATE=q8", "GHT_GRAD_ACCUM=bf16", "GHT_OPT_SPECULATE=0"});
    const DecidedPlan kept = decide_plan(c, h200, PlanScope{});
    EXPECT_EQ(kept.shape.micro_batch, 1) << kept.table(c);
    EXPECT_EQ(kept.reshaped, "");
    bool larger_faster = false;
    for (const tier::Candidate& cand : kept.search.candidates) {
      larger_faster = larger_faster || (cand.plan && cand.settings.back().second != "1" &&
                                        cand.rank_seconds() < kept.search.best().rank_seconds());
    }
    EXPECT_TRUE(larger_faster) << "a larger micro-batch should be predicted faster, by less than the share";
  }
  // fp32 accumulators with all of their traffic exposed (GHT_ASSUMED_ACC_EXPOSED=1): the passes
  // cost 4 times as much, and fewer of them pay.
  const tier::PlanOptions o = machine(kH200, c, {"GHT_OPT_STATE=q8", "GHT_GRAD_ACCUM=fp32", "GHT_OPT_SPECULATE=0",
                                                 "GHT_ASSUMED_ACC_EXPOSED=1"});
  ModelConfig pinned = c;
  pinned.micro_batch_pinned = true;
  const DecidedPlan one = decide_plan(pinned, o, PlanScope{});
  EXPECT_EQ(one.shape.micro_batch, 1);
  EXPECT_EQ(one.reshaped, "");
  const DecidedPlan d = decide_plan(c, o, PlanScope{});
  SCOPED_TRACE(d.table(c));
  ASSERT_GT(d.shape.micro_batch, 1);
  EXPECT_EQ(d.shape.micro_batch * d.shape.grad_accum, 16);
  EXPECT_EQ(d.shape.tokens_per_step(), c.tokens_per_step());
  const tier::Prediction p1 = one.model.plan.prediction(), p = d.model.plan.prediction();
  // The layers' passes scale with the micro-batches; the head's with its chunks.
  const double h1 = head_pass_seconds(one.shape, one.model.lm_head_rows, 4, o);
  const double h = head_pass_seconds(d.shape, d.model.lm_head_rows, 4, o);
  EXPECT_NEAR((p.accumulate_seconds - h) * d.shape.micro_batch, p1.accumulate_seconds - h1,
              1e-6 * p1.accumulate_seconds);
  EXPECT_LT(p.step_seconds, p1.step_seconds);
  // The plan's activations are the chosen micro-batch's (each layer's grows with its tokens).
  auto activation_bytes = [](const tier::Plan& p) {
    for (const tier::Region& r : p.regions()) {
      if (r.name == "layer0.activation") return r.bytes;
    }
    return std::uint64_t{0};
  };
  EXPECT_GT(activation_bytes(d.model.plan), activation_bytes(one.model.plan));
  EXPECT_GT(activation_bytes(one.model.plan), 0u);
  EXPECT_NE(d.reshaped.find("micro-batch chosen: " + std::to_string(d.shape.micro_batch) + " x 4096 tokens"),
            std::string::npos)
      << d.reshaped;
  EXPECT_NE(d.table(c).find(d.reshaped), std::string::npos);
  // The registry holds no such option: the micro-batch is the run's shape.
  EXPECT_EQ(config::find_option(kMicroBatchOption), nullptr);
}

// The GPU test's run (cuda_plan_test.cu, AnOpenMicroBatchTrainsAsPlannedAndResumes): tiny at 2 x 4
// sequences of 64 tokens, whose accumulation passes are a large share of its step, folds them.
TEST_F(PlanDecide, ATinyModelFoldsItsTwoMicroBatchesIntoOne) {
  ModelConfig c = preset("tiny");
  c.seq_len = 64;
  c.micro_batch = 4;
  c.grad_accum = 2;
  const DecidedPlan d = decide_plan(c, machine(kH200, c, {}), PlanScope{});
  EXPECT_EQ(d.shape.micro_batch, 8) << d.table(c);
  EXPECT_EQ(d.shape.grad_accum, 1);
}

TEST_F(PlanDecide, Fp8IsNotSearchedForShapesTheGemmCannotTake) {
  ModelConfig c = preset("bench-h200");
  c.expert_ffn = 808;  // not a multiple of 16
  EXPECT_NE(fp8_shape_refusal(c).find("expert_ffn 808"), std::string::npos) << fp8_shape_refusal(c);
  EXPECT_FALSE(local_plan_scope(c, 1, true).fp8);
  c.expert_ffn = 800;
  c.d_model = 4100;
  EXPECT_NE(fp8_shape_refusal(c).find("d_model 4100"), std::string::npos) << fp8_shape_refusal(c);
  c.d_model = 4096;
  EXPECT_EQ(fp8_shape_refusal(c), "");
  // This process's answer, whatever it is, is the scope's (with shapes the GEMM takes).
  EXPECT_EQ(local_plan_scope(c, 2, false).fp8, fp8_unavailable_here().empty()) << fp8_unavailable_here();
  EXPECT_EQ(local_plan_scope(c, 2, false).ranks, 2);
  EXPECT_FALSE(local_plan_scope(c, 2, false).allow_delay);
}

}  // namespace
}  // namespace ght::trainer
