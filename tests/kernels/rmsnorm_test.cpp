// RMSNorm and the fused residual variant: forward vs a naive formula, backward vs FD in double.
#include "kernels/cpu/rmsnorm.hpp"

#include <gtest/gtest.h>

#include <cmath>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/fd_check.hpp"

namespace cpu = ght::kernels::cpu;
using ght::test::randn;

TEST(RmsNorm, ForwardMatchesHfFormula) {
  const int N = 70, C = 24;  // N > the 64-row reduction block
  const double eps = 1e-6;
  auto x = randn<float>(N * C, 1), w = randn<float>(C, 2, 0.3, 1.0);
  std::vector<float> out(N * C), rstd(N);
  cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  std::vector<double> ref(N * C);
  for (int i = 0; i < N; ++i) {
    double ms = 0;
    for (int c = 0; c < C; ++c) ms += double(x[i * C + c]) * x[i * C + c];
    const double r = 1.0 / std::sqrt(ms / C + eps);
    for (int c = 0; c < C; ++c) ref[i * C + c] = x[i * C + c] * r * w[c];
  }
  ght::test::expect_close(out, ref, 1e-5, 1e-5, "rmsnorm out");
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  const int N = 70, C = 12;
  auto x = randn<double>(N * C, 3), w = randn<double>(C, 4, 0.3, 1.0), g = randn<double>(N * C, 5);
  std::vector<double> out(N * C), rstd(N);
  auto loss = [&] {
    cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6);
    return ght::test::dot(g, out);
  };
  loss();
  std::vector<double> dx(N * C, 0.0), dw(C, 0.0);
  cpu::rmsnorm_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), rstd.data(), N, C);
  ght::test::fd_check(loss, x, dx, "rmsnorm dx", 100);
  ght::test::fd_check(loss, w, dw, "rmsnorm dw");
}

TEST(RmsNorm, FusedResidualForwardAndBackward) {
  const int N = 9, C = 16;
  auto x = randn<double>(N * C, 6), r = randn<double>(N * C, 7), w = randn<double>(C, 8, 0.3, 1.0);
  auto g_out = randn<double>(N * C, 9), g_sum = randn<double>(N * C, 10);
  std::vector<double> sum(N * C), out(N * C), rstd(N);
  auto loss = [&] {
    cpu::fused_residual_rmsnorm_forward(sum.data(), out.data(), rstd.data(), x.data(), r.data(),
                                        w.data(), N, C, 1e-6);
    return ght::test::dot(g_out, out) + ght::test::dot(g_sum, sum);
  };
  loss();
  // forward: equals the unfused pair
  std::vector<double> s2(N * C), o2(N * C), rs2(N);
  for (int i = 0; i < N * C; ++i) s2[i] = x[i] + r[i];
  cpu::rmsnorm_forward(o2.data(), rs2.data(), s2.data(), w.data(), N, C, 1e-6);
  ght::test::expect_close(sum, s2, 0, 0, "fused sum");
  ght::test::expect_close(out, o2, 1e-15, 1e-15, "fused out");
  // backward: dsum enters holding the residual-path gradient
  std::vector<double> dsum = g_sum, dw(C, 0.0);
  cpu::fused_residual_rmsnorm_backward(dsum.data(), dw.data(), g_out.data(), sum.data(), w.data(),
                                       rstd.data(), N, C);
  ght::test::fd_check(loss, x, dsum, "fused dx");
  ght::test::fd_check(loss, r, dsum, "fused dresidual");
  ght::test::fd_check(loss, w, dw, "fused dw");
}

TEST(RmsNorm, FloatDwIsThreadCountIndependent) {
  const int N = 5000, C = 8;  // enough work to run multi-threaded
  auto x = randn<float>(N * C, 1), w = randn<float>(C, 2), g = randn<float>(N * C, 3);
  std::vector<float> out(N * C), rstd(N);
  cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, 1e-6);
  std::vector<float> dx1(N * C, 0.f), dw1(C, 0.f), dx2(N * C, 0.f), dw2(C, 0.f);
  cpu::rmsnorm_backward(dx1.data(), dw1.data(), g.data(), x.data(), w.data(), rstd.data(), N, C);
#ifdef _OPENMP
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
#endif
  cpu::rmsnorm_backward(dx2.data(), dw2.data(), g.data(), x.data(), w.data(), rstd.data(), N, C);
#ifdef _OPENMP
  omp_set_num_threads(saved);
#endif
  EXPECT_EQ(dw1, dw2);
  EXPECT_EQ(dx1, dx2);
}
