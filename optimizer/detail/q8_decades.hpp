#pragma once
// Internal: the q8 maps' values in closed form (adamw_kernels.hpp, Q8Tables), so the host loops
// dequantize a code by arithmetic and two in-register lookups instead of a gather from the
// 256-entry map.
//
// The math. A code c >= 1 (v; m: its magnitude a, with top = 6 instead of 7) has
// F = floor(log2 c), z = top - F, f = c - 2^F and the value N / D with the integers
//   N = 2^F + 9(f + 1) = 9c + 9 - 8 · 2^F        (at most 10 · 2^F <= 1280: 11 bits)
//   D = 10 · 2^F · 10^z = 2^(top+1) · 5^(z+1)    (top + 1 = 8 for v: 2^8 · 5^(8-F))
// The table entry is float(double(N / D)). The double quotient is correctly rounded and carries
// 53 >= 2 · 24 + 2 bits, so rounding it again to fp32 is the correctly rounded fp32 of N / D
// (double rounding is innocuous for a quotient at that precision): the entry is RN32(N / D).
// No fp32 multiply by one reciprocal constant per decade gives RN32(N / D) for every code (F >= 3
// for v, F >= 2 for m fail), and a division per code would queue behind the update's own division
// and square root on the same unit (where the AVX-512 loop waits most, bench/NOTES.md), so
// 1 / D is split into hi + lo: hi is 1 / D rounded to 12 significant bits, lo = RN32(1 / D - hi).
// Then N · hi is exact in fp32 (11 + 12 bits) and
//   value = RN32(N · hi + RN32(N · lo))
// differs from N / D before its last rounding by about 2^-36 relative, which decides the
// rounding wrongly only for a quotient that close to a halfway point between two floats; no code
// of either map is (checked for all 256 codes of each map when the constants are built, and by
// tests/optimizer/simd_kernels_test.cpp on every SIMD target).
//
// The decade's constants are looked up by the low 3 bits of the biased exponent of float(c)
// (127 + F, F = 0..7): entry (F + 7) mod 8, so the index is one shift and one mask of the bits the
// conversion of the code already made, and 2^F is those bits with the mantissa cleared.
#include <cstdint>

namespace ght::optimizer::simd {

/// Floats each decade table holds: 8 entries, zero-padded so a vector of any target's width
/// (up to 2048-bit SVE) loads it whole.
inline constexpr unsigned kQ8DecadeLanes = 64;

/// v's value of code 0 (10^-8; not of the closed form).
inline constexpr float kQ8VZero = 1e-8f;

/// hi and lo of 1 / D per decade, entry (127 + F) & 7, for m's magnitudes and for v.
struct Q8Decades {
  alignas(64) float m_hi[kQ8DecadeLanes];
  alignas(64) float m_lo[kQ8DecadeLanes];
  alignas(64) float v_hi[kQ8DecadeLanes];
  alignas(64) float v_lo[kQ8DecadeLanes];
};

/// The constants, built once; throws ght::logic_error if a code's closed-form value were not its
/// q8_tables() entry bit for bit (every code of both maps is checked).
[[nodiscard]] const Q8Decades& q8_decades();

/// The closed form for one code, as every vector lane computes it: m's signed value (is_v false,
/// code with the sign bit 0x80) or v's value.
[[nodiscard]] float q8_closed_value(const Q8Decades& d, std::uint8_t code, bool is_v) noexcept;

}  // namespace ght::optimizer::simd
