// Counting-sort permutation plan (stable, offsets), gather/combine vs naive, backward vs FD.
#include "kernels/cpu/permute.hpp"

#include <gtest/gtest.h>

#include <tuple>

#include <numeric>
#include <random>

#include "kernels/fd_check.hpp"
#include "tier/error.hpp"

namespace cpu = ght::kernels::cpu;
using S3 = std::tuple<int, int, int>;
using ght::test::randn;

namespace {
std::vector<std::int32_t> random_routing(int N, int K, int E, std::uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<std::int32_t> idx(N * K);
  for (int t = 0; t < N; ++t) {
    std::vector<std::int32_t> e(E);
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end(), g);
    for (int k = 0; k < K; ++k) idx[t * K + k] = e[k];  // distinct experts per token
  }
  return idx;
}
}  // namespace

TEST(Permute, PlanIsAStableCountingSort) {
  for (auto [N, K, E] : {S3{1, 1, 1}, S3{13, 2, 5}, S3{5000, 3, 7}}) {  // 15000 > one block
    auto idx = random_routing(N, K, E, N);
    std::vector<std::int32_t> off(E + 1), src(N * K), dst(N * K);
    cpu::moe_permute_plan(off.data(), src.data(), dst.data(), idx.data(), N, K, E);
    // reference: for each expert in order, assignments in increasing t·K + k
    std::vector<std::int32_t> rsrc, roff = {0};
    std::vector<std::int32_t> rdst(N * K);
    for (int e = 0; e < E; ++e) {
      for (int a = 0; a < N * K; ++a)
        if (idx[a] == e) {
          rdst[a] = static_cast<std::int32_t>(rsrc.size());
          rsrc.push_back(a / K);
        }
      roff.push_back(static_cast<std::int32_t>(rsrc.size()));
    }
    EXPECT_EQ(off, roff);
    EXPECT_EQ(src, rsrc);
    EXPECT_EQ(dst, rdst);
  }
}

TEST(Permute, BadExpertIdThrows) {
  const std::vector<std::int32_t> idx = {0, 4};
  std::vector<std::int32_t> off(5), src(2), dst(2);
  EXPECT_THROW(cpu::moe_permute_plan(off.data(), src.data(), dst.data(), idx.data(), 1, 2, 4),
               ght::logic_error);
}

TEST(Permute, GatherCombineAndBackward) {
  const int N = 9, K = 2, E = 4, C = 5;
  auto idx = random_routing(N, K, E, 3);
  std::vector<std::int32_t> off(E + 1), src(N * K), dst(N * K);
  cpu::moe_permute_plan(off.data(), src.data(), dst.data(), idx.data(), N, K, E);
  auto x = randn<double>(N * C, 1), yp = randn<double>(N * K * C, 2), tw = randn<double>(N * K, 3);
  // forward vs naive
  std::vector<double> xp(N * K * C), out(N * C);
  cpu::moe_permute_forward(xp.data(), x.data(), src.data(), N, K, C);
  cpu::moe_unpermute_forward(out.data(), yp.data(), tw.data(), dst.data(), N, K, C);
  for (int t = 0; t < N; ++t)
    for (int k = 0; k < K; ++k)
      for (int c = 0; c < C; ++c) {
        EXPECT_EQ(xp[dst[t * K + k] * C + c], x[t * C + c]);
      }
  std::vector<double> ref(N * C, 0.0);
  for (int t = 0; t < N; ++t)
    for (int k = 0; k < K; ++k)
      for (int c = 0; c < C; ++c) ref[t * C + c] += tw[t * K + k] * yp[dst[t * K + k] * C + c];
  ght::test::expect_close(out, ref, 1e-14, 1e-14, "unpermute");
  // backward of permute: loss = <gxp, xp>
  auto gxp = randn<double>(N * K * C, 4);
  auto loss_p = [&] {
    cpu::moe_permute_forward(xp.data(), x.data(), src.data(), N, K, C);
    return ght::test::dot(gxp, xp);
  };
  std::vector<double> dx(N * C, 7.0);
  cpu::moe_permute_backward(dx.data(), gxp.data(), dst.data(), N, K, C);
  ght::test::fd_check(loss_p, x, dx, "permute dx");
  // backward of the combine: loss = <gout, out>
  auto gout = randn<double>(N * C, 5);
  auto loss_u = [&] {
    cpu::moe_unpermute_forward(out.data(), yp.data(), tw.data(), dst.data(), N, K, C);
    return ght::test::dot(gout, out);
  };
  std::vector<double> dyp(N * K * C), dtw(N * K);
  cpu::moe_unpermute_backward(dyp.data(), dtw.data(), gout.data(), yp.data(), tw.data(), dst.data(),
                              N, K, C);
  ght::test::fd_check(loss_u, yp, dyp, "unpermute dyp");
  ght::test::fd_check(loss_u, tw, dtw, "unpermute dtopk_w");
}
