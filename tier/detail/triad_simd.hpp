#pragma once
// Internal: the host STREAM triad's loop (host_triad.cpp), written once with Google Highway and
// dispatched at run time to the best target the CPU supports (x86-64: AVX-512, AVX2, SSE4, SSSE3
// or scalar; aarch64: SVE2_128, SVE_256, SVE2, SVE, NEON or scalar; see optimizer/detail/adamw_simd.hpp).
#include <cstddef>

namespace ght::tier::detail {

/// a[i] = b[i] + s·c[i] for i in [0, n): a multiply, then an add (never fused). When a, b and c
/// are aligned to the target's vector size the stores are non-temporal where the target has
/// them (x86: they skip the read-for-ownership, as STREAM counts), fenced before returning;
/// otherwise plain loads and stores. Any n; the last partial vector is done element by element.
void triad(float* a, const float* b, const float* c, float s, std::size_t n);

}  // namespace ght::tier::detail
