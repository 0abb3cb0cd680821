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

TEST(PlanPhases, TheBackwardRatioSplitsComputeAndKeepsTheStep) {
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

TEST(PlanPhases, CalibrationInvertsTheModel) {
  for (double r : {0.0, 0.05, 0.4}) {
    for (double rho : {1.5, 2.0, 2.75, 3.7}) {
      const double F = 2.5e16, S = 380e12, R = r * F;
      const double f = F / (S * (1 + rho));
      const double b = rho * f + R / S;
      const ComputeCalibration c = calibrate_compute({F, R, f, b});
      EXPECT_NEAR(c.tflops, S / 1e12, 1e-9 * S / 1e12) << "r " << r << " rho " << rho;
      EXPECT_NEAR(c.backward_ratio, rho, 1e-12) << "r " << r << " rho " << rho;
    }
  }
}

TEST(PlanPhases, CalibrationRefusesPhasesItCannotExplain) {
  auto message = [](const MeasuredPhases& m) {
    try {
      (void)calibrate_compute(m);
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
}

// A run measures its phases; the auto policy planned on them predicts those phases back, for a
// plan with recompute and link traffic. Other policies ignore them.
TEST(PlanPhases, AutoPlansOnMeasuredPhasesAndPredictsThemBack) {
  const double params = 1e9;
  PlanOptions o = options_for(params, 4 * GiB);  // tight: the state goes to the host, activations recompute
  const Plan first = make_plan(regions_with_recompute(params), o);
  ASSERT_GT(recompute_flops_of(first), 0);
  Measurements m;
  m.phases = {o.step_flops, recompute_flops_of(first), 0.9 * predicted_phases(first.prediction()).forward,
              1.3 * predicted_phases(first.prediction()).backward};

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
  m.phases = {1e15, 2e13, 1.25, 3.5};
  const Measurements back = measurements_from_json(measurements_to_json(m), "m.json");
  EXPECT_DOUBLE_EQ(back.phases.step_flops, 1e15);
  EXPECT_DOUBLE_EQ(back.phases.recompute_flops, 2e13);
  EXPECT_DOUBLE_EQ(back.phases.forward_seconds, 1.25);
  EXPECT_DOUBLE_EQ(back.phases.backward_seconds, 3.5);
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
