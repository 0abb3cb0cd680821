#pragma once
// Internal: the host's element loops (AdamW over fp32, bf16 and q8 state, the q8 quantizer, the
// sum of squares, the gradient accumulator) written once with Google Highway. Every target
// Highway can build for is in the binary and the best one the CPU supports runs (dynamic
// dispatch): on x86-64 AVX-512, AVX2, SSE4, SSSE3 and the one-lane scalar fallback (HWY_SCALAR:
// GCC before 12.3 has no EMU128); on aarch64 SVE2_128 (128-bit SVE2, Grace), SVE_256, SVE2, SVE,
// NEON and scalar. The loops never fuse a multiply and an add and compute every element on its
// own, so each target gives the bytes of the scalar semantics in adamw_kernels.hpp (the GPU
// kernels' bytes), wherever a thread's range starts. adamw_cpu.cpp and accumulate.cpp split the
// work over threads and call these per range.
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

/// q8 state's nearest-code search on the host. Bucket b holds the positive fp32 values whose top
/// 16 bits are b; every value from 1.0 up (b >= kQ8IndexTop) has the largest code, since every
/// finite midpoint is below 1. Entry b: bits 16..23 the number of midpoints below the bucket's
/// smallest value, bits 0..15 the low 16 bits of the one midpoint inside the bucket (0xFFFF when
/// none; no bucket holds two, checked when the index is built). The code of a positive q of the
/// bucket is then start + (low 16 bits of q > those bits): the integer order of positive floats
/// with the same top bits is their order, so this counts the midpoints below q, as q8_search.
inline constexpr std::uint32_t kQ8IndexTop = 0x3F80;  // 1.0's bucket
struct Q8Index {
  std::uint32_t m[kQ8IndexTop + 1];  ///< m's magnitudes (m_mid)
  std::uint32_t v[kQ8IndexTop + 1];  ///< v (v_mid)
};
/// The index of q8_tables(), built once (adamw_cpu.cpp).
[[nodiscard]] const Q8Index& q8_index();

/// One range of q8 state: n elements from a block boundary (whole block records at m and v, the
/// last block's elements possibly fewer than kQ8Block). g fp32 or bf16 bits; w may be null with
/// Weight::none.
struct Q8Range {
  float* master = nullptr;
  std::uint8_t* m = nullptr;
  std::uint8_t* v = nullptr;
  const void* g = nullptr;
  std::uint16_t* w = nullptr;
  std::size_t n = 0;
  GradType grad = GradType::fp32;
  Weight weight = Weight::none;
};

/// The q8 update of every block of r, fused per block: codes times scale to fp32 m and v, the
/// fp32 update (as adamw on fp32 state), the block's absmax (x > acc ? x : acc over |x|: NaN
/// never counts) and the new codes (nearest map entry to x · (1 / absmax), Q8Index), then zero
/// codes after the last element and the scale.
void adamw_q8(const Q8Range& r, const StepScalars& k);

/// One block record from len <= kQ8Block values: the scale, the nearest codes, 0 after len.
void q8_store_block(const float* x, std::size_t len, std::uint8_t* rec, bool is_v);

/// The values of the first len <= kQ8Block codes of one block record: code value x scale, one
/// fp32 multiply each (q8_dequantize), the code values in closed form (q8_decades.hpp).
void q8_load_block(const std::uint8_t* rec, std::size_t len, float* x, bool is_v);

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
