// GPU test of kernels/cuda/router against kernels/cpu/router (fp32).
//
// Inputs are multiples of 1/8 in [-1, 1] with C = 64, so every logit is a multiple of 1/64 below
// 64 in magnitude: exact in fp32 whatever the summation order (cuBLASLt vs the CPU loop). The
// top-k selection can then be compared exactly: distinct logits differ by >= 1/64, so no
// near-tie can be ordered differently by two correct implementations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "common/gpu.hpp"
#include "kernels/cpu/permute.hpp"
#include "kernels/cpu/router.hpp"
#include "kernels/cuda/permute.hpp"
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

// ---- router_route_forward: router + permutation plan + gather, fused ---------------------------

template <typename T>
std::vector<unsigned char> bytes_of(const std::vector<T>& v) {
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  return {p, p + v.size() * sizeof(T)};
}

struct RouteCase {
  std::int64_t n;
  int e, k;
  bool norm;
  int c;
  bool duplicate_experts;  // pairs of identical router rows: every logit tied with its twin
};

// The fused call against the CPU ops (router_forward, moe_permute_plan, moe_permute_forward) and
// byte for byte against the three separate GPU calls, the losses included.
void run_route_case(const RouteCase& rc, std::uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "route N=" << rc.n << " E=" << rc.e << " K=" << rc.k
                                    << " norm=" << rc.norm << " C=" << rc.c
                                    << " twins=" << rc.duplicate_experts);
  const std::int64_t N = rc.n, A = N * rc.k;
  const int C = rc.c, E = rc.e, K = rc.k;
  const auto x = eighths(static_cast<std::size_t>(N * C), seed);
  auto wr = eighths(static_cast<std::size_t>(E) * C, seed + 1);
  if (rc.duplicate_experts)
    for (int e = 1; e < E; e += 2)
      std::copy_n(wr.begin() + static_cast<std::ptrdiff_t>(e - 1) * C, C,
                  wr.begin() + static_cast<std::ptrdiff_t>(e) * C);
  // CPU: the router, then the permutation of its selection.
  std::vector<float> logits(N * E), probs(N * E), tw(A);
  std::vector<std::int32_t> tidx(A), off(E + 1), src(A), dst(A);
  const auto losses = cpu::router_forward<float>(logits.data(), probs.data(), tidx.data(), tw.data(),
                                                 x.data(), wr.data(), N, C, E, K, rc.norm);
  cpu::moe_permute_plan(off.data(), src.data(), dst.data(), tidx.data(), N, K, E);
  std::vector<float> xp(A * C);
  cpu::moe_permute_forward<float>(xp.data(), x.data(), src.data(), N, K, C);

  TestStream stream;
  auto d_x = upload_bf16(x);
  auto d_wr = upload_bf16(wr);
  struct Out {
    DeviceBuffer<float> logits, probs, tw;
    DeviceBuffer<std::int32_t> tidx, off, src, dst;
    DeviceBuffer<bf16> xp;
    DeviceBuffer<kc::RouterLossesDevice> losses;
  };
  auto make = [&] {
    Out o{DeviceBuffer<float>(N * E), DeviceBuffer<float>(N * E), DeviceBuffer<float>(A),
          DeviceBuffer<std::int32_t>(A), DeviceBuffer<std::int32_t>(E + 1),
          DeviceBuffer<std::int32_t>(A), DeviceBuffer<std::int32_t>(A), DeviceBuffer<bf16>(A * C),
          DeviceBuffer<kc::RouterLossesDevice>(1)};
    o.probs.poison();
    o.tw.poison();
    o.tidx.poison();
    o.off.poison();
    o.src.poison();
    o.dst.poison();
    o.xp.poison();
    o.losses.poison();
    return o;
  };
  Out f = make(), sep = make(), plan_only = make();
  kc::router_route_forward(f.logits.get(), f.probs.get(), f.tidx.get(), f.tw.get(), f.losses.get(),
                           {f.off.get(), f.src.get(), f.dst.get(), f.xp.get()}, d_x.get(),
                           d_wr.get(), N, C, E, K, rc.norm, stream.get());
  // Without xp (the FP8 experts quantise while scattering instead): no rows gathered.
  kc::router_route_forward(plan_only.logits.get(), plan_only.probs.get(), plan_only.tidx.get(), plan_only.tw.get(),
                           plan_only.losses.get(), {plan_only.off.get(), plan_only.src.get(), plan_only.dst.get(), nullptr},
                           d_x.get(), d_wr.get(), N, C, E, K, rc.norm, stream.get());
  kc::router_forward(sep.logits.get(), sep.probs.get(), sep.tidx.get(), sep.tw.get(),
                     sep.losses.get(), nullptr, d_x.get(), d_wr.get(), N, C, E, K, rc.norm,
                     stream.get());
  kc::moe_permute_plan(sep.off.get(), sep.src.get(), sep.dst.get(), sep.tidx.get(), N, K, E,
                       stream.get());
  kc::moe_permute_forward(sep.xp.get(), d_x.get(), sep.src.get(), N, K, C, stream.get());
  stream.sync();

  EXPECT_TRUE(all_close("logits", f.logits.download(), logits, 0.0f, 0.0f));
  EXPECT_TRUE(all_close("probs", f.probs.download(), probs, 1e-7f, 1e-5f));
  EXPECT_TRUE(all_equal("topk_idx", f.tidx.download(), tidx));
  EXPECT_TRUE(all_close("topk_w", f.tw.download(), tw, 1e-7f, 1e-5f));
  EXPECT_TRUE(all_equal("expert_offsets", f.off.download(), off));
  EXPECT_TRUE(all_equal("src_token", f.src.download(), src));
  EXPECT_TRUE(all_equal("dst_row", f.dst.download(), dst));
  EXPECT_TRUE(all_close("xp", download_f32(f.xp), xp, 0.0f, 0.0f));
  const auto got = f.losses.download()[0];
  EXPECT_NEAR(got.aux, losses.aux, 1e-5 * std::fabs(losses.aux) + 1e-7);
  EXPECT_NEAR(got.z, losses.z, 1e-5 * std::fabs(losses.z) + 1e-7);

  EXPECT_EQ(bytes_of(f.logits.download()), bytes_of(sep.logits.download())) << "logits";
  EXPECT_EQ(bytes_of(f.probs.download()), bytes_of(sep.probs.download())) << "probs";
  EXPECT_EQ(bytes_of(f.tw.download()), bytes_of(sep.tw.download())) << "topk_w";
  EXPECT_EQ(bytes_of(f.tidx.download()), bytes_of(sep.tidx.download())) << "topk_idx";
  EXPECT_EQ(bytes_of(f.off.download()), bytes_of(sep.off.download())) << "expert_offsets";
  EXPECT_EQ(bytes_of(f.src.download()), bytes_of(sep.src.download())) << "src_token";
  EXPECT_EQ(bytes_of(f.dst.download()), bytes_of(sep.dst.download())) << "dst_row";
  EXPECT_EQ(bytes_of(f.xp.download()), bytes_of(sep.xp.download())) << "xp";
  EXPECT_EQ(bytes_of(f.losses.download()), bytes_of(sep.losses.download())) << "losses";

  EXPECT_EQ(bytes_of(plan_only.logits.download()), bytes_of(f.logits.download())) << "logits without xp";
  EXPECT_EQ(bytes_of(plan_only.probs.download()), bytes_of(f.probs.download())) << "probs without xp";
  EXPECT_EQ(bytes_of(plan_only.tw.download()), bytes_of(f.tw.download())) << "topk_w without xp";
  EXPECT_EQ(bytes_of(plan_only.tidx.download()), bytes_of(f.tidx.download())) << "topk_idx without xp";
  EXPECT_EQ(bytes_of(plan_only.off.download()), bytes_of(f.off.download())) << "expert_offsets without xp";
  EXPECT_EQ(bytes_of(plan_only.src.download()), bytes_of(f.src.download())) << "src_token without xp";
  EXPECT_EQ(bytes_of(plan_only.dst.download()), bytes_of(f.dst.download())) << "dst_row without xp";
  EXPECT_EQ(bytes_of(plan_only.losses.download()), bytes_of(f.losses.download())) << "losses without xp";
}

