// Cost model: link time, window/exposure arithmetic and the optimizer prediction, against
// figures computed by hand from the formulas in tier/cost_model.hpp.
#include <gtest/gtest.h>

#include <cmath>
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

TEST(CostModel, HostTrafficAndRecomputeAndRouting) {
  const LinkNumbers l = pcie_numbers();
  Region g;
  g.name = "grad";
  g.cls = TensorClass::grad;
  g.bytes = 1000;
  g.expert = 3;
  g.routing_frequency = 0.01;
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

}  // namespace
}  // namespace ght::tier
