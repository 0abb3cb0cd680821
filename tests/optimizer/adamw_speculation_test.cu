// Speculative updates (AdamW::speculate_region) against the same steps without speculation:
// every byte of master, m, v and the bf16 weights must be equal after each step, whether
// begin_step keeps the speculation (unclipped), recomputes it (clipped, or a different lr) or
// restores it (non-finite gradients); with fp32 and with bf16 m and v. Also: which regions are eligible, the arena limit, and
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

enum class Outcome { kept, clipped, lr_changed, nonfinite };

std::string name_of(Outcome o) {
  switch (o) {
    case Outcome::kept: return "kept";
    case Outcome::clipped: return "clipped";
    case Outcome::lr_changed: return "lr_changed";
    case Outcome::nonfinite: return "nonfinite";
  }
  return "?";
}

struct SpecCase {
  LinkMode mode = LinkMode::zero_copy;
  GradType grad_type = GradType::bf16;
  StateType state = StateType::fp32;
};

class SpeculationTwins : public ::testing::TestWithParam<SpecCase> {};

// Two optimizers from the same seed: `ref` steps normally, `spec` speculates every region (last
// first, as backward finishes them) before begin_step. Three steps per outcome, compared after
// each; the outcome applies to the middle step, the others are plain unclipped steps.
void run_twins(const SpecCase& sc, Outcome outcome) {
  SCOPED_TRACE(std::string(to_string(sc.mode)) + " " + (sc.grad_type == GradType::bf16 ? "bf16" : "fp32") +
               " state " + to_string(sc.state) + " " + name_of(outcome));
  Case c;
  c.grad_type = sc.grad_type;
  std::vector<std::vector<double>> g_ref;
  std::vector<std::vector<unsigned char>> g_raw;
  std::mt19937 probe(c.seed + 1);
  test::make_grads(c, probe, g_ref, g_raw);
  const double n0 = test::expected_norm(g_ref);
  // Clipping only where asked: on the middle step of `clipped`, gradients are scaled up 1000x.
  c.hyper.max_grad_norm = 10 * n0;
  DeviceMem dev;
  AdamWOptions o = options(PathChoice::gpu_link, 1000, 0, sc.mode);
  o.state_type = sc.state;
  test::Buffers buf_ref, buf_spec;
  std::vector<test::RefRegion> unused;
  std::mt19937 rng_ref(c.seed), rng_spec(c.seed);
  AdamWOptions o_ref = o;
  o_ref.speculate_bytes = 0;
  auto ref = test::make_optimizer(c, dev, dev, o_ref, test::host_state(), buf_ref, unused, rng_ref);
  o.speculate_bytes = std::size_t{64} << 20;
  auto spec = test::make_optimizer(c, dev, dev, o, test::host_state(), buf_spec, unused, rng_spec);
  ASSERT_EQ(ref->speculate_capacity(), 0u);
  ASSERT_EQ(spec->speculate_capacity(), std::size_t{64} << 20);
  std::size_t total = 0;
  for (std::size_t n : c.sizes) total += n;

  std::mt19937 rng(c.seed + 2);
  for (int s = 1; s <= 3; ++s) {
    const bool special = s == 2;
    test::make_grads(c, rng, g_ref, g_raw);
    if (special && outcome == Outcome::clipped) {
      for (std::size_t r = 0; r < c.sizes.size(); ++r) {
        for (std::size_t i = 0; i < c.sizes[r]; ++i) {
          if (c.grad_type == GradType::bf16) {
            std::uint16_t b;
            std::memcpy(&b, g_raw[r].data() + 2 * i, 2);
            b = float_to_bf16_bits(bf16_bits_to_float(b) * 1000.0f);
            std::memcpy(g_raw[r].data() + 2 * i, &b, 2);
          } else {
            float f;
            std::memcpy(&f, g_raw[r].data() + 4 * i, 4);
            f *= 1000.0f;
            std::memcpy(g_raw[r].data() + 4 * i, &f, 4);
          }
        }
      }
    }
    if (special && outcome == Outcome::nonfinite) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      if (c.grad_type == GradType::bf16) {
        const std::uint16_t b = float_to_bf16_bits(nan);
        std::memcpy(g_raw[1].data() + 2 * 5, &b, 2);
      } else {
        std::memcpy(g_raw[1].data() + 4 * 5, &nan, 4);
      }
    }
    for (std::size_t r = 0; r < c.sizes.size(); ++r) {
      dev.upload(buf_ref.grads[r], g_raw[r].data(), g_raw[r].size());
      dev.upload(buf_spec.grads[r], g_raw[r].data(), g_raw[r].size());
    }
    const double lr = 1e-3 * (1.0 + 0.3 * s);
    const double spec_lr = special && outcome == Outcome::lr_changed ? 2 * lr : lr;
    for (std::size_t r = c.sizes.size(); r-- > 0;) {
      ASSERT_EQ(spec->speculate_region(r, spec_lr, nullptr), Speculation::done) << "region " << r;
    }
    EXPECT_EQ(spec->speculate_region(0, spec_lr, nullptr), Speculation::ineligible)
        << "a region speculated twice in one step";
    const StepResult a = ref->step(lr);
    const StepResult b = spec->step(lr);
    ref->synchronize();
    spec->synchronize();
    const bool undone = special && outcome != Outcome::kept;
    EXPECT_EQ(a.taken, b.taken) << "step " << s;
    EXPECT_EQ(a.step, b.step) << "step " << s;
    EXPECT_EQ(a.clip_coef, b.clip_coef) << "step " << s;
    if (std::isnan(a.grad_norm)) {
      EXPECT_TRUE(std::isnan(b.grad_norm)) << "step " << s;
    } else {
      EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << s;
    }
    EXPECT_EQ(b.speculated_params, total) << "step " << s;
    EXPECT_EQ(b.speculation_undone, undone) << "step " << s;
    if (special && outcome == Outcome::clipped) EXPECT_LT(a.clip_coef, 0.5);
    if (special && outcome == Outcome::nonfinite) EXPECT_FALSE(a.taken);
    EXPECT_TRUE(test::bytes_equal(test::snapshot(*ref, dev, buf_ref), test::snapshot(*spec, dev, buf_spec)))
        << "step " << s << ": speculative and plain steps differ";
  }
  EXPECT_EQ(spec->stats().steps_speculated, 3);
  EXPECT_EQ(spec->stats().speculations_undone, outcome == Outcome::kept ? 0 : 1);
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
                                           SpecCase{LinkMode::dma, GradType::fp32, StateType::bf16}),
                         [](const auto& info) {
                           return std::string(to_string(info.param.mode)) +
                                  (info.param.grad_type == GradType::bf16 ? "_bf16" : "_fp32") +
                                  (info.param.state == StateType::bf16 ? "_bf16_state" : "");
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
