#include "kernels/cpu/qk_norm_rope.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/detail/common.hpp"

namespace ght::kernels::cpu {

namespace {
// cos/sin of pos·theta^(-2i/D) for i < D/2. Angles in double so the float path loses nothing
// before the final rounding of cos and sin.
template <class T>
void rope_table(T* cs, T* sn, std::int32_t pos, int D, double theta) {
  const int half = D / 2;
  for (int i = 0; i < half; ++i) {
    const double inv_freq = 1.0 / std::pow(theta, static_cast<double>(2 * i) / D);
    const double a = static_cast<double>(pos) * inv_freq;
    cs[i] = static_cast<T>(std::cos(a));
    sn[i] = static_cast<T>(std::sin(a));
  }
}
}  // namespace

void make_positions(std::int32_t* pos, const std::int32_t* doc_ids, int B, int T) {
  for (int b = 0; b < B; ++b) {
    int start = 0;
    for (int t = 0; t < T; ++t) {
      const std::int64_t i = static_cast<std::int64_t>(b) * T + t;
      if (doc_ids != nullptr && t > 0 && doc_ids[i] != doc_ids[i - 1]) start = t;
      pos[i] = t - start;
    }
  }
}

template <class T>
void qk_norm_rope_forward(T* out, T* rstd, const T* x, const T* w, const std::int32_t* pos,
                          std::int64_t N, int H, int D, double eps, double theta) {
  const int half = D / 2;
#pragma omp parallel if(detail::worth_parallel(N * H * D * 4))
  {
    std::vector<T> cs(half), sn(half), n(D);
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < N; ++t) {
      rope_table(cs.data(), sn.data(), pos[t], D, theta);
      for (int h = 0; h < H; ++h) {
        const std::int64_t base = (t * H + h) * D;
        const T* xi = x + base;
        T ss = 0;
        for (int d = 0; d < D; ++d) ss += xi[d] * xi[d];
        const T r = T(1) / std::sqrt(ss / T(D) + T(eps));
        rstd[t * H + h] = r;
        for (int d = 0; d < D; ++d) n[d] = xi[d] * r * w[d];
        T* oi = out + base;
        for (int i = 0; i < half; ++i) {
          oi[i] = n[i] * cs[i] - n[i + half] * sn[i];
          oi[i + half] = n[i + half] * cs[i] + n[i] * sn[i];
        }
      }
    }
  }
}

template <class T>
void qk_norm_rope_backward(T* dx, T* dw, const T* dout, const T* x, const T* w, const T* rstd,
                           const std::int32_t* pos, std::int64_t N, int H, int D, double theta) {
  const int half = D / 2;
  const std::int64_t nb = detail::num_blocks(N, detail::kReduceBlock);
  std::vector<T> part(static_cast<std::size_t>(nb * D), T(0));
#pragma omp parallel if(detail::worth_parallel(N * H * D * 4))
  {
    std::vector<T> cs(half), sn(half), g(D);
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < nb; ++b) {
      T* pw = part.data() + b * D;
      const std::int64_t t1 = std::min(N, (b + 1) * detail::kReduceBlock);
      for (std::int64_t t = b * detail::kReduceBlock; t < t1; ++t) {
        rope_table(cs.data(), sn.data(), pos[t], D, theta);
        for (int h = 0; h < H; ++h) {
          const std::int64_t base = (t * H + h) * D;
          const T* go = dout + base;
          // The rotation is orthogonal: its backward is the transposed rotation.
          for (int i = 0; i < half; ++i) {
            g[i] = go[i] * cs[i] + go[i + half] * sn[i];
            g[i + half] = go[i + half] * cs[i] - go[i] * sn[i];
          }
          const T* xi = x + base;
          const T r = rstd[t * H + h];
          T dot = 0;
          for (int d = 0; d < D; ++d) dot += g[d] * w[d] * xi[d];
          const T k = r * r * dot / T(D);
          T* dxi = dx + base;
          for (int d = 0; d < D; ++d) {
            dxi[d] = r * (g[d] * w[d] - xi[d] * k);
            pw[d] += g[d] * xi[d] * r;
          }
        }
      }
    }
  }
  detail::add_partials(dw, part, nb, D);
}

#define GHT_INSTANTIATE(T)                                                                      \
  template void qk_norm_rope_forward<T>(T*, T*, const T*, const T*, const std::int32_t*,       \
                                        std::int64_t, int, int, double, double);               \
  template void qk_norm_rope_backward<T>(T*, T*, const T*, const T*, const T*, const T*,       \
                                         const std::int32_t*, std::int64_t, int, int, double);
GHT_INSTANTIATE(float)
GHT_INSTANTIATE(double)
#undef GHT_INSTANTIATE

}  // namespace ght::kernels::cpu
