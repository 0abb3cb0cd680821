// QK-RMSNorm + RoPE: forward vs HF's q·cos + rotate_half(q)·sin, backward vs FD in double.
#include "kernels/cpu/qk_norm_rope.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "kernels/fd_check.hpp"

namespace cpu = ght::kernels::cpu;
using ght::test::randn;

TEST(QkNormRope, PositionsResetAtDocumentBoundaries) {
  const std::vector<std::int32_t> docs = {5, 5, 5, 2, 2, 9, /*row 2*/ 1, 1, 3, 3, 3, 3};
  std::vector<std::int32_t> pos(12);
  cpu::make_positions(pos.data(), docs.data(), 2, 6);
  EXPECT_EQ(pos, (std::vector<std::int32_t>{0, 1, 2, 0, 1, 0, 0, 1, 0, 1, 2, 3}));
  cpu::make_positions(pos.data(), nullptr, 2, 6);
  EXPECT_EQ(pos, (std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5}));
}

class QkNormRopeP : public ::testing::TestWithParam<int> {};

TEST_P(QkNormRopeP, ForwardMatchesHfRotateHalf) {
  const int D = GetParam(), H = 3, N = 10;
  const double eps = 1e-6, theta = 10000.0;
  auto x = randn<double>(N * H * D, 1), w = randn<double>(D, 2, 0.3, 1.0);
  std::vector<std::int32_t> pos(N);
  for (int i = 0; i < N; ++i) pos[i] = 3 * i + 1;
  std::vector<double> out(N * H * D), rstd(N * H);
  cpu::qk_norm_rope_forward(out.data(), rstd.data(), x.data(), w.data(), pos.data(), N, H, D, eps,
                            theta);
  std::vector<double> ref(out.size());
  const int half = D / 2;
  for (int t = 0; t < N; ++t)
    for (int h = 0; h < H; ++h) {
      const double* xi = &x[(t * H + h) * D];
      double ms = 0;
      for (int d = 0; d < D; ++d) ms += xi[d] * xi[d];
      std::vector<double> q(D), rot(D), cs(D), sn(D);
      for (int d = 0; d < D; ++d) q[d] = xi[d] / std::sqrt(ms / D + eps) * w[d];
      for (int d = 0; d < D; ++d) {  // emb = cat(freqs, freqs)
        const double f = pos[t] / std::pow(theta, 2.0 * (d % half) / D);
        cs[d] = std::cos(f);
        sn[d] = std::sin(f);
        rot[d] = d < half ? -q[d + half] : q[d - half];  // rotate_half = cat(-x2, x1)
      }
      for (int d = 0; d < D; ++d) ref[(t * H + h) * D + d] = q[d] * cs[d] + rot[d] * sn[d];
    }
  ght::test::expect_close(out, ref, 1e-13, 1e-13, "qk_norm_rope out");
}

TEST_P(QkNormRopeP, BackwardMatchesFiniteDifferences) {
  const int D = GetParam(), H = 2, N = 6;
  const std::vector<std::int32_t> docs = {0, 0, 0, 1, 1, 1};
  std::vector<std::int32_t> pos(N);
  cpu::make_positions(pos.data(), docs.data(), 1, N);
  auto x = randn<double>(N * H * D, 3), w = randn<double>(D, 4, 0.3, 1.0),
       g = randn<double>(N * H * D, 5);
  std::vector<double> out(N * H * D), rstd(N * H);
  auto loss = [&] {
    cpu::qk_norm_rope_forward(out.data(), rstd.data(), x.data(), w.data(), pos.data(), N, H, D,
                              1e-6, 1000.0);
    return ght::test::dot(g, out);
  };
  loss();
  std::vector<double> dx(N * H * D, 99.0), dw(D, 0.0);  // dx is overwritten
  cpu::qk_norm_rope_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(),
                             pos.data(), N, H, D, 1000.0);
  ght::test::fd_check(loss, x, dx, "qk_norm_rope dx", 80);
  ght::test::fd_check(loss, w, dw, "qk_norm_rope dw");
}

INSTANTIATE_TEST_SUITE_P(HeadDims, QkNormRopeP, ::testing::Values(16, 32));
