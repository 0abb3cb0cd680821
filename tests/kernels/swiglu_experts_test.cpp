// SwiGLU experts over permuted rows: forward vs a per-row naive MLP, backward vs FD in double,
// with the model's interleaved (gate, up, down per expert) weight layout and an empty expert.
#include "kernels/cpu/swiglu_experts.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "kernels/fd_check.hpp"

namespace cpu = ght::kernels::cpu;
using ght::test::randn;

namespace {
constexpr int E = 3, C = 6, F = 5;
const std::vector<std::int32_t> kOffsets = {0, 4, 4, 7};  // expert 1 has no rows
constexpr std::int64_t kStride = 3LL * F * C;              // gate, up, down per expert
constexpr int R = 7;
}  // namespace

TEST(SwigluExperts, ForwardMatchesNaive) {
  auto W = randn<double>(E * kStride, 1, 0.5), xp = randn<double>(R * C, 2);
  std::vector<double> y(R * C), g(R * F), u(R * F), a(R * F);
  cpu::swiglu_experts_forward(y.data(), g.data(), u.data(), a.data(), xp.data(), W.data(),
                              W.data() + F * C, W.data() + 2 * F * C, kStride, kOffsets.data(), E,
                              C, F);
  std::vector<double> ref(R * C, 0.0);
  for (int e = 0; e < E; ++e) {
    const double* wg = W.data() + e * kStride;
    const double* wu = wg + F * C;
    const double* wd = wg + 2 * F * C;
    for (int r = kOffsets[e]; r < kOffsets[e + 1]; ++r) {
      std::vector<double> act(F);
      for (int f = 0; f < F; ++f) {
        double gg = 0, uu = 0;
        for (int c = 0; c < C; ++c) {
          gg += wg[f * C + c] * xp[r * C + c];
          uu += wu[f * C + c] * xp[r * C + c];
        }
        act[f] = gg / (1 + std::exp(-gg)) * uu;
      }
      for (int c = 0; c < C; ++c)
        for (int f = 0; f < F; ++f) ref[r * C + c] += wd[c * F + f] * act[f];
    }
  }
  ght::test::expect_close(y, ref, 1e-13, 1e-13, "swiglu y");
}

TEST(SwigluExperts, BackwardMatchesFiniteDifferences) {
  auto W = randn<double>(E * kStride, 3, 0.5), xp = randn<double>(R * C, 4),
       gy = randn<double>(R * C, 5);
  std::vector<double> y(R * C), g(R * F), u(R * F), a(R * F);
  auto fwd = [&] {
    cpu::swiglu_experts_forward(y.data(), g.data(), u.data(), a.data(), xp.data(), W.data(),
                                W.data() + F * C, W.data() + 2 * F * C, kStride, kOffsets.data(),
                                E, C, F);
    return ght::test::dot(gy, y);
  };
  fwd();
  std::vector<double> dxp(R * C, 3.0), dW(E * kStride, 0.0);
  cpu::swiglu_experts_backward(dxp.data(), dW.data(), dW.data() + F * C, dW.data() + 2 * F * C,
                               gy.data(), xp.data(), g.data(), u.data(), a.data(), W.data(),
                               W.data() + F * C, W.data() + 2 * F * C, kStride, kOffsets.data(), E,
                               C, F);
  ght::test::fd_check(fwd, xp, dxp, "swiglu dxp", 100);
  ght::test::fd_check(fwd, W, dW, "swiglu dW", 120);
  // the empty expert's weights get exactly zero gradient
  for (std::int64_t i = kStride; i < 2 * kStride; ++i) ASSERT_EQ(dW[i], 0.0);
}
