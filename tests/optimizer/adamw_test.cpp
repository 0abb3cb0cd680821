// The cpu path against the fp64 reference, the non-finite guard, the kernels' determinism and
// the path/option plumbing. GPU paths: adamw_gpu_test.cu.
#include "optimizer/adamw.hpp"
#include "tier/topology.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "optimizer/adamw_kernels.hpp"
#include "optimizer/adamw_harness.hpp"
#include "optimizer/cpu_threads.hpp"
#include "optimizer/detail/memory.hpp"
#include "tier/error.hpp"

namespace ght::optimizer {
namespace {

using test::Case;

AdamWOptions cpu_options(int threads = 0) {
  AdamWOptions o;
  o.path = PathChoice::cpu;
  o.cpu_threads = threads;
  return o;
}

struct CpuCase {
  GradType grad_type;
  Case::Clip clip;
};

class AdamWCpuReference : public ::testing::TestWithParam<CpuCase> {};

TEST_P(AdamWCpuReference, TenStepsMatchFp64Reference) {
  Case c;
  c.grad_type = GetParam().grad_type;
  c.clip = GetParam().clip;
  test::Mem host;
  test::run_reference_case(c, host, host, cpu_options(), test::host_state(), Path::cpu);
}

// The delayed update's weight prediction: weights bf16(p + x·(p − p_before)), master unchanged.
TEST(AdamWCpu, WeightExtrapolationWritesThePredictedWeights) {
  Case c;
  c.steps = 3;
  c.hyper.weight_extrapolation = 2;
  test::Mem host;
  test::run_reference_case(c, host, host, cpu_options(), test::host_state(), Path::cpu);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AdamWCpuReference,
    ::testing::Values(CpuCase{GradType::bf16, Case::Clip::inactive},
                      CpuCase{GradType::bf16, Case::Clip::active},
                      CpuCase{GradType::fp32, Case::Clip::inactive},
                      CpuCase{GradType::fp32, Case::Clip::active},
                      CpuCase{GradType::fp32, Case::Clip::disabled}),
    [](const auto& info) {
      const char* clip = info.param.clip == Case::Clip::active     ? "clip_active"
                         : info.param.clip == Case::Clip::inactive ? "clip_inactive"
                                                                   : "clip_disabled";
      return std::string(info.param.grad_type == GradType::bf16 ? "bf16_" : "fp32_") + clip;
    });

TEST(AdamWCpu, NonFiniteGuardLeavesEveryByteUnchanged) {
  for (GradType t : {GradType::bf16, GradType::fp32}) {
    Case c;
    c.grad_type = t;
    test::Mem host;
    test::run_nonfinite_case(c, host, host, cpu_options(), test::host_state(), Path::cpu);
  }
}

TEST(AdamWCpu, SingleThreadAndTeamGiveIdenticalState) {
  Case c;
  c.steps = 3;
  c.clip = Case::Clip::active;
  c.sizes = {100003, 777, 70001};  // above the inline threshold, so teams really split the work
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, resolve_cpu_threads(0)}) {
    std::mt19937 rng(c.seed);
    test::Mem host;
    test::Buffers buf;
    std::vector<test::RefRegion> ref;
    std::vector<std::vector<double>> g_ref;
    std::vector<std::vector<unsigned char>> g_raw;
    c.hyper.max_grad_norm = 1.0;
    auto opt = test::make_optimizer(c, host, host, cpu_options(threads),
                                    test::host_state(), buf, ref, rng);
    for (int s = 0; s < c.steps; ++s) {
      test::make_grads(c, rng, g_ref, g_raw);
      for (std::size_t r = 0; r < c.sizes.size(); ++r) {
        std::memcpy(buf.grads[r], g_raw[r].data(), g_raw[r].size());
      }
      ASSERT_TRUE(opt->step(1e-3).taken);
    }
    std::vector<float> all;
    for (std::size_t r = 0; r < c.sizes.size(); ++r) {
      std::vector<float> p(c.sizes[r]), m(c.sizes[r]), v(c.sizes[r]);
      opt->save_state(r, p.data(), m.data(), v.data());
      all.insert(all.end(), p.begin(), p.end());
      all.insert(all.end(), m.begin(), m.end());
      all.insert(all.end(), v.begin(), v.end());
    }
    results.push_back(std::move(all));
  }
  for (std::size_t k = 1; k < results.size(); ++k) {
    ASSERT_EQ(results[k].size(), results[0].size());
    EXPECT_EQ(std::memcmp(results[k].data(), results[0].data(), results[0].size() * sizeof(float)), 0)
        << "thread count changed the result";
  }
}

