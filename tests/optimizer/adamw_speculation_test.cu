// Speculative updates (AdamW::speculate_region) against the same steps without speculation:
// every byte of master, m, v and the bf16 weights must be equal after each step, whether
// begin_step keeps the speculation (unclipped), recomputes it (clipped, or a different lr) or
// restores it (non-finite gradients); with fp32, bf16 and q8 m and v. Also: which regions are eligible, the arena limit, and
// cancel_speculation. Skips without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/expect.hpp"
#include "common/gpu.hpp"
#include "optimizer/adamw.hpp"
#include "optimizer/adamw_harness.hpp"
#include "optimizer/gpu_mem.hpp"
#include "tier/error.hpp"

namespace ght::optimizer {
namespace {

using test::Case;
using test::DeviceMem;
using test::options;

using test::Outcome;

struct SpecCase {
  LinkMode mode = LinkMode::zero_copy;
  GradType grad_type = GradType::bf16;
  StateType state = StateType::fp32;
  TierKind master = TierKind::host;  // m and v are on the host
};

class SpeculationTwins : public ::testing::TestWithParam<SpecCase> {};

// gpu_link regions, gradients and weights in HBM, m and v on the host (the master too, or in
// HBM): the HBM undo arena.
void run_twins(const SpecCase& sc, Outcome outcome) {
  SCOPED_TRACE(std::string(to_string(sc.mode)) + " state " + to_string(sc.state) + ", master on " +
               std::string(to_string(sc.master)));
  Case c;
  c.grad_type = sc.grad_type;
  DeviceMem dev;
  AdamWOptions o = options(PathChoice::gpu_link, 1000, 0, sc.mode);
  o.state_type = sc.state;
  AdamWOptions o_ref = o;
  o_ref.speculate_bytes = 0;
  o.speculate_bytes = std::size_t{64} << 20;
  test::run_speculation_twins(c, dev, o_ref, o, [&] { return test::split_state(sc.master, TierKind::host); }, outcome);
}

TEST_P(SpeculationTwins, BytesEqualThePlainStepWhateverBeginStepDecides) {
  GHT_REQUIRE_GPU();
  for (Outcome o : {Outcome::kept, Outcome::clipped, Outcome::lr_changed, Outcome::nonfinite}) run_twins(GetParam(), o);
}

INSTANTIATE_TEST_SUITE_P(Modes, SpeculationTwins,
                         ::testing::Values(SpecCase{LinkMode::zero_copy, GradType::bf16},
                                           SpecCase{LinkMode::zero_copy, GradType::fp32},
                                           SpecCase{LinkMode::dma, GradType::bf16},
                                           SpecCase{LinkMode::dma, GradType::fp32},
                                           SpecCase{LinkMode::zero_copy, GradType::bf16, StateType::bf16},
                                           SpecCase{LinkMode::dma, GradType::fp32, StateType::bf16},
                                           SpecCase{LinkMode::zero_copy, GradType::fp32, StateType::q8},
                                           SpecCase{LinkMode::dma, GradType::bf16, StateType::q8},
                                           SpecCase{LinkMode::dma, GradType::bf16, StateType::fp32, TierKind::hbm},
                                           SpecCase{LinkMode::dma, GradType::bf16, StateType::q8, TierKind::hbm}),
                         [](const auto& info) {
                           return std::string(to_string(info.param.mode)) +
                                  (info.param.grad_type == GradType::bf16 ? "_bf16" : "_fp32") +
                                  (info.param.state == StateType::fp32 ? "" : std::string("_") + to_string(info.param.state) + "_state") +
                                  (info.param.master == TierKind::hbm ? "_master_in_hbm" : "");
                         });

TEST(SpeculationLimits, IneligibleRegionsAndAFullArenaFallBackToThePlainUpdate) {
  GHT_REQUIRE_GPU();
  DeviceMem dev;
  test::PinnedMem pinned;
  Case c;
  c.sizes = {100000, 2000};
  c.decay = {true, false};
  c.grad_scale = {1.0, 1.0};
  std::mt19937 rng(3);
  std::vector<test::RefRegion> unused;
  {
    // 1 MiB holds the 2000-parameter region (28 KB) but not the 100000-parameter one (1.4 MB).
    AdamWOptions o = options(PathChoice::gpu_link, 1000, 0, LinkMode::dma);
    o.speculate_bytes = std::size_t{1} << 20;
    test::Buffers buf;
    auto opt = test::make_optimizer(c, dev, dev, o, test::host_state(), buf, unused, rng);
    EXPECT_EQ(opt->speculate_region(0, 1e-3, nullptr), Speculation::no_room);
    EXPECT_EQ(opt->speculate_region(1, 1e-3, nullptr), Speculation::done);
    const StepResult res = opt->step(1e-3);
    EXPECT_EQ(res.speculated_params, 2000u);
  }
  {
    AdamWOptions o = options(PathChoice::gpu_link, 1000);
    o.speculate_bytes = 0;
    test::Buffers buf;
    auto opt = test::make_optimizer(c, dev, dev, o, test::host_state(), buf, unused, rng);
    EXPECT_EQ(opt->speculate_capacity(), 0u);
    EXPECT_EQ(opt->speculate_region(1, 1e-3, nullptr), Speculation::no_room);
  }
  {
    // State in HBM: the device path gains nothing from speculation, and no arena is reserved.
    AdamWOptions o = options(PathChoice::device);
    o.speculate_bytes = std::size_t{1} << 20;
    test::Buffers buf;
    auto opt = test::make_optimizer(c, dev, dev, o, nullptr, buf, unused, rng);
    EXPECT_EQ(opt->speculate_capacity(), 0u);
    EXPECT_EQ(opt->speculate_region(0, 1e-3, nullptr), Speculation::ineligible);
  }
  {
    // Gradients in host memory (the streamed accumulator): ineligible.
    AdamWOptions o = options(PathChoice::gpu_link);
    o.speculate_bytes = std::size_t{1} << 20;
    test::Buffers buf;
    auto opt = test::make_optimizer(c, pinned, dev, o, test::host_state(), buf, unused, rng);
    EXPECT_EQ(opt->speculate_region(0, 1e-3, nullptr), Speculation::ineligible);
  }
}

TEST(SpeculationLimits, CancelRestoresEveryByteAndSaveStateRefusesAnOpenSpeculation) {
  GHT_REQUIRE_GPU();
  DeviceMem dev;
  Case c;
  for (LinkMode mode : {LinkMode::zero_copy, LinkMode::dma}) {
    SCOPED_TRACE(std::string(to_string(mode)));
    std::mt19937 rng(5);
    std::vector<test::RefRegion> unused;
    AdamWOptions o = options(PathChoice::gpu_link, 1000, 0, mode);
    o.speculate_bytes = std::size_t{16} << 20;
    test::Buffers buf;
    auto opt = test::make_optimizer(c, dev, dev, o, test::host_state(), buf, unused, rng);
    std::vector<std::vector<double>> g_ref;
    std::vector<std::vector<unsigned char>> g_raw;
    test::make_grads(c, rng, g_ref, g_raw);
    for (std::size_t r = 0; r < c.sizes.size(); ++r) dev.upload(buf.grads[r], g_raw[r].data(), g_raw[r].size());
    ASSERT_TRUE(opt->step(1e-3).taken);  // m and v non-zero
    opt->synchronize();
    const test::Snapshot before = test::snapshot(*opt, dev, buf);
    for (std::size_t r = 0; r < c.sizes.size(); ++r) {
      ASSERT_EQ(opt->speculate_region(r, 1e-3, nullptr), Speculation::done);
    }
    std::vector<float> tmp(c.sizes[0]);
    EXPECT_CONTAINS(ght::test::error_of<ght::logic_error>([&] { opt->save_state(0, tmp.data(), nullptr, nullptr); }),
                    "wait for begin_step or cancel_speculation");
    opt->cancel_speculation();
    opt->synchronize();
    EXPECT_TRUE(test::bytes_equal(before, test::snapshot(*opt, dev, buf))) << "cancel did not restore the state";
    EXPECT_EQ(opt->step_count(), 1);
    const StepResult res = opt->step(1e-3);
    EXPECT_EQ(res.speculated_params, 0u);
    EXPECT_EQ(res.step, 2);
  }
}

}  // namespace
}  // namespace ght::optimizer
