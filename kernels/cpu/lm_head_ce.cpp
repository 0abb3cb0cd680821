#include "kernels/cpu/lm_head_ce.hpp"

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
std::vector<T> transpose(const T* w, int V, int C) {  // (V, C) -> (C, V)
  std::vector<T> wt(static_cast<std::size_t>(V) * C);
#pragma omp parallel for schedule(static) if(detail::worth_parallel(static_cast<std::int64_t>(V) * C))
  for (int c = 0; c < C; ++c)
    for (int v = 0; v < V; ++v) wt[static_cast<std::size_t>(c) * V + v] = w[static_cast<std::size_t>(v) * C + c];
  return wt;
}
}  // namespace

template <class T>
CrossEntropyResult lm_head_ce_forward(T* lse, const T* x, const T* w, const std::int32_t* targets,
                                      std::int64_t N, int C, int V, std::int32_t ignore_index,
                                      std::int64_t chunk_rows) {
  GHT_EXPECTS(chunk_rows > 0, "lm_head_ce_forward: chunk_rows must be > 0");
  for (std::int64_t i = 0; i < N; ++i) {
    GHT_EXPECTS(targets[i] == ignore_index || (targets[i] >= 0 && targets[i] < V),
                "cross-entropy: target " + std::to_string(targets[i]) + " at row " +
                    std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(V) +
                    ") and is not the ignore index " + std::to_string(ignore_index));
  }
  CrossEntropyResult res;
  if (N <= 0) return res;
  const std::vector<T> wt = transpose(w, V, C);
  const std::int64_t rows_max = std::min(N, chunk_rows);
  std::vector<T> logits(static_cast<std::size_t>(rows_max * V));
  std::vector<double> row_loss(static_cast<std::size_t>(rows_max));
  double sum = 0;
  for (std::int64_t i0 = 0; i0 < N; i0 += chunk_rows) {
    const std::int64_t rows = std::min(chunk_rows, N - i0);
    matmul_nn(logits.data(), x + i0 * C, wt.data(), rows, V, C);  // (rows, C)·(C, V)
#pragma omp parallel for schedule(static) if(detail::worth_parallel(rows * V))
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* l = logits.data() + r * V;
      T mx = l[0];
      for (int v = 1; v < V; ++v) mx = std::max(mx, l[v]);
      T s = 0;
      for (int v = 0; v < V; ++v) s += std::exp(l[v] - mx);
      const T ls = mx + std::log(s);
      lse[i0 + r] = ls;
      const std::int32_t tg = targets[i0 + r];
      row_loss[r] = tg == ignore_index ? 0.0 : static_cast<double>(ls - l[tg]);
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      if (targets[i0 + r] == ignore_index) continue;
      sum += row_loss[r];
      ++res.valid;
    }
  }
  res.loss = res.valid > 0 ? sum / static_cast<double>(res.valid) : 0.0;
  return res;
}

template <class T>
void lm_head_ce_backward(T* dx, T* dw, const T* x, const T* w, const std::int32_t* targets,
                         const T* lse, std::int64_t N, int C, int V, T dloss, std::int64_t valid,
                         std::int32_t ignore_index, std::int64_t chunk_rows) {
  GHT_EXPECTS(chunk_rows > 0, "lm_head_ce_backward: chunk_rows must be > 0");
  if (N <= 0) return;
  if (valid <= 0) {  // the loss is the constant 0
    std::fill(dx, dx + N * C, T(0));
    return;
  }
  const T scale = dloss / static_cast<T>(valid);
  const std::vector<T> wt = transpose(w, V, C);
  const std::int64_t rows_max = std::min(N, chunk_rows);
  std::vector<T> dl(static_cast<std::size_t>(rows_max * V));
  for (std::int64_t i0 = 0; i0 < N; i0 += chunk_rows) {
    const std::int64_t rows = std::min(chunk_rows, N - i0);
    matmul_nn(dl.data(), x + i0 * C, wt.data(), rows, V, C);  // recompute the chunk's logits
#pragma omp parallel for schedule(static) if(detail::worth_parallel(rows * V))
    for (std::int64_t r = 0; r < rows; ++r) {
      T* l = dl.data() + r * V;
      const std::int32_t tg = targets[i0 + r];
      if (tg == ignore_index) {
        std::fill(l, l + V, T(0));
        continue;
      }
      const T ls = lse[i0 + r];
      for (int v = 0; v < V; ++v) l[v] = std::exp(l[v] - ls) * scale;  // softmax·scale
      l[tg] -= scale;
    }
    matmul_nn(dx + i0 * C, dl.data(), w, rows, C, V);            // (rows, V)·(V, C)
    matmul_tn(dw, dl.data(), x + i0 * C, V, C, rows, true);      // (V, rows)·(rows, C)
  }
}

#define GHT_INSTANTIATE(T)                                                                     \
  template CrossEntropyResult lm_head_ce_forward<T>(T*, const T*, const T*,                   \
                                                    const std::int32_t*, std::int64_t, int,   \
                                                    int, std::int32_t, std::int64_t);         \
  template void lm_head_ce_backward<T>(T*, T*, const T*, const T*, const std::int32_t*,       \
                                       const T*, std::int64_t, int, int, T, std::int64_t,     \
                                       std::int32_t, std::int64_t);
GHT_INSTANTIATE(float)
GHT_INSTANTIATE(double)
#undef GHT_INSTANTIATE

}  // namespace ght::kernels::cpu
