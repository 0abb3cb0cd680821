// Chunked LM head + cross-entropy: forward vs a naive log-softmax, backward vs FD in double,
// the ignore index, and chunk sizes that do not divide N.
#include "kernels/cpu/lm_head_ce.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "kernels/fd_check.hpp"
#include "tier/error.hpp"

namespace cpu = ght::kernels::cpu;
using ght::test::randn;

namespace {
constexpr int N = 11, C = 7, V = 13;
std::vector<std::int32_t> targets() {
  std::vector<std::int32_t> t(N);
  for (int i = 0; i < N; ++i) t[i] = (i * 5 + 3) % V;
  t[2] = cpu::kIgnoreIndex;
  t[7] = cpu::kIgnoreIndex;
  return t;
}
}  // namespace

TEST(LmHeadCe, ForwardMatchesNaiveLogSoftmax) {
  auto x = randn<double>(N * C, 1), w = randn<double>(V * C, 2, 0.5);
  const auto tg = targets();
  double sum = 0;
  int valid = 0;
  std::vector<double> ref_lse(N);
  for (int i = 0; i < N; ++i) {
    std::vector<double> l(V);
    double mx = -1e300;
    for (int v = 0; v < V; ++v) {
      for (int c = 0; c < C; ++c) l[v] += x[i * C + c] * w[v * C + c];
      mx = std::max(mx, l[v]);
    }
    double s = 0;
    for (int v = 0; v < V; ++v) s += std::exp(l[v] - mx);
    ref_lse[i] = mx + std::log(s);
    if (tg[i] == cpu::kIgnoreIndex) continue;
    sum += -(l[tg[i]] - ref_lse[i]);  // −log_softmax[target]
    ++valid;
  }
  for (std::int64_t chunk : {1, 4, 11, 100}) {
    std::vector<double> lse(N);
    const auto r = cpu::lm_head_ce_forward(lse.data(), x.data(), w.data(), tg.data(), N, C, V,
                                           cpu::kIgnoreIndex, chunk);
    EXPECT_EQ(r.valid, valid);
    EXPECT_NEAR(r.loss, sum / valid, 1e-13) << "chunk " << chunk;
    ght::test::expect_close(lse, ref_lse, 1e-13, 1e-13, "lse");
  }
  // float instantiation
  std::vector<float> xf(x.begin(), x.end()), wf(w.begin(), w.end()), lf(N);
  const auto rf = cpu::lm_head_ce_forward(lf.data(), xf.data(), wf.data(), tg.data(), N, C, V);
  EXPECT_NEAR(rf.loss, sum / valid, 1e-5);
}

TEST(LmHeadCe, BackwardMatchesFiniteDifferences) {
  auto x = randn<double>(N * C, 3), w = randn<double>(V * C, 4, 0.5);
  const auto tg = targets();
  const double dloss = 1.7;
  std::vector<double> lse(N);
  cpu::CrossEntropyResult res;
  auto loss = [&] {
    res = cpu::lm_head_ce_forward(lse.data(), x.data(), w.data(), tg.data(), N, C, V,
                                  cpu::kIgnoreIndex, 3);
    return dloss * res.loss;
  };
  loss();
  std::vector<double> dx(N * C, 5.0), dw(V * C, 0.0);
  cpu::lm_head_ce_backward(dx.data(), dw.data(), x.data(), w.data(), tg.data(), lse.data(), N, C,
                           V, dloss, res.valid, cpu::kIgnoreIndex, 4);
  // rows with an ignored target get exactly zero
  for (int c = 0; c < C; ++c) ASSERT_EQ(dx[2 * C + c], 0.0);
  ght::test::fd_check(loss, x, dx, "ce dx", 100);
  ght::test::fd_check(loss, w, dw, "ce dw", 100);
}

TEST(LmHeadCe, OutOfRangeTargetThrowsNamingTheRow) {
  std::vector<float> x(2 * 3, 1.f), w(4 * 3, 1.f), lse(2);
  const std::vector<std::int32_t> tg = {1, 4};
  try {
    (void)cpu::lm_head_ce_forward(lse.data(), x.data(), w.data(), tg.data(), 2, 3, 4);
    FAIL() << "no throw";
  } catch (const ght::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("target 4 at row 1"), std::string::npos) << e.what();
  }
}
