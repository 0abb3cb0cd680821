#include "kernels/cpu/router.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/detail/common.hpp"
#include "kernels/cpu/gemm.hpp"
#include "tier/error.hpp"

namespace ght::kernels::cpu {

namespace {
template <class T>
T row_lse(const T* l, int E) {
  T mx = l[0];
  for (int e = 1; e < E; ++e) mx = std::max(mx, l[e]);
  T s = 0;
  for (int e = 0; e < E; ++e) s += std::exp(l[e] - mx);
  return mx + std::log(s);
}
}  // namespace

template <class T>
RouterLosses router_forward(T* logits, T* probs, std::int32_t* topk_idx, T* topk_w, const T* x,
                            const T* wr, std::int64_t N, int C, int E, int K,
                            bool norm_topk_prob) {
  GHT_EXPECTS(K >= 1 && K <= E, "router: top_k (" + std::to_string(K) + ") must be in [1, experts (" +
                                    std::to_string(E) + ")]");
  RouterLosses out;
  if (N <= 0) return out;
  matmul_nt(logits, x, wr, N, E, C);  // (N, C)·(E, C)^T

  const std::int64_t nb = detail::num_blocks(N, detail::kReduceBlock);
  // Per-block partials: selection counts, probability sums and z, combined in block order.
  std::vector<double> cnt(static_cast<std::size_t>(nb * E), 0.0), psum(cnt.size(), 0.0), zpart(nb, 0.0);
#pragma omp parallel for schedule(static) if(detail::worth_parallel(N * E * (K + 2)))
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::int64_t t1 = std::min(N, (b + 1) * detail::kReduceBlock);
    double* bc = cnt.data() + b * E;
    double* bp = psum.data() + b * E;
    for (std::int64_t t = b * detail::kReduceBlock; t < t1; ++t) {
      const T* l = logits + t * E;
      T* p = probs + t * E;
      const T lse = row_lse(l, E);
      for (int e = 0; e < E; ++e) {
        p[e] = std::exp(l[e] - lse);
        bp[e] += static_cast<double>(p[e]);
      }
      zpart[b] += static_cast<double>(lse) * static_cast<double>(lse);
      // Top-k by repeated arg-max; a strict '>' over ascending e keeps the lower index on ties.
      std::int32_t* idx = topk_idx + t * K;
      T* wk = topk_w + t * K;
      T sel_sum = 0;
      for (int k = 0; k < K; ++k) {
        int best = -1;
        for (int e = 0; e < E; ++e) {
          bool taken = false;
          for (int j = 0; j < k; ++j) taken = taken || idx[j] == e;
          if (taken) continue;
          if (best < 0 || p[e] > p[best]) best = e;
        }
        idx[k] = best;
        wk[k] = p[best];
        sel_sum += p[best];
        bc[best] += 1.0;
      }
      if (norm_topk_prob) {
        for (int k = 0; k < K; ++k) wk[k] /= sel_sum;
      }
    }
  }
  std::vector<double> c(E, 0.0), ps(E, 0.0);
  double z = 0;
  for (std::int64_t b = 0; b < nb; ++b) {
    for (int e = 0; e < E; ++e) {
      c[e] += cnt[b * E + e];
      ps[e] += psum[b * E + e];
    }
    z += zpart[b];
  }
  const double n = static_cast<double>(N);
  double aux = 0;
  for (int e = 0; e < E; ++e) aux += (c[e] / n) * (ps[e] / n);
  out.aux = static_cast<double>(E) * aux;
  out.z = z / n;
  return out;
}

template <class T>
void router_backward(T* dx, T* dwr, const T* dtopk_w, T aux_grad, T z_grad, const T* logits,
                     const T* probs, const std::int32_t* topk_idx, const T* topk_w, const T* x,
                     const T* wr, std::int64_t N, int C, int E, int K, bool norm_topk_prob) {
  if (N <= 0) return;
  // d aux / d p[t, e] = E·c_e/N² for every token (the counts are constants).
  std::vector<T> daux(E, T(0));
  for (std::int64_t i = 0; i < N * K; ++i) daux[topk_idx[i]] += T(1);
  const T n = static_cast<T>(N);
  for (int e = 0; e < E; ++e) daux[e] = aux_grad * static_cast<T>(E) * daux[e] / (n * n);

  std::vector<T> dlogits(static_cast<std::size_t>(N * E));
#pragma omp parallel if(detail::worth_parallel(N * E))
  {
    std::vector<T> dp(E);
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < N; ++t) {
      const T* p = probs + t * E;
      const std::int32_t* idx = topk_idx + t * K;
      for (int e = 0; e < E; ++e) dp[e] = daux[e];
      if (dtopk_w != nullptr) {
        const T* g = dtopk_w + t * K;
        if (norm_topk_prob) {
          // w_k = p_k / S with S = sum of the selected p: dp_k = (g_k − sum_j g_j·w_j) / S
          const T* w = topk_w + t * K;
          T s = 0, gw = 0;
          for (int k = 0; k < K; ++k) {
            s += p[idx[k]];
            gw += g[k] * w[k];
          }
          for (int k = 0; k < K; ++k) dp[idx[k]] += (g[k] - gw) / s;
        } else {
          for (int k = 0; k < K; ++k) dp[idx[k]] += g[k];
        }
      }
      T pdp = 0;
      for (int e = 0; e < E; ++e) pdp += p[e] * dp[e];
      // z = mean_t lse_t²: d/dl = 2·lse·p/N
      const T zc = z_grad * T(2) * row_lse(logits + t * E, E) / n;
      T* dl = dlogits.data() + t * E;
      for (int e = 0; e < E; ++e) dl[e] = p[e] * (dp[e] - pdp) + zc * p[e];
    }
  }
  matmul_nn(dx, dlogits.data(), wr, N, C, E, /*accumulate=*/true);  // (N, E)·(E, C)
  matmul_tn(dwr, dlogits.data(), x, E, C, N, /*accumulate=*/true);  // (E, N)·(N, C)
}

#define GHT_INSTANTIATE(T)                                                                       \
  template RouterLosses router_forward<T>(T*, T*, std::int32_t*, T*, const T*, const T*,        \
                                          std::int64_t, int, int, int, bool);                   \
  template void router_backward<T>(T*, T*, const T*, T, T, const T*, const T*,                  \
                                   const std::int32_t*, const T*, const T*, const T*,           \
                                   std::int64_t, int, int, int, bool);
GHT_INSTANTIATE(float)
GHT_INSTANTIATE(double)
#undef GHT_INSTANTIATE

}  // namespace ght::kernels::cpu
