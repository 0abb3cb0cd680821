#include "kernels/cpu/swiglu_experts.hpp"

#include <algorithm>
#include <vector>

#include "kernels/cpu/detail/common.hpp"
#include "kernels/cpu/gemm.hpp"

namespace ght::kernels::cpu {

template <class T>
void swiglu_experts_forward(T* y, T* gate, T* up, T* act, const T* xp, const T* w_gate,
                            const T* w_up, const T* w_down, std::int64_t expert_stride,
                            const std::int32_t* expert_offsets, int E, int C, int F) {
  for (int e = 0; e < E; ++e) {
    const std::int64_t r0 = expert_offsets[e], rows = expert_offsets[e + 1] - r0;
    if (rows <= 0) continue;
    const std::int64_t wo = e * expert_stride;
    T* g = gate + r0 * F;
    T* u = up + r0 * F;
    T* a = act + r0 * F;
    matmul_nt(g, xp + r0 * C, w_gate + wo, rows, F, C);  // (rows, C)·(F, C)^T
    matmul_nt(u, xp + r0 * C, w_up + wo, rows, F, C);
#pragma omp parallel for schedule(static) if(detail::worth_parallel(rows * F))
    for (std::int64_t i = 0; i < rows * F; ++i) a[i] = g[i] * detail::sigmoid(g[i]) * u[i];
    matmul_nt(y + r0 * C, a, w_down + wo, rows, C, F);  // (rows, F)·(C, F)^T
  }
}

template <class T>
void swiglu_experts_backward(T* dxp, T* dw_gate, T* dw_up, T* dw_down, const T* dy, const T* xp,
                             const T* gate, const T* up, const T* act, const T* w_gate,
                             const T* w_up, const T* w_down, std::int64_t expert_stride,
                             const std::int32_t* expert_offsets, int E, int C, int F) {
  std::int64_t max_rows = 0;
  for (int e = 0; e < E; ++e)
    max_rows = std::max<std::int64_t>(max_rows, expert_offsets[e + 1] - expert_offsets[e]);
  std::vector<T> dg(static_cast<std::size_t>(max_rows * F)), du(dg.size());
  for (int e = 0; e < E; ++e) {
    const std::int64_t r0 = expert_offsets[e], rows = expert_offsets[e + 1] - r0;
    if (rows <= 0) continue;
    const std::int64_t wo = e * expert_stride;
    const T* dye = dy + r0 * C;
    const T* xe = xp + r0 * C;
    const T* g = gate + r0 * F;
    const T* u = up + r0 * F;
    matmul_nn(dg.data(), dye, w_down + wo, rows, F, C);                  // dact = dy·Wd
    matmul_tn(dw_down + wo, dye, act + r0 * F, C, F, rows, true);        // dWd += dy^T·act
#pragma omp parallel for schedule(static) if(detail::worth_parallel(rows * F))
    for (std::int64_t i = 0; i < rows * F; ++i) {
      // silu(g) = g·σ(g), silu'(g) = σ(g)·(1 + g·(1 − σ(g)))
      const T s = detail::sigmoid(g[i]);
      const T da = dg[i];
      du[i] = da * g[i] * s;
      dg[i] = da * u[i] * s * (T(1) + g[i] * (T(1) - s));
    }
    matmul_nn(dxp + r0 * C, dg.data(), w_gate + wo, rows, C, F);         // dxp = dg·Wg
    matmul_nn(dxp + r0 * C, du.data(), w_up + wo, rows, C, F, true);     //     + du·Wu
    matmul_tn(dw_gate + wo, dg.data(), xe, F, C, rows, true);            // dWg += dg^T·xp
    matmul_tn(dw_up + wo, du.data(), xe, F, C, rows, true);              // dWu += du^T·xp
  }
}

#define GHT_INSTANTIATE(T)                                                                     \
  template void swiglu_experts_forward<T>(T*, T*, T*, T*, const T*, const T*, const T*,       \
                                          const T*, std::int64_t, const std::int32_t*, int,   \
                                          int, int);                                           \
  template void swiglu_experts_backward<T>(T*, T*, T*, T*, const T*, const T*, const T*,      \
                                           const T*, const T*, const T*, const T*, const T*,  \
                                           std::int64_t, const std::int32_t*, int, int, int);
GHT_INSTANTIATE(float)
GHT_INSTANTIATE(double)
#undef GHT_INSTANTIATE

}  // namespace ght::kernels::cpu
