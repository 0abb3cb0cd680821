// Cost model: link time, window/exposure arithmetic and the optimizer prediction, against
// figures computed by hand from the formulas in tier/cost_model.hpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "tier/cost_model.hpp"
#include "tier/link_fixtures.hpp"

namespace ght::tier {
namespace {

using test::gh200_numbers;
using test::pcie_numbers;

TEST(CostModel, OptimizerPredictionCountsTwelveBytesEachWay) {
  const LinkNumbers l = pcie_numbers();
  const auto p = predict_optimizer_link(1'000'000'000ULL, 0.0, l);
  EXPECT_DOUBLE_EQ(p.read_bytes, 12e9);
  EXPECT_DOUBLE_EQ(p.write_bytes, 12e9);
  EXPECT_DOUBLE_EQ(p.read_seconds, 12e9 / 51.3e9);
  EXPECT_DOUBLE_EQ(p.write_seconds, 12e9 / 52.6e9);
  // Both directions at once are bounded by the combined figure here: 24 GB / 99.8 GB/s.
  EXPECT_DOUBLE_EQ(p.seconds, 24e9 / 99.8e9);
  EXPECT_DOUBLE_EQ(predict_optimizer_link_seconds(1'000'000'000ULL, 0.0, l), p.seconds);
  // Reading the fp32 host accumulator adds 4 B/param host -> device.
  const auto g = predict_optimizer_link(1'000'000'000ULL, 4.0, l);
  EXPECT_DOUBLE_EQ(g.read_bytes, 16e9);
  EXPECT_DOUBLE_EQ(g.seconds, std::max(16e9 / 51.3e9, 28e9 / 99.8e9));
  EXPECT_THROW((void)predict_optimizer_link(10, -1.0, l), ght::logic_error);
}

TEST(CostModel, LinkTimeUsesEachDirectionAndTheCombinedLimit) {
  LinkNumbers l = pcie_numbers();
  EXPECT_DOUBLE_EQ(link_time(l, 2.0, 0.0, 110.8e9, 0.0), 2.0);  // one direction only
  // 100 GB each way: 200 GB / 99.8 GB/s > either direction alone.
  EXPECT_DOUBLE_EQ(link_time(l, 100e9 / 55.4e9, 100e9 / 55.3e9, 100e9, 100e9), 200e9 / 99.8e9);
  l.bidir_bps = 0;  // unknown: directions do not overlap
  EXPECT_DOUBLE_EQ(link_time(l, 1.5, 2.5, 1e9, 1e9), 4.0);
}

Region host_reader(const std::string& name, double bytes, double window, bool overlappable) {
  Region r;
  r.name = name;
  r.cls = TensorClass::weight;
  r.bytes = 1 << 20;
  Access a;
  a.gpu_read_bytes = bytes;
  a.overlappable = overlappable;
  a.window_fraction = window;
  r.access = {a};
  return r;
}

TEST(CostModel, ExposureFollowsTheWindows) {
  LinkNumbers l = pcie_numbers();
  l.h2d_bps = 50e9;
  // 450e12 FLOP at 450 TFLOP/s: a 1 s window.
  const std::vector<Region> regions = {host_reader("a", 100e9, 1.0, true),    // 2 s, whole window
                                       host_reader("b", 10e9, 0.25, true),    // 0.2 s, quarter
                                       host_reader("c", 5e9, 1.0, false)};    // 0.1 s, serial
  const CostModel cm(l, 450e12, 450, regions);
  ASSERT_EQ(cm.windows(), (std::vector<double>{0.0, 0.25, 1.0}));
  Load total = cm.zero();
  for (const Region& r : regions) total.add(cm.load(r, {TierKind::host, Mode::none}));
  const StepTime t = cm.evaluate(total);
  EXPECT_DOUBLE_EQ(t.compute_seconds, 1.0);
  EXPECT_DOUBLE_EQ(t.h2d_seconds, 2.3);
  // S(0) = 0.1; S(0.25) - 0.25 = 0.05; S(1) - 1 = 1.3  ->  1.3
  EXPECT_NEAR(t.exposed_link, 1.3, 1e-12);
  EXPECT_NEAR(t.exposed_seconds, 1.3, 1e-12);
  EXPECT_NEAR(t.step_seconds, 2.3, 1e-12);

  // In HBM the GPU accesses cost nothing.
  Load hbm = cm.zero();
  for (const Region& r : regions) hbm.add(cm.load(r, {TierKind::hbm, Mode::none}));
  EXPECT_DOUBLE_EQ(cm.evaluate(hbm).exposed_seconds, 0.0);
  EXPECT_DOUBLE_EQ(cm.total_seconds(hbm), 0.0);

  // Scores: all seconds, serial-first, and (1 - f)-weighted.
  const Load la = cm.load(regions[0], {TierKind::host, Mode::none});
  const Load lb = cm.load(regions[1], {TierKind::host, Mode::none});
  const Load lc = cm.load(regions[2], {TierKind::host, Mode::none});
  EXPECT_DOUBLE_EQ(cm.total_seconds(la), 2.0);
  EXPECT_DOUBLE_EQ(cm.serial_seconds(la), 0.0);
  EXPECT_DOUBLE_EQ(cm.serial_seconds(lc), 0.1);
  EXPECT_DOUBLE_EQ(cm.unhidable_seconds(lb), 0.75 * 0.2);
}

// An expert's gradient region of `bytes`, routed to with `frequency` (its accesses set by the test).
Region expert_grad(std::uint64_t bytes, int expert, double frequency) {
  Region g;
  g.name = "grad";
  g.cls = TensorClass::grad;
  g.bytes = bytes;
  g.expert = expert;
  g.routing_frequency = frequency;
  return g;
}

TEST(CostModel, HostTrafficAndRecomputeAndRouting) {
  const LinkNumbers l = pcie_numbers();
  Region g = expert_grad(1000, 3, 0.01);
  Access stream;
  stream.gpu_write_bytes = 2e9;
  stream.times_per_step = 4;
  stream.routing_tokens = 100;
  Access acc;
  acc.cpu_read_bytes = 3e9;
  acc.cpu_write_bytes = 1e9;
  g.host_access = std::vector<Access>{stream, acc};
  Region act;
  act.name = "act";
  act.cls = TensorClass::activation;
  act.bytes = 1000;
  act.recompute_bytes = 100;
  act.recompute_flops = 90e12;
  act.host_allowed = false;

  const CostModel cm(l, 450e12, 450, {g, act});
  const double p = 1.0 - std::pow(0.99, 100);
  EXPECT_NEAR(routing_factor(g, stream), p, 1e-15);
  EXPECT_DOUBLE_EQ(routing_factor(g, acc), 1.0);
  const Load lg = cm.load(g, {TierKind::host, Mode::stream});
  const StepTime t = cm.evaluate(lg);
  EXPECT_NEAR(t.d2h_bytes, 8e9 * p, 1e-3);
  EXPECT_DOUBLE_EQ(t.host_bytes, 4e9);
  EXPECT_DOUBLE_EQ(t.host_seconds, 4e9 / 111e9);
  // In HBM the host_access list does not apply and `access` is empty: free.
  EXPECT_DOUBLE_EQ(cm.total_seconds(cm.load(g, {TierKind::hbm, Mode::accumulate})), 0.0);

  const Load lr = cm.load(act, {TierKind::hbm, Mode::recompute});
  const StepTime tr = cm.evaluate(lr);
  EXPECT_DOUBLE_EQ(tr.recompute_seconds, 0.2);
  EXPECT_DOUBLE_EQ(tr.window_seconds, 1.2);
  EXPECT_DOUBLE_EQ(tr.step_seconds, 1.2);
  EXPECT_EQ(hbm_bytes(act, {TierKind::hbm, Mode::recompute}), 100u);
  EXPECT_EQ(hbm_bytes(act, {TierKind::hbm, Mode::keep}), 1000u);
  EXPECT_EQ((placements(act)), (std::vector<Placement>{{TierKind::hbm, Mode::recompute},
                                                       {TierKind::hbm, Mode::keep}}));
  EXPECT_EQ((placements(g)), (std::vector<Placement>{{TierKind::host, Mode::stream},
                                                     {TierKind::hbm, Mode::accumulate}}));
}

TEST(CostModel, GradientAccumulationInHbmLengthensTheBackwardByItsExposedShare) {
  LinkNumbers l = pcie_numbers();
  l.hbm_bps = 4e12;
  Region g = expert_grad(4000, 1, 0.5);
  Access acc;  // an fp32 accumulator of 1e9 parameters, read and written by 8 micro-batches
  acc.backward_hbm_bytes = 8e9;
  acc.times_per_step = 8;
  acc.routing_tokens = 2;  // reached by 1 - 0.5^2 of the micro-batches
  acc.backward_exposed = 0.5;
  g.access = {acc};
  Access stream;  // streamed to the host instead: the bf16 gradient written, then read by the copy
  stream.gpu_write_bytes = 2e9;
  stream.times_per_step = 8;
  stream.backward_hbm_bytes = 4e9;
  stream.backward_exposed = 0.5;
  g.host_access = std::vector<Access>{stream};
  const double want = 8 * 0.75 * 8e9 * 0.5 / 4e12;
  EXPECT_DOUBLE_EQ(backward_exposed_seconds(g, acc, l), want);
  EXPECT_DOUBLE_EQ(hbm_accumulate_seconds({g, g}, l), 2 * want);

  const CostModel cm(l, 450e12, 450, {g}, 0.25);
  const StepTime in_hbm = cm.evaluate(cm.load(g, {TierKind::hbm, Mode::accumulate}));
  EXPECT_DOUBLE_EQ(in_hbm.accumulate_seconds, want);
  EXPECT_DOUBLE_EQ(in_hbm.compute_seconds, 1.0 + 0.25 + want);  // FLOPs + head + accumulation
  EXPECT_DOUBLE_EQ(in_hbm.window_seconds, in_hbm.compute_seconds);
  EXPECT_DOUBLE_EQ(in_hbm.hbm_pass_seconds, 0.0);  // not the update's pass
  const StepTime on_host = cm.evaluate(cm.load(g, {TierKind::host, Mode::stream}));
  EXPECT_DOUBLE_EQ(on_host.accumulate_seconds, 8 * 4e9 * 0.5 / 4e12);  // every micro-batch, no routing
  EXPECT_DOUBLE_EQ(on_host.compute_seconds, 1.25 + on_host.accumulate_seconds);
  EXPECT_DOUBLE_EQ(on_host.d2h_bytes, 8 * 2e9);  // the link sees the gradient once
  // Without an HBM bandwidth the pass is not counted (as the update's).
  l.hbm_bps = 0;
  EXPECT_DOUBLE_EQ(backward_exposed_seconds(g, acc, l), 0.0);
}

TEST(CostModel, MissingBandwidthIsInfiniteOnlyWhenUsed) {
  LinkNumbers l = pcie_numbers();
  l.kernel_read_bps = 0;
  Region r = host_reader("a", 1e9, 1.0, true);
  r.access[0].gpu_path = GpuPath::kernel;
  const CostModel cm(l, 1e12, 450, {r});
  EXPECT_TRUE(std::isinf(cm.total_seconds(cm.load(r, {TierKind::host, Mode::none}))));
  r.access[0].gpu_read_bytes = 0;
  EXPECT_DOUBLE_EQ(cm.total_seconds(cm.load(r, {TierKind::host, Mode::none})), 0.0);
}

// ---- the update split between the link and the host cores ------------------------------------
// Hand figures for 1e9 parameters on the PCIe fixture (55.4/55.3 GB/s memcpy, 99.8 GB/s both
// ways, 51.3/52.6 GB/s kernel access), CPU AdamW 1.53 Gparam/s, host memory 111 GB/s:
//   L_g = 24 GB / 99.8 GB/s (state both ways, combined limit)           = 0.240481 s
//   L_c = max(2 GB / 55.4, 4 GB / 55.3, 6 GB / 99.8) (weight up, grad down) = 4 / 55.3 = 0.072333 s
//   T_cpu(1) = 1e9 / 1.53e9                                               = 0.653595 s
//   D_g = 24 GB, D_c = 30 GB (CPU AdamW, fp32 grad) + 6 GB (staging copies) = 36 GB

TEST(UpdateSplit, LinkAndCpuMeetWhenHostMemoryIsNotTheLimit) {
  const LinkNumbers l = pcie_numbers();
  UpdateSplitInput in;
  in.params_grad_hbm = 1'000'000'000ULL;
  in.cpu_params_per_s = 1.53e9;
  in.host_bps = 1e18;  // effectively unlimited
  const UpdateSplit s = predict_update_split(in, l);
  const double Lg = 24e9 / 99.8e9, Lc = 4e9 / 55.3e9, C = 1e9 / 1.53e9;
  const double f = Lg / (Lg - Lc + C);  // closed form: link time = CPU time
  EXPECT_NEAR(s.cpu_fraction, f, 1e-12);
  EXPECT_NEAR(s.cpu_fraction, 0.292647, 1e-6);
  EXPECT_NEAR(s.seconds, f * C, 1e-12);
  EXPECT_NEAR(s.link_seconds, s.cpu_seconds, 1e-12);
  EXPECT_NEAR(s.all_link_seconds, Lg, 1e-12);
  EXPECT_NEAR(s.all_cpu_seconds, C, 1e-12);
  EXPECT_EQ(s.limit, "link = cpu");
}

TEST(UpdateSplit, SharedHostMemoryCapsTheCpuShare) {
  const LinkNumbers l = pcie_numbers();
  UpdateSplitInput in;
  in.params_grad_hbm = 1'000'000'000ULL;
  in.cpu_params_per_s = 1.53e9;
  in.host_bps = 111e9;
  const UpdateSplit s = predict_update_split(in, l);
  const double Lg = 24e9 / 99.8e9, Lc = 4e9 / 55.3e9;
  const double Mg = 24e9 / 111e9, Mc = 36e9 / 111e9;
  // Where link meets memory: (1-f)·Lg + f·Lc = (1-f)·Mg + f·Mc.
  const double f = (Lg - Mg) / ((Lg - Mg) + (Mc - Lc));
  EXPECT_NEAR(s.cpu_fraction, f, 1e-12);
  EXPECT_NEAR(s.cpu_fraction, 0.087835, 1e-6);
  EXPECT_NEAR(s.seconds, (1 - f) * Mg + f * Mc, 1e-12);
  EXPECT_NEAR(s.seconds, 0.225712, 1e-6);
  EXPECT_LT(s.cpu_seconds, s.seconds);
  EXPECT_EQ(s.limit, "link = host memory");
  // The ends: all over the link is the link's time; all on the CPU the CPU's.
  EXPECT_NEAR(s.all_link_seconds, Lg, 1e-12);
  EXPECT_NEAR(s.all_cpu_seconds, 1e9 / 1.53e9, 1e-12);
}

// bf16 m and v (GHT_OPT_STATE=bf16): 8 state bytes per parameter each way, so the link path moves
// 16 B instead of 24 and the CPU path 4 + 2·8 + 2 = 22 B of its own (fp32 gradient read, state
// read and written, bf16 weight written; + 6 B of staging copies):
//   Lg = 16 GB / 99.8 GB/s, Mg = 16 GB / 111 GB/s, Mc = (22 + 6) GB / 111 GB/s, Lc unchanged
//   f = (Lg - Mg) / ((Lg - Mg) + (Mc - Lc)) = 0.082493 (0.087835 with fp32 state).
TEST(UpdateSplit, Bf16StateMovesFewerBytesOnBothPaths) {
  const LinkNumbers l = pcie_numbers();
  UpdateSplitInput in;
  in.params_grad_hbm = 1'000'000'000ULL;
  in.cpu_params_per_s = 1.53e9;
  in.host_bps = 111e9;
  in.state_bytes_per_param = 8;
  const UpdateSplit s = predict_update_split(in, l);
  const double Lg = 16e9 / 99.8e9, Lc = 4e9 / 55.3e9;
  const double Mg = 16e9 / 111e9, Mc = 28e9 / 111e9;
  const double f = (Lg - Mg) / ((Lg - Mg) + (Mc - Lc));
  EXPECT_NEAR(s.all_link_seconds, Lg, 1e-12);
  EXPECT_NEAR(s.cpu_fraction, f, 1e-12);
  EXPECT_NEAR(s.cpu_fraction, 0.082493, 1e-6);
  EXPECT_EQ(s.limit, "link = host memory");
  EXPECT_DOUBLE_EQ(adamw_bytes_per_param(4, 8), 22.0);
  EXPECT_DOUBLE_EQ(predict_optimizer_link(10, 0, l, 8).read_bytes, 80.0);
}

TEST(UpdateSplit, StreamedGradientsAndDefaultsFromTheTriad) {
  // Gradients in the host accumulator: gpu_link reads them too (16 B up, 12 B down), the CPU
  // path sends only the weight up. CPU rate and memory limit default to the triad: 111 GB/s and
  // 111 GB/s / 30 B.
  const LinkNumbers l = pcie_numbers();
  UpdateSplitInput in;
  in.params_grad_host = 1'000'000'000ULL;
  const UpdateSplit s = predict_update_split(in, l);
  const double Lg = std::max(16e9 / 51.3e9, 28e9 / 99.8e9), Lc = 2e9 / 55.4e9;
  const double Mg = 28e9 / 111e9, Mc = 32e9 / 111e9, C = 30e9 / 111e9;
  EXPECT_NEAR(s.all_link_seconds, std::max(Lg, Mg), 1e-12);
  EXPECT_NEAR(s.all_cpu_seconds, std::max({Lc, Mc, C}), 1e-12);
  // The CPU line lies under the memory line (it is part of the same bytes), so link meets memory.
  const double f = (Lg - Mg) / ((Lg - Mg) + (Mc - Lc));
  EXPECT_NEAR(s.cpu_fraction, f, 1e-12);
  EXPECT_NEAR(s.seconds, (1 - f) * Lg + f * Lc, 1e-12);
}

TEST(UpdateSplit, NoCpuRateMeansAllOverTheLinkAndNothingMeansNoTime) {
  LinkNumbers l = pcie_numbers();
  l.host_triad_bps = 0;  // no triad and no rate: the CPU path cannot be timed, memory not charged
  UpdateSplitInput in;
  in.params_grad_hbm = 1'000'000'000ULL;
  const UpdateSplit s = predict_update_split(in, l);
  EXPECT_EQ(s.cpu_fraction, 0.0);
  EXPECT_NEAR(s.seconds, 24e9 / 99.8e9, 1e-12);
  EXPECT_TRUE(std::isinf(s.all_cpu_seconds));
  EXPECT_EQ(s.memory_seconds, 0.0);
  EXPECT_EQ(s.limit, "link");

  const UpdateSplit z = predict_update_split(UpdateSplitInput{}, pcie_numbers());
  EXPECT_EQ(z.seconds, 0.0);
  EXPECT_EQ(z.cpu_fraction, 0.0);
  EXPECT_EQ(z.limit, "");
  in.cpu_params_per_s = -1;
  EXPECT_THROW((void)predict_update_split(in, l), ght::logic_error);
}

TEST(UpdateSplit, CpuAdamwBytesMatchTheBenchmarkRoofline) {
  EXPECT_EQ(adamw_bytes_per_param(2), 28.0);  // bf16 gradient (bench_optimizer's CPU row)
  EXPECT_EQ(adamw_bytes_per_param(4), 30.0);  // fp32 gradient (host accumulator)
}

// The model at a forced share: the same lines, read at f (the sweep's predictions). On the
// shared-memory fixture above, 0.2 on the CPU is past the best share, so host memory binds:
//   T(0.2) = 0.8 · 24/111 + 0.2 · 36/111 s; and the best share read back gives the best time.
TEST(UpdateSplit, EvaluatedAtAShareAndResolvedFromTheRequest) {
  const LinkNumbers l = pcie_numbers();
  UpdateSplitInput in;
  in.params_grad_hbm = 1'000'000'000ULL;
  in.cpu_params_per_s = 1.53e9;
  in.host_bps = 111e9;
  const UpdateSplit best = predict_update_split(in, l);
  const UpdateSplit at = evaluate_update_split(in, l, 0.2);
  EXPECT_EQ(at.cpu_fraction, 0.2);
  EXPECT_NEAR(at.seconds, 0.8 * 24e9 / 111e9 + 0.2 * 36e9 / 111e9, 1e-12);
  EXPECT_EQ(at.limit, "host memory");
  EXPECT_GT(at.seconds, best.seconds);
  EXPECT_NEAR(evaluate_update_split(in, l, best.cpu_fraction).seconds, best.seconds, 1e-15);
  EXPECT_EQ(evaluate_update_split(in, l, 0).seconds, best.all_link_seconds);
  EXPECT_EQ(evaluate_update_split(in, l, 1).seconds, best.all_cpu_seconds);
  EXPECT_THROW((void)evaluate_update_split(in, l, 1.5), ght::logic_error);
  // GHT_OPT_CPU_SHARE: a share in [0, 1] as given, -1 for the best one, anything else an error.
  EXPECT_EQ(resolve_update_cpu_share(0.3, in, l), 0.3);
  EXPECT_EQ(resolve_update_cpu_share(0, in, l), 0.0);
  EXPECT_EQ(resolve_update_cpu_share(-1, in, l), best.cpu_fraction);
  try {
    (void)resolve_update_cpu_share(-0.5, in, l);
    ADD_FAILURE() << "expected config_error";
  } catch (const ght::config_error& e) {
    EXPECT_NE(std::string(e.what()).find("GHT_OPT_CPU_SHARE"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ght::tier
