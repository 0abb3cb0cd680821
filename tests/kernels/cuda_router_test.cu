// GPU test of kernels/cuda/router against kernels/cpu/router (fp32).
//
// Inputs are multiples of 1/8 in [-1, 1] with C = 64, so every logit is a multiple of 1/64 below
// 64 in magnitude: exact in fp32 whatever the summation order (cuBLASLt vs the CPU loop). The
// top-k selection can then be compared exactly: distinct logits differ by >= 1/64, so no
// near-tie can be ordered differently by two correct implementations.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/gpu.hpp"
#include "kernels/cpu/router.hpp"
#include "kernels/cuda/router.hpp"
#include "kernels/cuda_test_util.hpp"
#include "tier/error.hpp"

namespace {

using namespace ght::test;
namespace kc = ght::kernels::cuda;
namespace cpu = ght::kernels::cpu;

std::vector<float> eighths(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(1, 8);
  std::bernoulli_distribution sign(0.5);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(sign(gen) ? d(gen) : -d(gen)) / 8.0f;
  return v;
}

std::vector<float> sub(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> r(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) r[i] = a[i] - b[i];
  return r;
}

struct Case {
  std::int64_t n;
  int e, k;
  bool norm;
};
const Case kCases[] = {{300, 64, 4, true}, {77, 8, 2, false}, {50, 128, 8, true},
                       {40, 200, 6, false}, {1100, 32, 1, true}};
constexpr int kC = 64;

void run_case(const Case& c, std::uint32_t seed, bool with_dw) {
  SCOPED_TRACE(::testing::Message() << "N=" << c.n << " E=" << c.e << " K=" << c.k
                                    << " norm=" << c.norm << " dtopk_w=" << with_dw);
  const std::int64_t N = c.n;
  const auto x = eighths(static_cast<std::size_t>(N * kC), seed);
  const auto wr = eighths(static_cast<std::size_t>(c.e) * kC, seed + 1);
  std::vector<float> logits(N * c.e), probs(N * c.e), tw(N * c.k);
  std::vector<std::int32_t> tidx(N * c.k);
  const auto losses = cpu::router_forward<float>(logits.data(), probs.data(), tidx.data(), tw.data(),
                                                 x.data(), wr.data(), N, kC, c.e, c.k, c.norm);
  std::vector<std::int32_t> counts(c.e, 0);
  for (auto i : tidx) ++counts[i];

  TestStream stream;
  auto d_x = upload_bf16(x);
  auto d_wr = upload_bf16(wr);
  DeviceBuffer<float> d_logits(logits.size()), d_probs(probs.size()), d_tw(tw.size());
  DeviceBuffer<std::int32_t> d_tidx(tidx.size()), d_counts(c.e);
  DeviceBuffer<kc::RouterLossesDevice> d_losses(1);
  d_probs.poison();
  d_tw.poison();
  kc::router_forward(d_logits.get(), d_probs.get(), d_tidx.get(), d_tw.get(), d_losses.get(),
                     d_counts.get(), d_x.get(), d_wr.get(), N, kC, c.e, c.k, c.norm, stream.get());
  stream.sync();
  EXPECT_TRUE(all_close("logits", d_logits.download(), logits, 0.0f, 0.0f));
  EXPECT_TRUE(all_close("probs", d_probs.download(), probs, 1e-7f, 1e-5f));
  EXPECT_TRUE(all_equal("topk_idx", d_tidx.download(), tidx));
  EXPECT_TRUE(all_close("topk_w", d_tw.download(), tw, 1e-7f, 1e-5f));
  EXPECT_TRUE(all_equal("expert_counts", d_counts.download(), counts));
  const auto got = d_losses.download()[0];
  EXPECT_NEAR(got.aux, losses.aux, 1e-5 * std::fabs(losses.aux) + 1e-7);
  EXPECT_NEAR(got.z, losses.z, 1e-5 * std::fabs(losses.z) + 1e-7);

  // Backward, fed the CPU forward's tensors (identical up to fp32 rounding).
  const auto dtw = random_bf16_values(static_cast<std::size_t>(N * c.k), seed + 2);
  const auto dx0 = random_bf16_values(static_cast<std::size_t>(N * kC), seed + 3, -0.1f, 0.1f);
  const auto dwr0 = random_bf16_values(static_cast<std::size_t>(c.e) * kC, seed + 4, -0.1f, 0.1f);
  const float aux_grad = 0.3f, z_grad = 0.2f;
  std::vector<float> dx = dx0, dwr = dwr0;
  cpu::router_backward<float>(dx.data(), dwr.data(), with_dw ? dtw.data() : nullptr, aux_grad,
                              z_grad, logits.data(), probs.data(), tidx.data(), tw.data(),
                              x.data(), wr.data(), N, kC, c.e, c.k, c.norm);
  DeviceBuffer<float> c_logits(logits), c_probs(probs), c_tw(tw), d_dtw(dtw), d_dwr(dwr0);
  DeviceBuffer<std::int32_t> c_tidx(tidx);
  auto d_dx = upload_bf16(dx0);
  kc::router_backward(d_dx.get(), d_dwr.get(), with_dw ? d_dtw.get() : nullptr, aux_grad, z_grad,
                      c_logits.get(), c_probs.get(), c_tidx.get(), c_tw.get(), d_x.get(),
                      d_wr.get(), N, kC, c.e, c.k, c.norm, stream.get());
  stream.sync();
  // dlogits is rounded to bf16 for the GEMMs: ~2^-9 relative on each term of dx and dWr.
  const float sx = max_abs(sub(dx, dx0)), sw = max_abs(sub(dwr, dwr0));
  EXPECT_TRUE(all_close("dx", download_f32(d_dx), dx, 2e-2f * sx, 8e-3f));
  EXPECT_TRUE(all_close("dwr", d_dwr.download(), dwr, 2e-2f * sw, 1e-3f));
}

TEST(CudaRouter, ForwardBackwardMatchCpu) {
  GHT_REQUIRE_GPU();
  std::uint32_t seed = 1;
  for (const auto& c : kCases) run_case(c, seed += 10, true);
}

TEST(CudaRouter, BackwardWithoutCombineGradient) {
  GHT_REQUIRE_GPU();
  run_case(kCases[0], 777, false);
  run_case(kCases[1], 778, false);
}

TEST(CudaRouter, RejectsBadTopK) {
  EXPECT_THROW(kc::router_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                  nullptr, 4, 8, 4, 5, true, nullptr),
               ght::logic_error);
  EXPECT_THROW(kc::router_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                  nullptr, 4, 8, 300, 2, true, nullptr),
               ght::logic_error);
}

}  // namespace
