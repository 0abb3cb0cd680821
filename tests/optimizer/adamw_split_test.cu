// Both update paths at once (GHT_OPTIMIZER=split) and the cpu path with gradients and weights in
// HBM: the split step's bytes equal, region by region, those of the region's path run alone
// (clipped, skipped and resumed steps included); a cpu region's event exists only once the
// worker has written it; speculation of cpu regions (and of both paths together) equals the
// plain step whatever begin_step decides; the gpu_link kernel's SM cap and the streams' priority.
// Skips without a GPU (the host-side parts: adamw_cpu_path_test.cpp).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/gpu.hpp"
#include "optimizer/adamw.hpp"
#include "optimizer/adamw_harness.hpp"
#include "optimizer/gpu_mem.hpp"
#include "tier/cost_model.hpp"
#include "tier/cuda_check.hpp"
#include "tier/link.hpp"

namespace ght::optimizer {
namespace {

using test::Case;
using test::DeviceMem;
using test::Outcome;

// Six regions of mixed sizes, so a share of one half puts some on each path; 64 KiB staging
// slots cut the cpu regions into several chunks (the worker's double buffering and its prefetch
// of the next region's gradients both run).
Case split_case(GradType gt) {
  Case c;
  c.sizes = {4099, 777, 65537, 20000, 3001, 50000};
  c.decay = {true, false, true, true, false, true};
  c.grad_scale = {1.0, 0.05, 3.0, 1.0, 0.5, 2.0};
  c.grad_type = gt;
  return c;
}

AdamWOptions opts_for(PathChoice p, LinkMode mode, StateType st) {
  AdamWOptions o = test::options(p, 1000, 64 << 10, mode);
  o.state_type = st;
  o.speculate_bytes = 0;
  o.speculate_host_bytes = 0;
  return o;
}

bool region_equal(const test::Snapshot& a, const test::Snapshot& b, std::size_t r) {
  auto eq = [&](const auto& x, const auto& y) {
    return x[r].size() == y[r].size() && std::memcmp(x[r].data(), y[r].data(), x[r].size() * sizeof(x[r][0])) == 0;
  };
  return eq(a.p, b.p) && eq(a.m, b.m) && eq(a.v, b.v) && eq(a.w, b.w);
}

struct SplitCase {
  LinkMode mode;
  GradType grad_type;
  StateType state;
};

class SplitTwins : public ::testing::TestWithParam<SplitCase> {};

// The split optimizer next to one that runs every region over the link and one that runs every
// region on the host cores, from the same seed. Steps: plain, clipped, plain, skipped
// (non-finite), then the split one is resumed from its saved state into a fresh optimizer (what
// a checkpoint does) and two more steps follow.
TEST_P(SplitTwins, EachRegionEqualsItsPathRunAlone) {
  GHT_REQUIRE_GPU();
  const SplitCase sc = GetParam();
  Case c = split_case(sc.grad_type);
  std::vector<std::vector<double>> g_ref;
  std::vector<std::vector<unsigned char>> g_raw;
  std::mt19937 probe(c.seed + 1);
  test::make_grads(c, probe, g_ref, g_raw);
  c.hyper.max_grad_norm = 10 * test::expected_norm(g_ref);
  DeviceMem dev;
  AdamWOptions split_opts = opts_for(PathChoice::split, sc.mode, sc.state);
  split_opts.cpu_share = 0.5;
  test::Buffers buf_s, buf_l, buf_c, buf_r;
  std::vector<test::RefRegion> unused;
  std::mt19937 rng_s(c.seed), rng_l(c.seed), rng_c(c.seed), rng_r(c.seed);
  auto split = test::make_optimizer(c, dev, dev, split_opts, test::host_state(), buf_s, unused, rng_s);
  auto link = test::make_optimizer(c, dev, dev, opts_for(PathChoice::gpu_link, sc.mode, sc.state), test::host_state(),
                                   buf_l, unused, rng_l);
  auto cpu = test::make_optimizer(c, dev, dev, opts_for(PathChoice::cpu, sc.mode, sc.state), test::host_state(), buf_c,
                                  unused, rng_c);
  ASSERT_EQ(split->split_cpu_share(), 0.5);
  std::size_t on_cpu = 0;
  for (std::size_t r = 0; r < c.sizes.size(); ++r) {
    ASSERT_NE(split->path(r), Path::device);
    on_cpu += split->path(r) == Path::cpu ? 1 : 0;
  }
  ASSERT_GT(on_cpu, 0u);
  ASSERT_LT(on_cpu, c.sizes.size());
  ASSERT_GT(split->num_chunks(2), 1u) << "the cpu path's staging must cut the large regions";

  std::unique_ptr<AdamW> resumed;
  std::mt19937 rng(c.seed + 2);
  for (int s = 0; s < 6; ++s) {
    const Outcome o = test::kSixSteps[s];
    if (s == test::kResumeBeforeStep) {
      resumed = test::make_optimizer(c, dev, dev, split_opts, test::host_state(), buf_r, unused, rng_r);
      test::resume_into(*split, buf_s, *resumed, buf_r, dev);
    }
    AdamW& sp = resumed ? *resumed : *split;
    test::Buffers& bs = resumed ? buf_r : buf_s;
    test::make_grads(c, rng, g_ref, g_raw);
    test::make_special(c, o, g_raw);
    for (std::size_t r = 0; r < c.sizes.size(); ++r) {
      for (test::Buffers* b : {&bs, &buf_l, &buf_c}) dev.upload(b->grads[r], g_raw[r].data(), g_raw[r].size());
    }
    const double lr = 1e-3 * (1 + 0.3 * s);
    const StepResult a = sp.step(lr);
    const StepResult b = link->step(lr);
    const StepResult d = cpu->step(lr);
    for (AdamW* opt : {&sp, link.get(), cpu.get()}) opt->synchronize();
    test::expect_same_decision(a, b, o, s);
    test::expect_same_decision(a, d, o, s);
    const test::Snapshot ss = test::snapshot(sp, dev, bs), sl = test::snapshot(*link, dev, buf_l),
                         sc2 = test::snapshot(*cpu, dev, buf_c);
    for (std::size_t r = 0; r < c.sizes.size(); ++r) {
      const bool via_cpu = sp.path(r) == Path::cpu;
      EXPECT_TRUE(region_equal(ss, via_cpu ? sc2 : sl, r))
          << "step " << s << ", region " << r << " (" << to_string(sp.path(r))
          << "): the split differs from its path run alone";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, SplitTwins,
                         ::testing::Values(SplitCase{LinkMode::dma, GradType::fp32, StateType::fp32},
                                           SplitCase{LinkMode::dma, GradType::bf16, StateType::fp32},
                                           SplitCase{LinkMode::zero_copy, GradType::fp32, StateType::fp32},
                                           SplitCase{LinkMode::dma, GradType::fp32, StateType::bf16},
                                           SplitCase{LinkMode::dma, GradType::bf16, StateType::q8}),
                         [](const auto& info) {
                           return std::string(to_string(info.param.mode)) +
                                  (info.param.grad_type == GradType::bf16 ? "_bf16" : "_fp32") +
                                  (info.param.state == StateType::fp32 ? "" : std::string("_") + to_string(info.param.state) + "_state");
                         });

// A consumer that waits for region_event right after the step (no synchronize) must find the
// weights that step wrote: the event of a cpu region is the one the worker recorded after its
// upload, not the previous step's. Large cpu regions keep the worker busy for a while.
TEST(SplitEvents, ARegionEventAfterTheStepCoversTheWorkersUpload) {
  GHT_REQUIRE_GPU();
  Case c;
  c.sizes = {1 << 21, 1 << 20, 1 << 21, 1 << 20};
  c.decay = {true, true, true, false};
  c.grad_scale = {1.0, 1.0, 1.0, 1.0};
  c.grad_type = GradType::fp32;
  c.hyper.max_grad_norm = 0;
  DeviceMem dev;
  AdamWOptions o = opts_for(PathChoice::split, LinkMode::dma, StateType::fp32);
  o.cpu_share = 0.5;
  o.staging_bytes = 1 << 20;
  test::Buffers buf;
  std::vector<test::RefRegion> unused;
  std::mt19937 rng(c.seed);
  auto opt = test::make_optimizer(c, dev, dev, o, test::host_state(), buf, unused, rng);
  cudaStream_t consumer = nullptr;
  GHT_CUDA_TRY(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
  std::vector<std::vector<double>> g_ref;
  std::vector<std::vector<unsigned char>> g_raw;
  for (int s = 0; s < 3; ++s) {
    test::make_grads(c, rng, g_ref, g_raw);
    for (std::size_t r = 0; r < c.sizes.size(); ++r) dev.upload(buf.grads[r], g_raw[r].data(), g_raw[r].size());
    ASSERT_TRUE(opt->step(1e-3).taken);
    std::vector<std::vector<std::uint16_t>> seen(c.sizes.size());
    for (std::size_t r = 0; r < c.sizes.size(); ++r) {
      seen[r].resize(c.sizes[r]);
      GHT_CUDA_TRY(cudaStreamWaitEvent(consumer, opt->region_event(r), 0));
      GHT_CUDA_TRY(cudaMemcpyAsync(seen[r].data(), buf.weights[r], c.sizes[r] * sizeof(bf16), cudaMemcpyDeviceToHost,
                                   consumer));
    }
    GHT_CUDA_TRY(cudaStreamSynchronize(consumer));
    opt->synchronize();
    for (std::size_t r = 0; r < c.sizes.size(); ++r) {
      std::vector<std::uint16_t> final_w(c.sizes[r]);
      dev.download(final_w.data(), buf.weights[r], c.sizes[r] * sizeof(bf16));
      EXPECT_EQ(std::memcmp(seen[r].data(), final_w.data(), final_w.size() * 2), 0)
          << "step " << s << ", region " << r << " (" << to_string(opt->path(r))
          << "): its event was passed before its weights were written";
    }
  }
  (void)cudaStreamDestroy(consumer);
}

// ---- speculation with gradients in HBM ----------------------------------------------------------

TEST(SplitSpeculation, CpuRegionsWithGradientsInHbmEqualThePlainStep) {
  GHT_REQUIRE_GPU();
  for (GradType gt : {GradType::bf16, GradType::fp32}) {
    for (Outcome oc : {Outcome::kept, Outcome::clipped, Outcome::lr_changed, Outcome::nonfinite}) {
      Case c = split_case(gt);
      DeviceMem dev;
      AdamWOptions plain = opts_for(PathChoice::cpu, LinkMode::dma, StateType::fp32);
      AdamWOptions spec = plain;
      spec.speculate_host_bytes = std::size_t{16} << 20;
      test::run_speculation_twins(c, dev, plain, spec, [] { return test::host_state(); }, oc);
    }
  }
}

TEST(SplitSpeculation, BothPathsAtOnceEqualThePlainStep) {
  GHT_REQUIRE_GPU();
  for (LinkMode mode : {LinkMode::dma, LinkMode::zero_copy}) {
    for (Outcome oc : {Outcome::kept, Outcome::clipped, Outcome::lr_changed, Outcome::nonfinite}) {
      SCOPED_TRACE(std::string(to_string(mode)));
      Case c = split_case(GradType::fp32);
      DeviceMem dev;
      AdamWOptions plain = opts_for(PathChoice::split, mode, StateType::fp32);
      plain.cpu_share = 0.5;
      AdamWOptions spec = plain;
      spec.speculate_bytes = std::size_t{16} << 20;
      spec.speculate_host_bytes = std::size_t{16} << 20;
      test::run_speculation_twins(c, dev, plain, spec, [] { return test::host_state(); }, oc);
    }
  }
}

// ---- the share, the SM cap and the streams ------------------------------------------------------

TEST(SplitShare, TheDefaultIsTheCostModelsBestAndTheEndsAreOnePath) {
  GHT_REQUIRE_GPU();
  Case c = split_case(GradType::fp32);
  DeviceMem dev;
  tier::UpdateSplitInput in;
  std::uint64_t total = 0, largest = 0;
  for (std::size_t n : c.sizes) {
    in.params_grad_hbm += n;
    total += n;
    largest = std::max<std::uint64_t>(largest, n);
  }
  const double best = tier::predict_update_split(in, tier::resolve_link_numbers()).cpu_fraction;
  for (std::optional<double> share : {std::optional<double>(), std::optional<double>(0.0), std::optional<double>(1.0)}) {
    AdamWOptions o = opts_for(PathChoice::split, LinkMode::dma, StateType::fp32);
    o.cpu_share = share;
    test::Buffers buf;
    std::vector<test::RefRegion> unused;
    std::mt19937 rng(c.seed);
    auto opt = test::make_optimizer(c, dev, dev, o, test::host_state(), buf, unused, rng);
    const double want = share ? *share : best;  // GHT_OPT_CPU_SHARE's default, -1, is the best share
    EXPECT_EQ(opt->split_cpu_share(), want);
    std::uint64_t cpu_params = 0;
    for (std::size_t r = 0; r < c.sizes.size(); ++r) cpu_params += opt->path(r) == Path::cpu ? c.sizes[r] : 0;
    EXPECT_LE(std::abs(static_cast<double>(cpu_params) - want * static_cast<double>(total)),
              0.5 * static_cast<double>(largest));
  }
}

TEST(LinkKernel, TheSmCapChangesNoByteAndStreamsHaveTheLowestPriority) {
  GHT_REQUIRE_GPU();
  int least = 0, greatest = 0;
  GHT_CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  for (LinkMode mode : {LinkMode::dma, LinkMode::zero_copy}) {
    SCOPED_TRACE(std::string(to_string(mode)));
    Case c = split_case(GradType::bf16);
    c.steps = 3;
    c.hyper.max_grad_norm = 0;
    DeviceMem dev;
    AdamWOptions capped = opts_for(PathChoice::gpu_link, mode, StateType::fp32);
    capped.kernel_sms = 1;
    AdamWOptions derived = opts_for(PathChoice::gpu_link, mode, StateType::fp32);
    test::Buffers b1, b2;
    std::vector<test::RefRegion> unused;
    std::mt19937 r1(c.seed), r2(c.seed);
    auto one = test::make_optimizer(c, dev, dev, capped, test::host_state(), b1, unused, r1);
    auto auto_sms = test::make_optimizer(c, dev, dev, derived, test::host_state(), b2, unused, r2);
    EXPECT_EQ(one->link_kernel_sms(), 1);
    int sms = 0, dev_id = 0;
    GHT_CUDA_TRY(cudaGetDevice(&dev_id));
    GHT_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev_id));
    const tier::LinkNumbers L = tier::resolve_link_numbers();
    const double link_bps = mode == LinkMode::dma ? L.bidir_bps : L.kernel_read_bps + L.kernel_write_bps;
    EXPECT_EQ(auto_sms->link_kernel_sms(), link_kernel_sms(link_bps, L.hbm_bps, sms, LinkKernelLoad{12}));
    int prio = 1;
    GHT_CUDA_TRY(cudaStreamGetPriority(auto_sms->stream(), &prio));
    EXPECT_EQ(prio, least);
    std::mt19937 rng(c.seed + 9);
    std::vector<std::vector<double>> g_ref;
    std::vector<std::vector<unsigned char>> g_raw;
    for (int s = 0; s < c.steps; ++s) {
      test::make_grads(c, rng, g_ref, g_raw);
      for (std::size_t r = 0; r < c.sizes.size(); ++r) {
        dev.upload(b1.grads[r], g_raw[r].data(), g_raw[r].size());
        dev.upload(b2.grads[r], g_raw[r].data(), g_raw[r].size());
      }
      (void)one->step(1e-3);
      (void)auto_sms->step(1e-3);
      one->synchronize();
      auto_sms->synchronize();
      EXPECT_TRUE(test::bytes_equal(test::snapshot(*one, dev, b1), test::snapshot(*auto_sms, dev, b2))) << "step " << s;
    }
  }
}

}  // namespace
}  // namespace ght::optimizer
