// The e4m3 reference (kernels/cpu/fp8.hpp) against CUDA's own conversions (cuda_fp8.h), which the
// FP8 kernels use on the device. Host code only: it runs without a GPU.
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/fp8.hpp"

namespace {
using namespace ght::kernels::cpu;

std::uint8_t cuda_encode(float x) {
  return static_cast<std::uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

TEST(E4m3Cuda, EveryCodeDecodesAsCudaDoes) {
  for (unsigned c = 0; c < 256; ++c) {
    __nv_fp8_e4m3 f;
    f.__x = static_cast<__nv_fp8_storage_t>(c);
    const float cuda = static_cast<float>(f);
    const float ours = e4m3_to_float(static_cast<std::uint8_t>(c));
    if (std::isnan(cuda)) {
      EXPECT_TRUE(std::isnan(ours)) << c;
    } else {
      EXPECT_EQ(std::bit_cast<std::uint32_t>(ours), std::bit_cast<std::uint32_t>(cuda)) << c;
    }
  }
}

TEST(E4m3Cuda, EncodesAsCudaDoesOverFloatsOfEveryExponentAndAtEveryMidpoint) {
  // Every 251st bit pattern (17M floats: every exponent, both signs, NaNs and infinities).
  long mismatches = 0;
  for (std::uint64_t b = 0; b <= 0xFFFFFFFFull; b += 251) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(b));
    const std::uint8_t ours = e4m3_from_float(x), cuda = cuda_encode(x);
    const bool same = std::isnan(x) ? (ours & 0x7F) == 0x7F && (cuda & 0x7F) == 0x7F : ours == cuda;
    if (!same && ++mismatches <= 5) ADD_FAILURE() << "x = " << x << ": ours " << +ours << ", CUDA " << +cuda;
  }
  EXPECT_EQ(mismatches, 0);
  // The midpoints between neighbouring codes and the floats on either side of them.
  for (unsigned c = 0; c < 0x7E; ++c) {
    const float lo = e4m3_to_float(static_cast<std::uint8_t>(c)), hi = e4m3_to_float(static_cast<std::uint8_t>(c + 1));
    const float mid = (lo + hi) / 2;
    for (const float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), -mid}) {
      EXPECT_EQ(e4m3_from_float(x), cuda_encode(x)) << "x = " << x;
    }
  }
}

}  // namespace
