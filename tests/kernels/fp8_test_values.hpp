#pragma once
// Test inputs and bit views for the FP8 GPU tests (cuda_fp8_gemm_test, cuda_fp8_fused_test).
#include <cuda_fp8.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cuda_test_util.hpp"

namespace ght::test {

/// bf16 values in [lo, hi) with outliers: ~1% scaled up by 2^4..2^12 (they set their tile's scale,
/// pushing the others down the e4m3 range) and ~2% scaled down by 2^-6..2^-14 (subnormal codes or
/// zero after scaling). Every value is bf16-exact, so CPU and GPU read the same numbers.
inline std::vector<float> values_with_outliers(std::size_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v = random_bf16_values(n, seed, lo, hi);
  std::mt19937 gen(seed ^ 0x9e3779b9u);
  std::uniform_int_distribution<int> pick(0, 999), up(4, 12), down(6, 14);
  for (auto& x : v) {
    const int p = pick(gen);
    if (p < 10) {
      x = round_bf16(std::ldexp(x, up(gen)));
    } else if (p < 30) {
      x = round_bf16(std::ldexp(x, -down(gen)));
    }
  }
  return v;
}

/// The bit patterns of fp32 values (scales compare exactly, NaN and -0 included).
inline std::vector<std::uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<std::uint32_t> b(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) b[i] = std::bit_cast<std::uint32_t>(v[i]);
  return b;
}

/// e4m3 codes as numbers (gtest prints them).
inline std::vector<std::uint32_t> codes_of(const std::vector<__nv_fp8_e4m3>& v) {
  std::vector<std::uint32_t> c(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) c[i] = static_cast<std::uint8_t>(v[i].__x);
  return c;
}

}  // namespace ght::test
