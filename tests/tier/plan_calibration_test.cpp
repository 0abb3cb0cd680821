// The plan's compute phases: how the step's compute splits into forward and backward
// (GHT_ASSUMED_BWD_RATIO), and the auto policy calibrating the compute rates from a run's
// measured phases (calibrate_compute), so that a plan made on measurements predicts those phases
// back; the measurements file's phases and their errors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tier/error.hpp"
#include "tier/link_fixtures.hpp"
#include "tier/plan.hpp"
#include "tier/plan_search.hpp"
#include "tier/regions_json.hpp"

namespace ght::tier {
namespace {

constexpr std::uint64_t GiB = 1ull << 30;
using test::pcie_numbers;

Region region(const std::string& name, TensorClass cls, std::uint64_t bytes) {
  Region r;
  r.name = name;
  r.cls = cls;
  r.bytes = bytes;
  return r;
}

// Weights the GPU must hold, fp32 state the optimizer reads and writes over the link, and
// activations that may be recomputed: enough for a plan with link traffic and recompute.
std::vector<Region> regions_with_recompute(double params) {
  const auto P = static_cast<std::uint64_t>(params);
  Region w = region("w", TensorClass::weight, 2 * P);
  w.host_allowed = false;
  std::vector<Region> out = {w};
  for (const char* n : {"master", "adam_m", "adam_v"}) {
    Region r = region(n, *parse_tensor_class(n), 4 * P);
    Access a;
    a.what = "optimizer";
    a.gpu_read_bytes = 4 * params;
    a.gpu_write_bytes = 4 * params;
    a.gpu_path = GpuPath::kernel;
    r.access = {a};
    out.push_back(r);
  }
  Region act = region("act", TensorClass::activation, 4 * P);
  act.host_allowed = false;
  act.recompute_bytes = P / 8;
  act.recompute_flops = 2 * params * 4096;
  out.push_back(act);
  return out;
}

PlanOptions options_for(double params, std::uint64_t hbm) {
  PlanOptions o;
  o.link = pcie_numbers();
  o.step_flops = 6 * params * 4096 * 4;
  o.budgets = {hbm, 64 * GiB, "test hbm", "test host"};
  return o;
}

double recompute_flops_of(const Plan& p) {
  double f = 0;
  for (std::size_t i = 0; i < p.regions().size(); ++i) {
    if (p.decisions()[i].mode == Mode::recompute) f += p.regions()[i].recompute_flops;
  }
  return f;
}

TEST(PlanPhases, TheBackwardRatioSplitsComputeAndKeepsTheStep) {  // no LM head counted
  const double params = 1e9;
  PlanOptions o = options_for(params, 64 * GiB);
  o.backward_ratio = 2.0;
  const Plan two = make_plan(regions_with_recompute(params), o);
  o.backward_ratio = 3.0;
  const Plan three = make_plan(regions_with_recompute(params), o);
  const Prediction &a = two.prediction(), &b = three.prediction();
  EXPECT_NEAR(a.forward_seconds, a.compute_seconds / 3, 1e-12);
  EXPECT_NEAR(b.forward_seconds, b.compute_seconds / 4, 1e-12);
  // The ratio moves time between the phases, never the step or the placement.
  EXPECT_DOUBLE_EQ(a.step_seconds, b.step_seconds);
  EXPECT_EQ(two.decisions(), three.decisions());
  const Phases pa = predicted_phases(a), pb = predicted_phases(b);
  EXPECT_NEAR(pa.forward + pa.backward, pb.forward + pb.backward, 1e-9);
  EXPECT_NEAR(pb.backward - b.recompute_seconds, 3 * pb.forward, 1e-9);
  // Saved and read back, the split is kept.
  const Plan back = Plan::from_json(three.to_json(), "p.json");
  EXPECT_DOUBLE_EQ(back.options().backward_ratio, 3.0);
  EXPECT_DOUBLE_EQ(back.prediction().forward_seconds, b.forward_seconds);
}

// The LM head's FLOPs run in the backward phase at their own rate: the layers' ratio splits the
// rest, and the head's seconds are in the step and in the window transfers hide behind.
TEST(PlanPhases, TheLmHeadIsTimedInTheBackwardAtItsOwnRate) {
  const double params = 1e9;
  PlanOptions o = options_for(params, 64 * GiB);
  const Plan none = make_plan(regions_with_recompute(params), o);
  o.head_flops = 7.2e15;  // 10 s at 720 TFLOP/s
  o.head_tflops = 720;
  const Plan head = make_plan(regions_with_recompute(params), o);
  const Prediction &a = none.prediction(), &b = head.prediction();
  EXPECT_NEAR(b.head_seconds, 10.0, 1e-9);
  EXPECT_NEAR(b.compute_seconds, a.compute_seconds + 10.0, 1e-9);
  EXPECT_NEAR(b.forward_seconds, a.forward_seconds, 1e-12);  // the forward is the layers' alone
  EXPECT_NEAR(b.window_seconds, a.window_seconds + 10.0, 1e-9);
  const Phases pb = predicted_phases(b);
  EXPECT_NEAR(pb.backward - b.recompute_seconds, o.backward_ratio * pb.forward + 10.0, 1e-9);
  const Plan back = Plan::from_json(head.to_json(), "p.json");
  EXPECT_DOUBLE_EQ(back.options().head_flops, 7.2e15);
  EXPECT_DOUBLE_EQ(back.options().head_tflops, 720);
  EXPECT_DOUBLE_EQ(back.prediction().head_seconds, b.head_seconds);
}

// The defaults against three recorded runs with every gradient accumulating in HBM: seed-21b's
// layers (bench/results/2026-12-05-h100-seed21b-backward-breakdown.md) with 10 layers at 262k
// tokens/step on the H100, forward 1.29 s and backward 4.46 s, bf16 gradients; 30 layers at 1M
// tokens/step on the H200 (docs/options.md, GHT_ASSUMED_TFLOPS), 14.1 s and 39.1 s, bf16; and
// bench-h200 (10 layers of 48 experts) at 64k tokens/step on the H100 (bench/results/
// 2026-12-07-h100-backward-gradient-accumulation.md), 0.312 s and 1.144 s, fp32. One layers' ratio,
// one LM head rate and the accumulators' exposed traffic (the layers' at GHT_ASSUMED_ACC_EXPOSED,
// the head's once per chunk, here one chunk per micro-batch, unhidden) explain all three, where a
// single ratio for the whole backward (3.46, 2.77, 3.67) cannot.
TEST(PlanPhases, OneLayerRatioTheHeadAndTheAccumulationExplainTheRecordedRuns) {
  const PlanOptions defaults;
  struct Run { double layers, experts, tokens, forward, backward, grad_bytes, hbm_bps; };
  for (const Run r : {Run{10, 64, 262144, 1.29, 4.46, 2, 3.35e12}, Run{30, 64, 1048576, 14.1, 39.1, 2, 4.8e12},
                      Run{10, 48, 65536, 0.312, 1.144, 4, 3.35e12}}) {
    SCOPED_TRACE(::testing::Message() << r.layers << " layers x " << r.experts << " experts, " << r.tokens
                                      << " tokens/step");
    // seed-21b's shapes (tests/trainer/model_test.cpp checks the counts by hand): per layer
    // 50,602,240 parameters besides the experts, 9,830,400 per expert, top-4; strict FLOPs per token
    // 6 x N_active_nonembedding + 12 L H d_head T, the head 6 x 151936 x 4096.
    const double n_active = r.layers * (50602240.0 + 4 * 9830400.0) + 4096;
    const double n_layers = r.layers * (50602240.0 + r.experts * 9830400.0);
    const double F = (6 * n_active + 12 * r.layers * 40 * 128 * 4096) * r.tokens;
    const double H = 6.0 * 151936 * 4096 * r.tokens;
    // Each micro-batch of 4,096 tokens reads and writes every layer gradient once, and the head's
    // (the tied embedding's) once per chunk.
    const double micro_batches = r.tokens / 4096;
    const double acc = micro_batches * n_layers * 2 * r.grad_bytes / r.hbm_bps * 0.5 +  // GHT_ASSUMED_ACC_EXPOSED
                       micro_batches * 151936.0 * 4096 * 2 * r.grad_bytes / r.hbm_bps;  // kLmHeadAccumulatorExposed
    MeasuredPhases m;
    m.step_flops = F;
    m.forward_seconds = r.forward;
    m.backward_seconds = r.backward;
    m.head_flops = H;
    const ComputeCalibration c = calibrate_compute(m, defaults.head_tflops, acc);
    EXPECT_NEAR(c.backward_ratio, defaults.backward_ratio, 0.06);
    EXPECT_NEAR(c.tflops, defaults.assumed_tflops, 0.15 * defaults.assumed_tflops);
    // The backward predicted from the measured forward, within 2%.
    const double head_s = H / (defaults.head_tflops * 1e12);
    EXPECT_NEAR((defaults.backward_ratio * r.forward + head_s + acc) / r.backward, 1.0, 0.02);
    m.head_flops = 0;  // the whole backward at one ratio
    EXPECT_GT(std::fabs(calibrate_compute(m, defaults.head_tflops).backward_ratio - defaults.backward_ratio), 0.4);
  }
}

TEST(PlanPhases, CalibrationInvertsTheModel) {
  for (double r : {0.0, 0.05, 0.4}) {
    for (double rho : {1.5, 2.0, 2.75, 3.7}) {
      const double F = 2.5e16, S = 380e12, R = r * F;
      const double f = F / (S * (1 + rho));
      for (double H : {0.0, 4e15}) {
        const double b = rho * f + R / S + H / 720e12;
        const ComputeCalibration c = calibrate_compute({F, R, f, b, H}, 720);
        EXPECT_NEAR(c.tflops, S / 1e12, 1e-9 * S / 1e12) << "r " << r << " rho " << rho << " H " << H;
        EXPECT_NEAR(c.backward_ratio, rho, 1e-12) << "r " << r << " rho " << rho << " H " << H;
      }
    }
  }
}

TEST(PlanPhases, CalibrationRefusesPhasesItCannotExplain) {
  auto message = [](const MeasuredPhases& m) {
    try {
      (void)calibrate_compute(m, 720);
    } catch (const config_error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message({0, 0, 1, 2}).find("phases.step_flops"), std::string::npos);
  EXPECT_NE(message({1e15, 0, 0, 2}).find("phases.forward_seconds"), std::string::npos);
  EXPECT_NE(message({1e15, 0, 1, NAN}).find("phases.backward_seconds"), std::string::npos);
  EXPECT_NE(message({1e15, -1, 1, 2}).find("phases.recompute_flops"), std::string::npos);
  // A backward no longer than the recompute the measured plan ran leaves nothing to calibrate.
  EXPECT_NE(message({1e15, 1e15, 1, 1}).find("no backward besides the recompute"), std::string::npos);
  EXPECT_NE(message({1e15, 0, 1, 2, -1}).find("phases.head_flops"), std::string::npos);
  // ...nor one that the LM head alone explains (7.2e14 FLOPs at 720 TFLOP/s: 1 s), or with the
  // gradient accumulation the model adds.
  EXPECT_NE(message({1e15, 0, 1, 1, 7.2e14}).find("the LM head and the gradient accumulation (1.0"),
            std::string::npos);
  try {
    (void)calibrate_compute({1e15, 0, 1, 1.5, 0}, 720, 1.5);
    ADD_FAILURE() << "a backward the accumulation alone explains was accepted";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("(1.5"), std::string::npos) << e.what();
  }
  EXPECT_NEAR(calibrate_compute({1e15, 0, 1, 1.5, 0}, 720, 0.25).backward_ratio, 1.25, 1e-12);
}

// A run measures its phases; the auto policy planned on them predicts those phases back, for a
// plan with recompute and link traffic. Other policies ignore them.
TEST(PlanPhases, AutoPlansOnMeasuredPhasesAndPredictsThemBack) {
  const double params = 1e9;
  PlanOptions o = options_for(params, 4 * GiB);  // tight: the state goes to the host, activations recompute
  o.head_flops = 1e15;
  const Plan first = make_plan(regions_with_recompute(params), o);
  ASSERT_GT(recompute_flops_of(first), 0);
  Measurements m;
  m.phases = {o.step_flops, recompute_flops_of(first), 0.9 * predicted_phases(first.prediction()).forward,
              1.3 * predicted_phases(first.prediction()).backward, o.head_flops};

  const Plan greedy = make_plan(regions_with_recompute(params), o, &m);
  EXPECT_DOUBLE_EQ(greedy.options().assumed_tflops, o.assumed_tflops);

  o.policy = Policy::auto_replan;
  const Plan replanned = make_plan(regions_with_recompute(params), o, &m);
  // The same placement (its gains per GiB move with the rates), so its phases are the measured ones.
  ASSERT_EQ(replanned.decisions().size(), first.decisions().size());
  for (std::size_t i = 0; i < first.decisions().size(); ++i) {
    ASSERT_EQ(replanned.decisions()[i].tier, first.decisions()[i].tier) << i;
    ASSERT_EQ(replanned.decisions()[i].mode, first.decisions()[i].mode) << i;
  }
  const Phases p = predicted_phases(replanned.prediction());
  EXPECT_NEAR(p.forward, m.phases.forward_seconds, 1e-9 * m.phases.forward_seconds);
  EXPECT_NEAR(p.backward, m.phases.backward_seconds, 1e-9 * m.phases.backward_seconds);
  EXPECT_LT(replanned.options().assumed_tflops, o.assumed_tflops);  // slower than assumed
  bool noted = false;
  for (const auto& n : replanned.notes()) noted = noted || n.find("compute rates from measured phases") != std::string::npos;
  EXPECT_TRUE(noted);
  // A slower measured compute leaves a longer window: never more exposed link time.
  EXPECT_LE(replanned.prediction().exposed_seconds - replanned.prediction().recompute_seconds,
            first.prediction().exposed_seconds - first.prediction().recompute_seconds + 1e-12);
}

TEST(PlanPhases, MeasurementsFileKeepsPhasesAndNamesBadOnes) {
  Measurements m;
  m.step_tokens = 4096;
  m.phases = {1e15, 2e13, 1.25, 3.5, 7e13};
  const Measurements back = measurements_from_json(measurements_to_json(m), "m.json");
  EXPECT_DOUBLE_EQ(back.phases.step_flops, 1e15);
  EXPECT_DOUBLE_EQ(back.phases.recompute_flops, 2e13);
  EXPECT_DOUBLE_EQ(back.phases.forward_seconds, 1.25);
  EXPECT_DOUBLE_EQ(back.phases.backward_seconds, 3.5);
  EXPECT_DOUBLE_EQ(back.phases.head_flops, 7e13);
  EXPECT_FALSE(measurements_from_json("{\"step_tokens\": 1}", "m.json").phases.present());
  auto expect_error = [](const std::string& text, const std::string& needle) {
    try {
      (void)measurements_from_json(text, "run/measurements.json");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const io_error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("run/measurements.json"), std::string::npos) << e.what();
    }
  };
  expect_error("{\"phases\": {\"step_flops\": 1e15, \"forward_seconds\": 1}}", "phases.backward_seconds: missing");
  expect_error("{\"phases\": {\"step_flops\": 1e15, \"forward_seconds\": 1, \"backward_seconds\": 2, \"fwd\": 1}}",
               "phases.fwd: unknown key");
  expect_error("{\"phases\": {\"step_flops\": 1e15, \"forward_seconds\": -1, \"backward_seconds\": 2}}",
               "forward_seconds");
}

}  // namespace
}  // namespace ght::tier