// Top-k 1/2/4/8, E up to 128 (and the router's limit, 256), tied logits (the inputs are
// multiples of 1/8, so equal logits are common; twins make every logit tied), one or several
// blocks, tiles of one and of two 512-assignment rounds (N = 20000, K = 8: 632 per tile), C
// not a multiple of 8 (the scalar gather).
TEST(CudaRouter, RouteForwardMatchesCpuAndSeparateCalls) {
  GHT_REQUIRE_GPU();
  const RouteCase cases[] = {
      {300, 64, 4, true, 64, false},   {77, 8, 2, false, 64, true},   {50, 128, 8, true, 64, true},
      {1100, 32, 1, true, 64, false},  {20000, 128, 8, false, 64, false},
      {513, 16, 2, true, 36, false},   {4096, 48, 4, true, 64, true}, {9, 256, 8, false, 24, false},
      {3000, 128, 1, false, 64, true},
  };
  std::uint32_t seed = 4000;
  for (const auto& rc : cases) run_route_case(rc, seed += 10);
}

TEST(CudaRouter, RouteForwardRejectsMissingOutputs) {
  EXPECT_THROW(kc::router_route_forward(nullptr, nullptr, nullptr, nullptr, nullptr, {}, nullptr,
                                        nullptr, 4, 8, 4, 2, true, nullptr),
               ght::logic_error);
  // xp may be null (no gather); the plan's outputs may not.
  auto* p = reinterpret_cast<std::int32_t*>(std::uintptr_t{256});
  for (const kc::RoutePermutation perm : {kc::RoutePermutation{p, p, nullptr, nullptr},
                                          kc::RoutePermutation{p, nullptr, p, nullptr},
                                          kc::RoutePermutation{nullptr, p, p, nullptr}}) {
    EXPECT_THROW(kc::router_route_forward(nullptr, nullptr, nullptr, nullptr, nullptr, perm, nullptr, nullptr, 4, 8,
                                          4, 2, true, nullptr),
                 ght::logic_error);
  }
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
