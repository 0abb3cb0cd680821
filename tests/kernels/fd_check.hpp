#pragma once
/**
 * @file fd_check.hpp
 * @brief Test helpers for the CPU reference ops: seeded random fills, forward comparisons and
 * finite-difference gradient checks in double.
 *
 * Relative error of a gradient entry (analytic a, numeric b) within one checked tensor:
 *   rel(a, b) = |a − b| / max(|a|, |b|, 1e-3·max_j |b_j|, 1e-8)
 * i.e. plain relative error, except that entries 1000× smaller than the tensor's largest checked
 * gradient (structural zeros such as an unused expert or an ignored target row, where the
 * numeric value is pure round-off ~1e-12) are held to an absolute error of 1e-9·max_j |b_j|.
 * Finite differences use the fourth-order central stencil
 *   f'(x) ≈ (f(x−2h) − 8 f(x−h) + 8 f(x+h) − f(x+2h)) / 12h,  h = 1e-4 · max(1, |x|),
 * whose truncation error (~h⁴) and round-off (~1e-16·|f|/h) are both far below 1e-6 relative for
 * the well-conditioned inputs the tests use. (A plain 2-point stencil with h ~ 1e-6 would leave
 * round-off near 1e-10 absolute, too coarse for small gradient entries.)
 */
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace ght::test {

inline double rel_err(double a, double b, double floor = 1e-8) {
  return std::abs(a - b) / std::max({std::abs(a), std::abs(b), floor, 1e-8});
}

/// Normal(0, stddev) fill, deterministic in seed.
template <class T>
void fill_normal(std::vector<T>& v, std::uint64_t seed, double stddev = 1.0, double mean = 0.0) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> d(mean, stddev);
  for (auto& x : v) x = static_cast<T>(d(g));
}

template <class T>
std::vector<T> randn(std::size_t n, std::uint64_t seed, double stddev = 1.0, double mean = 0.0) {
  std::vector<T> v(n);
  fill_normal(v, seed, stddev, mean);
  return v;
}

/// sum_i w[i]·y[i] in double: the scalar "loss" whose gradient w.r.t. y is w.
template <class T, class U>
double dot(const std::vector<T>& w, const std::vector<U>& y) {
  double s = 0;
  for (std::size_t i = 0; i < w.size(); ++i) s += static_cast<double>(w[i]) * static_cast<double>(y[i]);
  return s;
}

struct CompareResult {
  double max_rel = 0;
  std::size_t worst = 0;
  std::size_t checked = 0;
};

/**
 * @brief Compare got against ref element-wise with tolerance |got − ref| <= tol + |ref|·rtol
 * (llm.c style); prints the first mismatches and the worst error, and records a gtest failure.
 */
template <class A, class B>
void expect_close(const std::vector<A>& got, const std::vector<B>& ref, double tol, double rtol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int printed = 0;
  double worst = 0;
  std::size_t wi = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), r = static_cast<double>(ref[i]);
    const double err = std::abs(g - r);
    if (!(err <= tol + std::abs(r) * rtol)) {  // also catches NaN
      if (printed++ < 5) ADD_FAILURE() << what << "[" << i << "]: got " << g << " ref " << r;
    }
    if (!(err <= worst)) {
      worst = err;
      wi = i;
    }
  }
  if (printed > 0) {
    ADD_FAILURE() << what << ": " << printed << " mismatches, worst |err| " << worst << " at " << wi;
  }
}

/**
 * @brief Check an analytic gradient against finite differences of loss() with respect to x.
 * @param loss evaluates the scalar loss at the current contents of x
 * @param x the variable (perturbed in place and restored)
 * @param analytic d loss / d x, same size as x
 * @param max_checks check at most this many entries (a seeded random subset when x is larger)
 * @return the worst relative error; failures (> tol) are reported with their index
 */
inline CompareResult fd_check(const std::function<double()>& loss, std::vector<double>& x,
                              const std::vector<double>& analytic, const std::string& what,
                              std::size_t max_checks = 64, double tol = 1e-6,
                              std::uint64_t seed = 7) {
  CompareResult res;
  EXPECT_EQ(x.size(), analytic.size()) << what;
  std::vector<std::size_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0);
  if (idx.size() > max_checks) {
    std::mt19937_64 g(seed);
    std::shuffle(idx.begin(), idx.end(), g);
    idx.resize(max_checks);
    std::sort(idx.begin(), idx.end());
  }
  std::vector<double> num(idx.size());
  double max_abs_grad = 0;
  for (std::size_t m = 0; m < idx.size(); ++m) {
    const std::size_t i = idx[m];
    const double x0 = x[i];
    const double h = 1e-4 * std::max(1.0, std::abs(x0));
    auto f = [&](double v) {
      x[i] = v;
      return loss();
    };
    const double fm2 = f(x0 - 2 * h), fm1 = f(x0 - h), fp1 = f(x0 + h), fp2 = f(x0 + 2 * h);
    x[i] = x0;
    num[m] = (fm2 - 8 * fm1 + 8 * fp1 - fp2) / (12 * h);
    max_abs_grad = std::max(max_abs_grad, std::abs(num[m]));
  }
  loss();  // leave the forward state at the unperturbed point
  int failures = 0;
  for (std::size_t m = 0; m < idx.size(); ++m) {
    const std::size_t i = idx[m];
    const double e = rel_err(analytic[i], num[m], 1e-3 * max_abs_grad);
    if (!(e <= tol) && failures++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic[i] << " numeric " << num[m]
                    << " rel " << e;
    }
    if (!(e <= res.max_rel)) {
      res.max_rel = e;
      res.worst = i;
    }
    ++res.checked;
  }
  std::printf("fd_check %-28s worst rel %.2e over %zu entries (max |grad| %.2e)\n", what.c_str(),
              res.max_rel, res.checked, max_abs_grad);
  // A vanishing gradient would make the check vacuous.
  EXPECT_GT(max_abs_grad, 1e-6) << what << ": all checked gradients are ~0";
  EXPECT_LE(res.max_rel, tol) << what << ": worst rel error " << res.max_rel << " at " << res.worst
                              << " over " << res.checked << " entries";
  return res;
}

}  // namespace ght::test
