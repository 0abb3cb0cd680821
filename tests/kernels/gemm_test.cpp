// CPU GEMM helpers against naive triple loops, and linear_backward against finite differences.
#include "kernels/cpu/gemm.hpp"

#include <gtest/gtest.h>

#include <tuple>

#include "kernels/fd_check.hpp"

namespace cpu = ght::kernels::cpu;
using S3 = std::tuple<int, int, int>;
using ght::test::randn;

namespace {

template <class T>
void naive(std::vector<double>& c, const std::vector<T>& a, const std::vector<T>& b, int M, int N,
           int K, char mode) {
  c.assign(static_cast<std::size_t>(M) * N, 0.0);
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0;
      for (int k = 0; k < K; ++k) {
        const double av = mode == 't' ? a[k * M + i] : a[i * K + k];
        const double bv = mode == 'n' || mode == 't' ? b[k * N + j] : b[j * K + k];
        s += av * bv;
      }
      c[i * N + j] = s;
    }
}

template <class T>
void check_all(double tol) {
  // Sizes straddle the 4-row and 32-column tiles.
  for (auto [M, N, K] : {S3{1, 1, 1}, S3{7, 130, 5}, S3{9, 257, 33}, S3{64, 64, 64}}) {
    for (char mode : {'n', 'N', 't'}) {  // N: nt
      const auto a = randn<T>(static_cast<std::size_t>(M) * K, 1 + M);
      const auto b = randn<T>(static_cast<std::size_t>(K) * N, 2 + N);
      std::vector<double> ref;
      naive(ref, a, b, M, N, K, mode);
      for (bool acc : {false, true}) {
        std::vector<T> c = randn<T>(static_cast<std::size_t>(M) * N, 3);
        std::vector<double> want = ref;
        if (acc)
          for (std::size_t i = 0; i < want.size(); ++i) want[i] += c[i];
        if (mode == 'n') cpu::matmul_nn(c.data(), a.data(), b.data(), M, N, K, acc);
        if (mode == 'N') cpu::matmul_nt(c.data(), a.data(), b.data(), M, N, K, acc);
        if (mode == 't') cpu::matmul_tn(c.data(), a.data(), b.data(), M, N, K, acc);
        ght::test::expect_close(c, want, tol, tol,
                                std::string("matmul_") + mode + " " + std::to_string(M) + "x" +
                                    std::to_string(N) + "x" + std::to_string(K));
      }
    }
  }
}

}  // namespace

TEST(Gemm, MatchesNaiveDouble) { check_all<double>(1e-12); }
TEST(Gemm, MatchesNaiveFloat) { check_all<float>(1e-5); }

TEST(Gemm, LinearBackwardMatchesFiniteDifferences) {
  const int N = 5, IC = 6, OC = 7;
  auto x = randn<double>(N * IC, 11), w = randn<double>(OC * IC, 12), g = randn<double>(N * OC, 13);
  std::vector<double> y(N * OC);
  auto loss = [&] {
    cpu::linear_forward(y.data(), x.data(), w.data(), N, IC, OC);
    return ght::test::dot(g, y);
  };
  std::vector<double> dx(N * IC, 0.0), dw(OC * IC, 0.5);  // dw starts non-zero: it accumulates
  cpu::linear_backward(dx.data(), dw.data(), g.data(), x.data(), w.data(), N, IC, OC);
  for (auto& v : dw) v -= 0.5;
  ght::test::fd_check(loss, x, dx, "linear dx");
  ght::test::fd_check(loss, w, dw, "linear dw");
}
