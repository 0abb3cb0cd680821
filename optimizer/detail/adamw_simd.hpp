#pragma once
// Internal: the host's element loops (AdamW over fp32 and bf16 state, the sum of squares, the
// gradient accumulator) written once with Google Highway. Every target Highway can build for is
// in the binary and the best one the CPU supports runs (dynamic dispatch): on x86-64 AVX-512,
// AVX2, SSE4, SSSE3 and the one-lane scalar fallback (HWY_SCALAR: GCC before 12.3 has no
// EMU128); on aarch64 SVE2_128 (128-bit SVE2, Grace), SVE_256, SVE2, SVE, NEON and scalar.
// The loops never fuse a multiply and an add
// and compute every element on its own, so each target gives the bytes of the scalar semantics
// in adamw_kernels.hpp (the GPU kernels' bytes), wherever a thread's range starts.
// adamw_cpu.cpp and accumulate.cpp split the work over threads and call these per range.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "optimizer/adamw_kernels.hpp"

namespace ght::optimizer::simd {

/// What the update writes as the compute weight (adamw_kernels.hpp): nothing, bf16_rn(p), or
/// bf16_rn(p + extrapolate·(p − p_before)).
enum class Weight : int { none = 0, plain = 1, predict = 2 };

/// One range of an AdamW span: n elements from element 0 of each pointer. m and v are fp32 or
/// bf16 bits (state), g fp32 or bf16 bits (grad); w may be null with Weight::none.
struct AdamWRange {
  float* master = nullptr;
  void* m = nullptr;
  void* v = nullptr;
  const void* g = nullptr;
  std::uint16_t* w = nullptr;
  std::size_t n = 0;
  GradType grad = GradType::fp32;
  bool bf16_state = false;
  Weight weight = Weight::none;
  std::uint64_t stream = 0;  ///< bf16 state: round_stream(key, step)
  std::uint64_t first = 0;   ///< bf16 state: the region index of element 0
};

/// The update of every element of r (bf16 state: m rounded to nearest even, v stochastically
/// with round_bits(stream, first + i), exactly as float_to_bf16_bits_sr).
void adamw(const AdamWRange& r, const StepScalars& k);

/// Σ g² in double of n gradients (fp32 or bf16 bits). The order of the additions is fixed and
/// the same on every target: element i goes to partial sum i mod 8, and the eight partials are
/// added as ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)) at the end.
[[nodiscard]] double sumsq(const void* g, GradType t, std::size_t n);

/// dst[i] = dst[i] + widen(src[i]) (assign: dst[i] = widen(src[i])), src fp32 or bf16 bits.
void accumulate(float* dst, const void* src, GradType t, std::size_t n, bool assign);

/// The Highway targets compiled into these loops that this CPU can run, best first (as
/// hwy::SupportedAndGeneratedTargets), and the name of one (hwy::TargetName).
[[nodiscard]] std::vector<std::int64_t> targets();
[[nodiscard]] std::string target_name(std::int64_t target);
/// The name of the target the dispatch picks now (for benchmarks' and tests' output).
[[nodiscard]] std::string active_target();
/// Tests only: let dispatch choose among `target` alone (hwy::SetSupportedTargetsForTest; 0
/// restores every supported one). Process-wide, the host triad's dispatch included.
void force_target_for_test(std::int64_t target);

}  // namespace ght::optimizer::simd