TEST(AdamWKernels, StepScalarsFoldBiasCorrectionAndDecay) {
  AdamWHyper h;
  h.beta1 = 0.9;
  h.beta2 = 0.99;
  h.weight_decay = 0.1;
  const StepScalars k = make_step_scalars(h, 0.01, 3, true, 0.5);
  EXPECT_FLOAT_EQ(k.step_size, static_cast<float>(0.01 / (1 - std::pow(0.9, 3))));
  EXPECT_FLOAT_EQ(k.inv_sqrt_bc2, static_cast<float>(1 / std::sqrt(1 - std::pow(0.99, 3))));
  EXPECT_FLOAT_EQ(k.decay, static_cast<float>(1 - 0.01 * 0.1));
  EXPECT_FLOAT_EQ(k.grad_scale, 0.5f);
  EXPECT_EQ(make_step_scalars(h, 0.01, 3, false, 1.0).decay, 1.0f);
  EXPECT_THROW((void)make_step_scalars(h, 0.01, 0, true, 1.0), ght::logic_error);
  EXPECT_THROW((void)make_step_scalars(h, -1.0, 1, true, 1.0), ght::logic_error);
  EXPECT_THROW((void)make_step_scalars(h, 0.01, 1, true, 0.0), ght::logic_error);
}

TEST(AdamWKernels, SumOfSquaresIsDeterministicAndAccurate) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  const std::size_t n = 3 * kSumsqBlock + 12345;
  std::vector<float> g(n);
  std::vector<std::uint16_t> gb(n);
  long double exact = 0, exact_b = 0;
  for (std::size_t i = 0; i < n; ++i) {
    g[i] = nd(rng);
    gb[i] = float_to_bf16_bits(g[i]);
    exact += static_cast<long double>(g[i]) * g[i];
    const long double b = bf16_bits_to_float(gb[i]);
    exact_b += b * b;
  }
  const double s1 = grad_sumsq_cpu(g.data(), GradType::fp32, n, 1);
  for (int t : {2, 3, resolve_cpu_threads(0)}) {
    const double st = grad_sumsq_cpu(g.data(), GradType::fp32, n, t);
    EXPECT_EQ(std::memcmp(&s1, &st, sizeof s1), 0) << "threads " << t;
  }
  EXPECT_NEAR(s1, static_cast<double>(exact), 1e-12 * static_cast<double>(exact));
  EXPECT_NEAR(grad_sumsq_cpu(gb.data(), GradType::bf16, n, 2), static_cast<double>(exact_b),
              1e-12 * static_cast<double>(exact_b));
  g[n - 1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(grad_sumsq_cpu(g.data(), GradType::fp32, n, 2)));
  g[n - 1] = -std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(grad_sumsq_cpu(g.data(), GradType::fp32, n, 2)));
  // Finite fp32 extremes must not overflow the sum.
  g.assign(n, std::numeric_limits<float>::max());
  EXPECT_TRUE(std::isfinite(grad_sumsq_cpu(g.data(), GradType::fp32, n, 2)));
}

