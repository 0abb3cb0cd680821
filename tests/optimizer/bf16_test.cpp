// float -> bf16 must equal CUDA's __float2bfloat16_rn bit for bit. The GPU test compares with the
// hardware conversion exhaustively; here we check the defining cases and compare a large sample
// of bit patterns with an independent formulation (the remainder test of cuda_bf16.hpp).
#include "optimizer/bf16.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace ght::optimizer {
namespace {

std::uint16_t bits_of(float f) { return float_to_bf16_bits(f); }
float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The formulation CUDA's host fallback uses: keep the top half, inspect the dropped half.
std::uint16_t reference_rn(std::uint32_t x) {
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;
  std::uint16_t r = static_cast<std::uint16_t>(x >> 16);
  const std::uint32_t rem = x << 16;
  if (rem > 0x80000000u || (rem == 0x80000000u && (r & 1u) != 0)) ++r;
  return r;
}

TEST(Bf16, ExactValuesRoundTrip) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.0f, 0.5f, 3.0f, 65536.0f, -1.5f}) {
    EXPECT_EQ(bf16_bits_to_float(bits_of(f)), f) << f;
  }
  EXPECT_EQ(bits_of(-0.0f), 0x8000);
  EXPECT_EQ(bits_of(1.0f), 0x3F80);
}

TEST(Bf16, TiesGoToEven) {
  // 1 + 2^-8 lies halfway between 1 (even mantissa) and 1 + 2^-7 (odd): rounds down.
  EXPECT_EQ(bits_of(from_bits(0x3F808000u)), 0x3F80);
  // 1 + 3·2^-8 lies halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up.
  EXPECT_EQ(bits_of(from_bits(0x3F818000u)), 0x3F82);
  // Just above and below the midpoint.
  EXPECT_EQ(bits_of(from_bits(0x3F808001u)), 0x3F81);
  EXPECT_EQ(bits_of(from_bits(0x3F807FFFu)), 0x3F80);
  EXPECT_EQ(bits_of(from_bits(0xBF808001u)), 0xBF81);  // negative, magnitude rounds up
}

TEST(Bf16, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(bits_of(inf), 0x7F80);
  EXPECT_EQ(bits_of(-inf), 0xFF80);
  EXPECT_EQ(bits_of(std::numeric_limits<float>::quiet_NaN()), 0x7FFF);
  EXPECT_EQ(bits_of(from_bits(0xFFC00001u)), 0x7FFF);  // negative NaN: canonical NaN too
  EXPECT_EQ(bits_of(from_bits(0x7F800001u)), 0x7FFF);  // signalling NaN whose top half is Inf
  EXPECT_EQ(bits_of(std::numeric_limits<float>::max()), 0x7F80);  // overflows to +Inf
  EXPECT_EQ(bits_of(-std::numeric_limits<float>::max()), 0xFF80);
  EXPECT_EQ(bits_of(from_bits(0x7F7F7FFFu)), 0x7F7F);  // largest value that does not overflow
  // Subnormals are rounded, not flushed.
  EXPECT_EQ(bits_of(from_bits(0x00018000u)), 0x0002);
  EXPECT_EQ(bits_of(from_bits(0x00010000u)), 0x0001);
  EXPECT_EQ(bits_of(from_bits(0x00008000u)), 0x0000);  // tie to even (0)
  EXPECT_EQ(bits_of(from_bits(0x00008001u)), 0x0001);
}

TEST(Bf16, MatchesReferenceOnSampledBitPatterns) {
  std::uint64_t mismatches = 0;
  std::uint32_t first = 0;
  // A stride coprime with 2^32 visits every low-half pattern class many times (~44M values).
  for (std::uint64_t u = 0; u < (1ull << 32); u += 97) {
    const auto x = static_cast<std::uint32_t>(u);
    if (float_to_bf16_bits(from_bits(x)) != reference_rn(x)) {
      if (mismatches++ == 0) first = x;
    }
  }
  // Every pattern of the dropped half around the exponent boundaries.
  for (std::uint32_t hi : {0x0000u, 0x007Fu, 0x0080u, 0x3F7Fu, 0x3F80u, 0x7F7Fu, 0x7F80u, 0x7FC0u,
                           0x8000u, 0xFF7Fu, 0xFF80u}) {
    for (std::uint32_t lo = 0; lo < 0x10000u; ++lo) {
      const std::uint32_t x = (hi << 16) | lo;
      if (float_to_bf16_bits(from_bits(x)) != reference_rn(x)) {
        if (mismatches++ == 0) first = x;
      }
    }
  }
  EXPECT_EQ(mismatches, 0u) << "first mismatch at bits 0x" << std::hex << first;
}

}  // namespace
}  // namespace ght::optimizer
