#include "kernels/cpu/rmsnorm.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/detail/common.hpp"

namespace ght::kernels::cpu {

template <class T>
void rmsnorm_forward(T* out, T* rstd, const T* x, const T* w, std::int64_t N, int C, double eps) {
#pragma omp parallel for schedule(static) if(detail::worth_parallel(N * C))
  for (std::int64_t i = 0; i < N; ++i) {
    const T* xi = x + i * C;
    T ss = 0;
    for (int c = 0; c < C; ++c) ss += xi[c] * xi[c];
    const T r = T(1) / std::sqrt(ss / T(C) + T(eps));
    rstd[i] = r;
    T* oi = out + i * C;
    for (int c = 0; c < C; ++c) oi[c] = xi[c] * r * w[c];
  }
}

template <class T>
void rmsnorm_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd,
                      std::int64_t N, int C) {
  // y_c = x_c·r·w_c with r = (mean(x²)+eps)^(-1/2):
  //   dx_c = r·(g_c − x_c·r²·mean_j(g_j·x_j)) with g = dout·w;  dw_c = sum_i dout_ic·x_ic·r_i
  const std::int64_t nb = detail::num_blocks(N, detail::kReduceBlock);
  std::vector<T> part(static_cast<std::size_t>(nb * C), T(0));
#pragma omp parallel for schedule(static) if(detail::worth_parallel(N * C))
  for (std::int64_t b = 0; b < nb; ++b) {
    T* pw = part.data() + b * C;
    const std::int64_t i1 = std::min(N, (b + 1) * detail::kReduceBlock);
    for (std::int64_t i = b * detail::kReduceBlock; i < i1; ++i) {
      const T* xi = x + i * C;
      const T* gi = dout + i * C;
      const T r = rstd[i];
      T dot = 0;
      for (int c = 0; c < C; ++c) dot += gi[c] * w[c] * xi[c];
      const T k = r * r * dot / T(C);
      T* dxi = dx + i * C;
      for (int c = 0; c < C; ++c) {
        dxi[c] += r * (gi[c] * w[c] - xi[c] * k);
        pw[c] += gi[c] * xi[c] * r;
      }
    }
  }
  detail::add_partials(dw, part, nb, C);
}

template <class T>
void fused_residual_rmsnorm_forward(T* sum, T* out, T* rstd, const T* x, const T* residual,
                                    const T* w, std::int64_t N, int C, double eps) {
#pragma omp parallel for schedule(static) if(detail::worth_parallel(N * C))
  for (std::int64_t i = 0; i < N; ++i) {
    T* si = sum + i * C;
    const T* xi = x + i * C;
    const T* ri = residual + i * C;
    T ss = 0;
    for (int c = 0; c < C; ++c) {
      const T s = xi[c] + ri[c];
      si[c] = s;
      ss += s * s;
    }
    const T r = T(1) / std::sqrt(ss / T(C) + T(eps));
    rstd[i] = r;
    T* oi = out + i * C;
    for (int c = 0; c < C; ++c) oi[c] = si[c] * r * w[c];
  }
}

template <class T>
void fused_residual_rmsnorm_backward(T* dsum, T* dw, const T* dout, const T* sum, const T* w,
                                     const T* rstd, std::int64_t N, int C) {
  rmsnorm_backward(dsum, dw, dout, sum, w, rstd, N, C);
}

#define GHT_INSTANTIATE(T)                                                                        \
  template void rmsnorm_forward<T>(T*, T*, const T*, const T*, std::int64_t, int, double);       \
  template void rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*, const T*, std::int64_t, \
                                    int);                                                         \
  template void fused_residual_rmsnorm_forward<T>(T*, T*, T*, const T*, const T*, const T*,       \
                                                  std::int64_t, int, double);                     \
  template void fused_residual_rmsnorm_backward<T>(T*, T*, const T*, const T*, const T*,          \
                                                   const T*, std::int64_t, int);
GHT_INSTANTIATE(float)
GHT_INSTANTIATE(double)
#undef GHT_INSTANTIATE

}  // namespace ght::kernels::cpu
