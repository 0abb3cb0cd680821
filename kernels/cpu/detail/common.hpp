#pragma once
// Internal helpers shared by the CPU reference ops (not part of the public API).
#include <cmath>
#include <cstdint>
#include <vector>

namespace ght::kernels::cpu::detail {

/// Rows per block for deterministic reductions over rows: partial sums are formed per block and
/// added in block order, so the result does not depend on the number of threads.
inline constexpr std::int64_t kReduceBlock = 64;

/// Below this much work (elements or multiply-adds) a loop runs on the calling thread: waking a
/// team costs more than it saves, and the tiny shapes of the tests and the `tiny` preset call the
/// ops thousands of times.
inline constexpr std::int64_t kMinParallelWork = std::int64_t(1) << 15;
inline bool worth_parallel(std::int64_t work) { return work >= kMinParallelWork; }

inline std::int64_t num_blocks(std::int64_t n, std::int64_t block) { return (n + block - 1) / block; }

/// Sum `nb` partial vectors of length `c` (row-major (nb, c)) in order into dst (+=).
template <class T>
void add_partials(T* dst, const std::vector<T>& part, std::int64_t nb, int c) {
  for (std::int64_t b = 0; b < nb; ++b) {
    const T* p = part.data() + b * c;
    for (int i = 0; i < c; ++i) dst[i] += p[i];
  }
}

template <class T>
inline T sigmoid(T x) { return T(1) / (T(1) + std::exp(-x)); }

}  // namespace ght::kernels::cpu::detail
