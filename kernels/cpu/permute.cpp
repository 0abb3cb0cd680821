#include "kernels/cpu/permute.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cpu/detail/common.hpp"
#include "tier/error.hpp"

namespace ght::kernels::cpu {

void moe_permute_plan(std::int32_t* expert_offsets, std::int32_t* src_token, std::int32_t* dst_row,
                      const std::int32_t* topk_idx, std::int64_t N, int K, int E) {
  const std::int64_t A = N * K;  // assignments
  for (std::int64_t a = 0; a < A; ++a) {
    GHT_EXPECTS(topk_idx[a] >= 0 && topk_idx[a] < E,
                "moe_permute_plan: expert id " + std::to_string(topk_idx[a]) + " for token " +
                    std::to_string(a / K) + " is outside [0, " + std::to_string(E) + ")");
  }
  // 1. histogram per block of assignments
  constexpr std::int64_t kBlock = 4096;
  const std::int64_t nb = std::max<std::int64_t>(1, (A + kBlock - 1) / kBlock);
  std::vector<std::int64_t> hist(static_cast<std::size_t>(nb * E), 0);
#pragma omp parallel for schedule(static) if(detail::worth_parallel(A))
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::int64_t a1 = std::min(A, (b + 1) * kBlock);
    for (std::int64_t a = b * kBlock; a < a1; ++a) ++hist[b * E + topk_idx[a]];
  }
  // 2. exclusive scan in (expert, block) order: each block's first slot within each expert
  std::int64_t run = 0;
  for (int e = 0; e < E; ++e) {
    expert_offsets[e] = static_cast<std::int32_t>(run);
    for (std::int64_t b = 0; b < nb; ++b) {
      const std::int64_t c = hist[b * E + e];
      hist[b * E + e] = run;
      run += c;
    }
  }
  expert_offsets[E] = static_cast<std::int32_t>(run);
  // 3. stable scatter: each block walks its assignments in order
#pragma omp parallel for schedule(static) if(detail::worth_parallel(A))
  for (std::int64_t b = 0; b < nb; ++b) {
    const std::int64_t a1 = std::min(A, (b + 1) * kBlock);
    std::int64_t* next = hist.data() + b * E;
    for (std::int64_t a = b * kBlock; a < a1; ++a) {
      const std::int64_t r = next[topk_idx[a]]++;
      src_token[r] = static_cast<std::int32_t>(a / K);
      dst_row[a] = static_cast<std::int32_t>(r);
    }
  }
}

template <class T>
void moe_permute_forward(T* xp, const T* x, const std::int32_t* src_token, std::int64_t N, int K,
                         int C) {
#pragma omp parallel for schedule(static) if(detail::worth_parallel(N * K * C))
  for (std::int64_t r = 0; r < N * K; ++r) {
    const T* s = x + static_cast<std::int64_t>(src_token[r]) * C;
    std::copy(s, s + C, xp + r * C);
  }
}

template <class T>
void moe_permute_backward(T* dx, const T* dxp, const std::int32_t* dst_row, std::int64_t N, int K,
                          int C) {
#pragma omp parallel for schedule(static) if(detail::worth_parallel(N * K * C))
  for (std::int64_t t = 0; t < N; ++t) {
    T* d = dx + t * C;
    std::fill(d, d + C, T(0));
    for (int k = 0; k < K; ++k) {
      const T* s = dxp + static_cast<std::int64_t>(dst_row[t * K + k]) * C;
      for (int c = 0; c < C; ++c) d[c] += s[c];
    }
  }
}

template <class T>
void moe_unpermute_forward(T* out, const T* yp, const T* topk_w, const std::int32_t* dst_row,
                           std::int64_t N, int K, int C) {
#pragma omp parallel for schedule(static) if(detail::worth_parallel(N * K * C))
  for (std::int64_t t = 0; t < N; ++t) {
    T* o = out + t * C;
    std::fill(o, o + C, T(0));
    for (int k = 0; k < K; ++k) {
      const T w = topk_w[t * K + k];
      const T* s = yp + static_cast<std::int64_t>(dst_row[t * K + k]) * C;
      for (int c = 0; c < C; ++c) o[c] += w * s[c];
    }
  }
}

template <class T>
void moe_unpermute_backward(T* dyp, T* dtopk_w, const T* dout, const T* yp, const T* topk_w,
                            const std::int32_t* dst_row, std::int64_t N, int K, int C) {
#pragma omp parallel for schedule(static) if(detail::worth_parallel(N * K * C))
  for (std::int64_t t = 0; t < N; ++t) {
    const T* g = dout + t * C;
    for (int k = 0; k < K; ++k) {
      const std::int64_t r = dst_row[t * K + k];
      const T w = topk_w[t * K + k];
      const T* y = yp + r * C;
      T* dy = dyp + r * C;
      T dot = 0;
      for (int c = 0; c < C; ++c) {
        dy[c] = w * g[c];
        dot += g[c] * y[c];
      }
      dtopk_w[t * K + k] = dot;
    }
  }
}

#define GHT_INSTANTIATE(T)                                                                      \
  template void moe_permute_forward<T>(T*, const T*, const std::int32_t*, std::int64_t, int,   \
                                       int);                                                    \
  template void moe_permute_backward<T>(T*, const T*, const std::int32_t*, std::int64_t, int,  \
                                        int);                                                   \
  template void moe_unpermute_forward<T>(T*, const T*, const T*, const std::int32_t*,          \
                                         std::int64_t, int, int);                               \
  template void moe_unpermute_backward<T>(T*, T*, const T*, const T*, const T*,                \
                                          const std::int32_t*, std::int64_t, int, int);
GHT_INSTANTIATE(float)
GHT_INSTANTIATE(double)
#undef GHT_INSTANTIATE

}  // namespace ght::kernels::cpu
