#include "kernels/cpu/gemm.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/detail/common.hpp"

namespace ght::kernels::cpu {

namespace {

// Register/L1 tile: kMr rows of C by kNc columns accumulate in a local buffer while k runs, so each
// B row is loaded once per kMr rows. The inner j loop has no cross-lane reduction and vectorises
// without -ffast-math.
constexpr std::int64_t kMr = 4;
constexpr std::int64_t kNc = 32;

// One kMr x kNc tile of C (rows i0.., columns j0..); see gemm_axpy.
template <class T>
inline __attribute__((always_inline)) void gemm_tile_body(
    T* C, const T* A, std::int64_t ars, std::int64_t acs, const T* B, std::int64_t N,
    std::int64_t K, std::int64_t i0, std::int64_t j0, std::int64_t mr, std::int64_t nc,
    bool accumulate) {
  alignas(64) T acc[kMr][kNc];
  for (std::int64_t r = 0; r < kMr; ++r)
    for (std::int64_t j = 0; j < kNc; ++j) acc[r][j] = T(0);
  if (mr == kMr && nc == kNc) {
    for (std::int64_t k = 0; k < K; ++k) {
      const T* b = B + k * N + j0;
      const T a0 = A[(i0 + 0) * ars + k * acs], a1 = A[(i0 + 1) * ars + k * acs];
      const T a2 = A[(i0 + 2) * ars + k * acs], a3 = A[(i0 + 3) * ars + k * acs];
#pragma omp simd
      for (std::int64_t j = 0; j < kNc; ++j) {
        acc[0][j] += a0 * b[j];
        acc[1][j] += a1 * b[j];
        acc[2][j] += a2 * b[j];
        acc[3][j] += a3 * b[j];
      }
    }
  } else {
    for (std::int64_t k = 0; k < K; ++k) {
      const T* b = B + k * N + j0;
      for (std::int64_t r = 0; r < mr; ++r) {
        const T a = A[(i0 + r) * ars + k * acs];
#pragma omp simd
        for (std::int64_t j = 0; j < nc; ++j) acc[r][j] += a * b[j];
      }
    }
  }
  for (std::int64_t r = 0; r < mr; ++r) {
    T* c = C + (i0 + r) * N + j0;
    if (accumulate) {
      for (std::int64_t j = 0; j < nc; ++j) c[j] += acc[r][j];
    } else {
      for (std::int64_t j = 0; j < nc; ++j) c[j] = acc[r][j];
    }
  }
}

// On x86-64 the tile is compiled twice, for the portable baseline and for AVX2, and the loader
// picks the best one for the CPU (GCC function multi-versioning). No FMA clone: contraction
// would change rounding between the two versions. Other targets (aarch64) get the baseline.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define GHT_GEMM_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define GHT_GEMM_CLONES
#endif

#define GHT_GEMM_TILE(T)                                                                        \
  GHT_GEMM_CLONES void gemm_tile(T* C, const T* A, std::int64_t ars, std::int64_t acs,          \
                                 const T* B, std::int64_t N, std::int64_t K, std::int64_t i0,   \
                                 std::int64_t j0, std::int64_t mr, std::int64_t nc,             \
                                 bool accumulate) {                                             \
    gemm_tile_body<T>(C, A, ars, acs, B, N, K, i0, j0, mr, nc, accumulate);                     \
  }
GHT_GEMM_TILE(float)
GHT_GEMM_TILE(double)
#undef GHT_GEMM_TILE

// C (M, N) (+)= sum_k a(i, k) · B[k, j] with a(i, k) = A[i·ars + k·acs] and B (K, N) row-major.
template <class T>
void gemm_axpy(T* C, const T* A, std::int64_t ars, std::int64_t acs, const T* B, std::int64_t M,
               std::int64_t N, std::int64_t K, bool accumulate) {
  const std::int64_t mb = (M + kMr - 1) / kMr, nb = (N + kNc - 1) / kNc;
#pragma omp parallel for collapse(2) schedule(static) if(detail::worth_parallel(M * N * K))
  for (std::int64_t ib = 0; ib < mb; ++ib) {
    for (std::int64_t jb = 0; jb < nb; ++jb) {
      const std::int64_t i0 = ib * kMr, j0 = jb * kNc;
      gemm_tile(C, A, ars, acs, B, N, K, i0, j0, std::min(kMr, M - i0), std::min(kNc, N - j0),
                accumulate);
    }
  }
}

}  // namespace

template <class T>
void matmul_nn(T* C, const T* A, const T* B, std::int64_t M, std::int64_t N, std::int64_t K,
               bool accumulate) {
  if (M <= 0 || N <= 0) return;
  gemm_axpy(C, A, K, 1, B, M, N, K, accumulate);
}

template <class T>
void matmul_tn(T* C, const T* A, const T* B, std::int64_t M, std::int64_t N, std::int64_t K,
               bool accumulate) {
  if (M <= 0 || N <= 0) return;
  gemm_axpy(C, A, 1, M, B, M, N, K, accumulate);
}

template <class T>
void matmul_nt(T* C, const T* A, const T* B, std::int64_t M, std::int64_t N, std::int64_t K,
               bool accumulate) {
  if (M <= 0 || N <= 0) return;
  // Transpose B (N, K) into (K, N) once; it costs N·K against M·N·K multiply-adds.
  std::vector<T> bt(static_cast<std::size_t>(N * K));
#pragma omp parallel for schedule(static) if(detail::worth_parallel(N * K))
  for (std::int64_t k = 0; k < K; ++k)
    for (std::int64_t n = 0; n < N; ++n) bt[k * N + n] = B[n * K + k];
  gemm_axpy(C, A, K, 1, bt.data(), M, N, K, accumulate);
}

template <class T>
void linear_forward(T* out, const T* inp, const T* weight, std::int64_t N, int IC, int OC) {
  matmul_nt(out, inp, weight, N, OC, IC, false);
}

template <class T>
void linear_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                     std::int64_t N, int IC, int OC, bool accumulate_dinp) {
  if (dinp != nullptr) matmul_nn(dinp, dout, weight, N, IC, OC, accumulate_dinp);  // (N,OC)·(OC,IC)
  if (dweight != nullptr) matmul_tn(dweight, dout, inp, OC, IC, N, true);          // (OC,N)·(N,IC)
}

#define GHT_INSTANTIATE(T)                                                                        \
  template void matmul_nt<T>(T*, const T*, const T*, std::int64_t, std::int64_t, std::int64_t,   \
                             bool);                                                               \
  template void matmul_nn<T>(T*, const T*, const T*, std::int64_t, std::int64_t, std::int64_t,   \
                             bool);                                                               \
  template void matmul_tn<T>(T*, const T*, const T*, std::int64_t, std::int64_t, std::int64_t,   \
                             bool);                                                               \
  template void linear_forward<T>(T*, const T*, const T*, std::int64_t, int, int);               \
  template void linear_backward<T>(T*, T*, const T*, const T*, const T*, std::int64_t, int, int, \
                                   bool);
GHT_INSTANTIATE(float)
GHT_INSTANTIATE(double)
#undef GHT_INSTANTIATE

}  // namespace ght::kernels::cpu
