// Causal GQA attention with optional document masking: forward vs a direct O(T²) reference with
// an explicit mask matrix, backward vs FD in double.
#include "kernels/cpu/attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernels/fd_check.hpp"

namespace cpu = ght::kernels::cpu;
using ght::test::randn;

namespace {

struct Shape {
  int B, T, H, KV, D;
  bool docs;
};

std::vector<std::int32_t> make_docs(int B, int T) {
  std::vector<std::int32_t> d(static_cast<std::size_t>(B) * T);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) d[b * T + t] = (t < T / 3 ? 4 : t < T - 2 ? 1 : 7) + b;
  return d;
}

void reference(std::vector<double>& out, std::vector<double>& lse, const std::vector<double>& q,
               const std::vector<double>& k, const std::vector<double>& v,
               const std::int32_t* docs, const Shape& s) {
  out.assign(static_cast<std::size_t>(s.B) * s.T * s.H * s.D, 0.0);
  lse.assign(static_cast<std::size_t>(s.B) * s.H * s.T, 0.0);
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.H; ++h) {
      const int g = h / (s.H / s.KV);
      // explicit (T, T) score matrix with -inf where masked
      std::vector<double> S(s.T * s.T);
      for (int i = 0; i < s.T; ++i)
        for (int j = 0; j < s.T; ++j) {
          const bool ok = j <= i && (!docs || docs[b * s.T + i] == docs[b * s.T + j]);
          double dot = 0;
          for (int d = 0; d < s.D; ++d)
            dot += q[((b * s.T + i) * s.H + h) * s.D + d] * k[((b * s.T + j) * s.KV + g) * s.D + d];
          S[i * s.T + j] = ok ? dot / std::sqrt(double(s.D)) : -std::numeric_limits<double>::infinity();
        }
      for (int i = 0; i < s.T; ++i) {
        double mx = -1e300, sum = 0;
        for (int j = 0; j < s.T; ++j) mx = std::max(mx, S[i * s.T + j]);
        for (int j = 0; j < s.T; ++j) sum += std::exp(S[i * s.T + j] - mx);
        lse[(b * s.H + h) * s.T + i] = mx + std::log(sum);
        for (int j = 0; j < s.T; ++j) {
          const double p = std::exp(S[i * s.T + j] - mx) / sum;
          for (int d = 0; d < s.D; ++d)
            out[((b * s.T + i) * s.H + h) * s.D + d] += p * v[((b * s.T + j) * s.KV + g) * s.D + d];
        }
      }
    }
}

}  // namespace

class AttentionP : public ::testing::TestWithParam<Shape> {};

TEST_P(AttentionP, ForwardMatchesDirectReference) {
  const Shape s = GetParam();
  const auto docs = make_docs(s.B, s.T);
  const std::int32_t* dp = s.docs ? docs.data() : nullptr;
  auto q = randn<double>(s.B * s.T * s.H * s.D, 1), k = randn<double>(s.B * s.T * s.KV * s.D, 2),
       v = randn<double>(s.B * s.T * s.KV * s.D, 3);
  std::vector<double> out(q.size()), lse(s.B * s.H * s.T), rout, rlse;
  cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), dp, s.B, s.T, s.H,
                         s.KV, s.D);
  reference(rout, rlse, q, k, v, dp, s);
  ght::test::expect_close(out, rout, 1e-12, 1e-12, "attention out");
  ght::test::expect_close(lse, rlse, 1e-12, 1e-12, "attention lse");
  // float instantiation agrees with the double reference to float precision
  std::vector<float> qf(q.begin(), q.end()), kf(k.begin(), k.end()), vf(v.begin(), v.end()),
      of(out.size()), lf(lse.size());
  cpu::attention_forward(of.data(), lf.data(), qf.data(), kf.data(), vf.data(), dp, s.B, s.T, s.H,
                         s.KV, s.D);
  ght::test::expect_close(of, rout, 2e-5, 2e-5, "attention out (float)");
}

TEST_P(AttentionP, BackwardMatchesFiniteDifferences) {
  const Shape s = GetParam();
  const auto docs = make_docs(s.B, s.T);
  const std::int32_t* dp = s.docs ? docs.data() : nullptr;
  auto q = randn<double>(s.B * s.T * s.H * s.D, 4, 0.5), k = randn<double>(s.B * s.T * s.KV * s.D, 5, 0.5),
       v = randn<double>(s.B * s.T * s.KV * s.D, 6), g = randn<double>(q.size(), 7);
  std::vector<double> out(q.size()), lse(s.B * s.H * s.T);
  auto loss = [&] {
    cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), dp, s.B, s.T, s.H,
                           s.KV, s.D);
    return ght::test::dot(g, out);
  };
  loss();
  std::vector<double> dq(q.size(), 9.0), dk(k.size(), 9.0), dv(v.size(), 9.0);  // overwritten
  cpu::attention_backward(dq.data(), dk.data(), dv.data(), g.data(), q.data(), k.data(), v.data(),
                          out.data(), lse.data(), dp, s.B, s.T, s.H, s.KV, s.D);
  ght::test::fd_check(loss, q, dq, "attention dq", 60);
  ght::test::fd_check(loss, k, dk, "attention dk", 60);
  ght::test::fd_check(loss, v, dv, "attention dv", 60);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionP,
                         ::testing::Values(Shape{2, 7, 4, 2, 16, false}, Shape{2, 9, 4, 2, 16, true},
                                           Shape{1, 6, 2, 1, 32, true}, Shape{1, 5, 3, 3, 32, false}));
