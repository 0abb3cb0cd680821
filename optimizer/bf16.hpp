#pragma once
/**
 * @file bf16.hpp
 * @brief Portable bfloat16 storage type and float <-> bf16 conversions.
 *
 * `float_to_bf16_bits` rounds to nearest, ties to even, and returns the canonical NaN 0x7FFF for
 * every NaN input: bit for bit what CUDA's `__float2bfloat16_rn` (PTX `cvt.rn.bf16.f32`) gives,
 * including subnormals (kept, not flushed) and overflow to infinity. It is plain integer code, so
 * it vectorises on x86 and aarch64 alike and also compiles for the device.
 * `float_to_bf16_bits_sr` rounds stochastically from 16 random bits the caller supplies (bf16
 * AdamW state, see adamw_kernels.hpp).
 */
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define GHT_HD __host__ __device__ __forceinline__
#else
#define GHT_HD inline
#endif

namespace ght::optimizer {

/// bf16 as raw bits; layout-compatible with CUDA's __nv_bfloat16 (2 bytes, same bit layout).
struct bf16 {
  std::uint16_t bits;
};
static_assert(sizeof(bf16) == 2);

GHT_HD std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

GHT_HD float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

/// Round-to-nearest-even float -> bf16 bits; NaN -> 0x7FFF (as __float2bfloat16_rn).
GHT_HD std::uint16_t float_to_bf16_bits(float f) {
  const std::uint32_t x = float_bits(f);
  // Adding 0x7FFF plus the kept LSB carries into the kept half exactly when the dropped half is
  // above the midpoint, or at it with an odd kept half. Finite values cannot overflow 32 bits.
  const std::uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  const bool is_nan = (x & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<std::uint16_t>(is_nan ? 0x7FFFu : rounded);
}

/// Stochastically rounded float -> bf16 bits: away from zero with probability equal to the
/// dropped fraction of an ulp (r16: 16 uniform random bits), so the expected result is f.
/// NaN -> 0x7FFF; ±Inf stay; the largest finite values may round to ±Inf, as RNE may.
GHT_HD std::uint16_t float_to_bf16_bits_sr(float f, std::uint32_t r16) {
  const std::uint32_t x = float_bits(f);
  const bool is_nan = (x & 0x7FFFFFFFu) > 0x7F800000u;
  // Adding r16 < 2^16 carries into the kept half with probability (dropped half) / 2^16; the
  // largest non-NaN pattern (0xFF800000) cannot overflow 32 bits.
  return static_cast<std::uint16_t>(is_nan ? 0x7FFFu : (x + r16) >> 16);
}

/// Exact bf16 -> float widening.
GHT_HD float bf16_bits_to_float(std::uint16_t b) {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}

GHT_HD bf16 to_bf16(float f) { return bf16{float_to_bf16_bits(f)}; }
GHT_HD float to_float(bf16 b) { return bf16_bits_to_float(b.bits); }
GHT_HD float to_float(float f) { return f; }

}  // namespace ght::optimizer