TEST(AdamWKernels, CpuKernelWithoutWeightTargetMatchesWithWeight) {
  const std::size_t n = 100003;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> p(n), m(n), v(n), g(n);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = nd(rng);
    m[i] = 0.1f * nd(rng);
    v[i] = std::abs(nd(rng));
    g[i] = nd(rng);
  }
  auto p2 = p, m2 = m, v2 = v;
  std::vector<bf16> w(n);
  const StepScalars k = make_step_scalars(AdamWHyper{}, 1e-2, 4, true, 0.7);
  adamw_cpu({p.data(), m.data(), v.data(), g.data(), GradType::fp32, w.data(), n}, k, 2);
  adamw_cpu({p2.data(), m2.data(), v2.data(), g.data(), GradType::fp32, nullptr, n}, k, 1);
  EXPECT_EQ(std::memcmp(p.data(), p2.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(m.data(), m2.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(v.data(), v2.data(), n * 4), 0);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(w[i].bits, float_to_bf16_bits(p[i]));
}

// SMs of the gpu_link kernel: kLinkKernelMargin (4) times the rate the link feeds state, at each
// SM's share of HBM. H200 on PCIe (the pcie5 profile): 4 · 99.8 GB/s · (24 + 6) / 24 over
// 4.43 TB/s / 132 = 14.87, so 15 SMs; bf16 state: 4 · 99.8 · (16 + 6) / 16 / 33.56 = 16.4, 17.
// GH200 zero-copy (kernel read 342 + write 297 GB/s, HBM 3.4 TB/s): 124.03, so 125 of 132.
TEST(AdamWKernels, LinkKernelSmsFollowTheLinkAndHbmRates) {
  const LinkKernelLoad fp32{12}, bf16{8};
  EXPECT_EQ(link_kernel_sms(99.8e9, 4.43e12, 132, fp32), 15);
  EXPECT_EQ(link_kernel_sms(99.8e9, 4.43e12, 132, bf16), 17);
  EXPECT_EQ(link_kernel_sms(639e9, 3.4e12, 132, fp32), 125);
  EXPECT_EQ(link_kernel_sms(1e15, 3.4e12, 132, fp32), 132);  // faster than HBM: every SM
  EXPECT_EQ(link_kernel_sms(1e6, 3.4e12, 132, fp32), 1);     // at least one
  EXPECT_EQ(link_kernel_sms(0, 3.4e12, 132, fp32), 132);     // unknown rates: no cap
  EXPECT_EQ(link_kernel_sms(99.8e9, 0, 132, fp32), 132);
  EXPECT_THROW((void)link_kernel_sms(99.8e9, 4.43e12, 0, fp32), ght::logic_error);
  EXPECT_THROW((void)link_kernel_sms(99.8e9, 4.43e12, 132, LinkKernelLoad{0}), ght::logic_error);
}

// The parameters the link delivers, not its bytes, set the SMs: where only part of each region's
// state is on the host, the link brings more parameters per second and the kernel updates them
// whole. A compute-bound kernel (q8) is sized at its own rate. H100 on PCIe (probed: 89.5 GB/s
// both ways, 3.17 TB/s HBM), q8 (6.03 B of state per parameter) at 83 Gparam/s on 132 SMs:
// all on the host 4 · 7.42 / 0.629 = 47.2, so 48 SMs (at the HBM share alone: 23); m and v alone
// on the host (2.03 B) 140.1: every SM. fp32 with only the master on the host (4 B of 12): 44.6,
// so 45 of the 15 that whole regions need.
TEST(AdamWKernels, LinkKernelSmsCountParametersAndTheKernelsOwnRate) {
  const double q8 = state_bytes_per_param(StateType::q8);
  EXPECT_EQ(link_kernel_sms(89.5e9, 3.17e12, 132, LinkKernelLoad{q8}), 23);
  EXPECT_EQ(link_kernel_sms(89.5e9, 3.17e12, 132, LinkKernelLoad{q8, 0, 83e9}), 48);
  EXPECT_EQ(link_kernel_sms(89.5e9, 3.17e12, 132, LinkKernelLoad{q8, q8 - 4, 83e9}), 132);
  EXPECT_EQ(link_kernel_sms(99.8e9, 4.43e12, 132, LinkKernelLoad{12, 4}), 45);
  EXPECT_EQ(link_kernel_sms(99.8e9, 4.43e12, 132, LinkKernelLoad{12, 12}),
            link_kernel_sms(99.8e9, 4.43e12, 132, LinkKernelLoad{12}));
  // A kernel rate above its HBM share changes nothing.
  EXPECT_EQ(link_kernel_sms(99.8e9, 4.43e12, 132, LinkKernelLoad{12, 0, 1e15}), 15);
}

// The update's kernels side by side: 1.97B gpu_link and 5.45B device parameters left (m and v of
// the 20 coldest experts of each of 10 seed-21b layers on the host) share 132 SMs by parameters,
// 35 and 97; the gpu_link share never exceeds the kernels' own width, and each path keeps one SM.
TEST(AdamWKernels, SplitUpdateSmsSharesByParametersWithinTheLinkKernelsWidth) {
  EXPECT_EQ(split_update_sms(132, 1.97e9, 5.45e9, 132), 35);
  EXPECT_EQ(split_update_sms(132, 1.97e9, 5.45e9, 15), 15);  // fp32 state: 15 keep pace with the link
  EXPECT_EQ(split_update_sms(132, 1e3, 1e12, 132), 1);
  EXPECT_EQ(split_update_sms(132, 1e12, 1e3, 132), 131);
  EXPECT_EQ(split_update_sms(132, 0, 5e9, 132), 0);  // one path alone: no split
  EXPECT_EQ(split_update_sms(132, 5e9, 0, 132), 0);
  EXPECT_EQ(split_update_sms(1, 5e9, 5e9, 1), 0);
  EXPECT_THROW((void)split_update_sms(132, -1, 5e9, 132), ght::logic_error);
}

TEST(AdamWOptions, PathChoiceParsing) {
  EXPECT_EQ(parse_path_choice("auto"), PathChoice::automatic);
  EXPECT_EQ(parse_path_choice("GPU_LINK"), PathChoice::gpu_link);
  EXPECT_EQ(parse_path_choice("cpu"), PathChoice::cpu);
  EXPECT_EQ(parse_path_choice("device"), PathChoice::device);
  try {
    (void)parse_path_choice("gpu");
    FAIL() << "expected config_error";
  } catch (const ght::config_error& e) {
    EXPECT_NE(std::string(e.what()).find("'gpu'"), std::string::npos) << e.what();
  }
}

TEST(AdamWOptions, RejectsBadRegionsAndImpossiblePaths) {
  std::vector<float> g(8);
  Region a{"a", 8, true, nullptr, g.data(), GradType::fp32};
  EXPECT_THROW(AdamW({a, a}, cpu_options()), ght::logic_error);
  Region empty{"e", 0, true, nullptr, g.data(), GradType::fp32};
  EXPECT_THROW(AdamW({empty}, cpu_options()), ght::logic_error);
  if (!detail::gpu_available()) {
    AdamWOptions o;
    o.path = PathChoice::gpu_link;
    EXPECT_THROW(AdamW({a}, o), ght::logic_error);
    o.path = PathChoice::automatic;
    AdamW opt({a}, o);
    EXPECT_EQ(opt.path(0), Path::cpu);  // auto without a GPU
  }
}

TEST(AdamWOptions, StepPhasesAreChecked) {
  std::vector<float> g(64, 0.5f);
  AdamW opt({Region{"a", 64, true, nullptr, g.data(), GradType::fp32}}, cpu_options());
  EXPECT_THROW(opt.update_region(0), ght::logic_error);  // before begin_step
  ASSERT_TRUE(opt.begin_step(1e-3).taken);
  opt.update_region(0);
  EXPECT_THROW(opt.update_region(0), ght::logic_error);  // twice in a step
  EXPECT_THROW(opt.update_region(1), ght::logic_error);  // out of range
  EXPECT_EQ(opt.num_chunks(0), 1u);
  EXPECT_EQ(opt.link_mode(0), LinkMode::zero_copy);  // not a gpu_link region
  EXPECT_EQ(to_string(LinkMode::dma), "dma");
  // The default, auto: in place over a coherent C2C link, through the copy engines otherwise.
  EXPECT_EQ(link_mode_from_config(),
            tier::topology().link == LinkKind::c2c ? LinkMode::zero_copy : LinkMode::dma);
  if (!detail::gpu_available()) {
    EXPECT_EQ(opt.region_event(0), nullptr);  // no GPU events on the host path
  }
}

}  // namespace
}  // namespace ght::optimizer
