// Router: top-k order and ties, renormalisation, the HF aux loss and the z-loss; backward through
// all of them vs FD in double (inputs chosen with clear gaps so the top-k set cannot flip).
#include "kernels/cpu/router.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "kernels/fd_check.hpp"

namespace cpu = ght::kernels::cpu;
using ght::test::randn;

namespace {

// HF transformers load_balancing_loss_func for one layer, no attention mask, written as HF does:
// tokens_per_expert = mean_t one_hot(selected) (K, E); router_prob = mean_t softmax (E);
// aux = E · sum(tokens_per_expert · router_prob).
double hf_aux(const std::vector<double>& probs, const std::vector<std::int32_t>& idx, int N, int E,
              int K) {
  std::vector<double> tpe(K * E, 0.0), rp(E, 0.0);
  for (int t = 0; t < N; ++t) {
    for (int k = 0; k < K; ++k) tpe[k * E + idx[t * K + k]] += 1.0 / N;
    for (int e = 0; e < E; ++e) rp[e] += probs[t * E + e] / N;
  }
  double s = 0;
  for (int k = 0; k < K; ++k)
    for (int e = 0; e < E; ++e) s += tpe[k * E + e] * rp[e];
  return s * E;
}

// Smallest gap between consecutive sorted logits among each token's top K+1.
double min_gap(const std::vector<double>& logits, int N, int E, int K) {
  double g = 1e300;
  for (int t = 0; t < N; ++t) {
    std::vector<double> l(logits.begin() + t * E, logits.begin() + (t + 1) * E);
    std::sort(l.rbegin(), l.rend());
    for (int k = 0; k < std::min(K + 1, E) - 1; ++k) g = std::min(g, l[k] - l[k + 1]);
  }
  return g;
}

}  // namespace

TEST(Router, TopKOrderTiesAndRenormalisation) {
  const int N = 1, C = 1, E = 4;
  const std::vector<double> x = {1.0}, wr = {0.0, 2.0, 2.0, 1.0};  // logits 0, 2, 2, 1
  std::vector<double> logits(E), probs(E), w(3);
  std::vector<std::int32_t> idx(3);
  cpu::router_forward(logits.data(), probs.data(), idx.data(), w.data(), x.data(), wr.data(), N, C,
                      E, 3, false);
  EXPECT_EQ(idx, (std::vector<std::int32_t>{1, 2, 3}));  // tie 1 vs 2 goes to the lower index
  EXPECT_DOUBLE_EQ(w[0], probs[1]);
  EXPECT_DOUBLE_EQ(w[2], probs[3]);
  cpu::router_forward(logits.data(), probs.data(), idx.data(), w.data(), x.data(), wr.data(), N, C,
                      E, 3, true);
  EXPECT_NEAR(w[0] + w[1] + w[2], 1.0, 1e-15);
  EXPECT_NEAR(w[2], probs[3] / (probs[1] + probs[2] + probs[3]), 1e-15);
}

TEST(Router, UniformRouterGivesAuxTopKAndZLogE2) {
  const int N = 10, C = 3, E = 8, K = 2;
  auto x = randn<double>(N * C, 1);
  std::vector<double> wr(E * C, 0.0), logits(N * E), probs(N * E), w(N * K);
  std::vector<std::int32_t> idx(N * K);
  const auto l = cpu::router_forward(logits.data(), probs.data(), idx.data(), w.data(), x.data(),
                                     wr.data(), N, C, E, K, true);
  EXPECT_NEAR(l.aux, K, 1e-12);
  EXPECT_NEAR(l.z, std::log(E) * std::log(E), 1e-12);
}

TEST(Router, LossesMatchHfFormulaAndNaiveZ) {
  const int N = 37, C = 8, E = 6, K = 2;
  auto x = randn<double>(N * C, 2), wr = randn<double>(E * C, 3);
  std::vector<double> logits(N * E), probs(N * E), w(N * K);
  std::vector<std::int32_t> idx(N * K);
  const auto l = cpu::router_forward(logits.data(), probs.data(), idx.data(), w.data(), x.data(),
                                     wr.data(), N, C, E, K, true);
  EXPECT_NEAR(l.aux, hf_aux(probs, idx, N, E, K), 1e-12);
  double z = 0;
  for (int t = 0; t < N; ++t) {
    double s = 0, dotmax = -1e300;
    for (int e = 0; e < E; ++e) {
      double lg = 0;
      for (int c = 0; c < C; ++c) lg += x[t * C + c] * wr[e * C + c];
      EXPECT_NEAR(logits[t * E + e], lg, 1e-12);
      dotmax = std::max(dotmax, lg);
      s += std::exp(lg);
    }
    z += std::log(s) * std::log(s) / N;
    // top-k are the K largest, descending
    EXPECT_GE(probs[t * E + idx[t * K]], probs[t * E + idx[t * K + 1]]);
    EXPECT_NEAR(logits[t * E + idx[t * K]], dotmax, 1e-12);
  }
  EXPECT_NEAR(l.z, z, 1e-12);
}

class RouterBackwardP : public ::testing::TestWithParam<bool> {};

TEST_P(RouterBackwardP, MatchesFiniteDifferences) {
  const bool norm = GetParam();
  const int N = 12, C = 6, E = 5, K = 2;
  const double a = 0.7, b = 0.3;  // d loss/d aux, d loss/d z
  std::vector<double> x, wr, logits(N * E), probs(N * E), w(N * K);
  std::vector<std::int32_t> idx(N * K);
  // Pick a seed whose routing has clear gaps (the FD steps move logits by ~1e-3 at most).
  for (std::uint64_t seed = 10;; ++seed) {
    x = randn<double>(N * C, seed);
    wr = randn<double>(E * C, seed + 1000);
    cpu::router_forward(logits.data(), probs.data(), idx.data(), w.data(), x.data(), wr.data(), N,
                        C, E, K, norm);
    if (min_gap(logits, N, E, K) > 0.05) break;
    ASSERT_LT(seed, 200u) << "no well-separated routing found";
  }
  const auto idx0 = idx;
  auto g = randn<double>(N * K, 5);
  auto loss = [&] {
    const auto l = cpu::router_forward(logits.data(), probs.data(), idx.data(), w.data(), x.data(),
                                       wr.data(), N, C, E, K, norm);
    EXPECT_EQ(idx, idx0) << "routing flipped under the FD step";
    return ght::test::dot(g, w) + a * l.aux + b * l.z;
  };
  loss();
  std::vector<double> dx(N * C, 0.25), dwr(E * C, 0.0);  // dx accumulates
  cpu::router_backward(dx.data(), dwr.data(), g.data(), a, b, logits.data(), probs.data(),
                       idx.data(), w.data(), x.data(), wr.data(), N, C, E, K, norm);
  for (auto& v : dx) v -= 0.25;
  ght::test::fd_check(loss, x, dx, "router dx", 80);
  ght::test::fd_check(loss, wr, dwr, "router dwr", 80);
}

INSTANTIATE_TEST_SUITE_P(NormTopK, RouterBackwardP, ::testing::Values(false, true));
