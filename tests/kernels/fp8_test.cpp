// The e4m3 reference and block-scaled quantisation (kernels/cpu/fp8.hpp): every code's value from
// the format's definition, rounding at every midpoint, the round trip's bound, and the block-scaled
// GEMM against an fp64 GEMM of the unquantised operands within the bound that e4m3's precision gives.
#include "kernels/cpu/fp8.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tier/error.hpp"

namespace {
using namespace ght::kernels::cpu;

// The value of a code from the format's definition, in double.
double definition(unsigned c) {
  const int e = static_cast<int>((c >> 3) & 0xF), m = static_cast<int>(c & 7);
  const double mag = e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
  return (c & 0x80) ? -mag : mag;
}

TEST(E4m3, EveryCodeDecodesToItsDefinitionAndEncodesBack) {
  for (unsigned c = 0; c < 256; ++c) {
    const float v = e4m3_to_float(static_cast<std::uint8_t>(c));
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    EXPECT_EQ(static_cast<double>(v), definition(c)) << c;
    // -0 encodes as 0x80, +0 as 0x00: every code but the NaNs is its own value's encoding.
    EXPECT_EQ(e4m3_from_float(v), c) << c;
  }
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));
}

TEST(E4m3, MidpointsRoundToEvenAndNeighboursToTheNearest) {
  for (unsigned c = 0; c < 0x7E; ++c) {  // consecutive positive codes c, c + 1
    const double lo = definition(c), hi = definition(c + 1), mid = (lo + hi) / 2;
    const auto mid_f = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(mid_f), mid) << "midpoint not a float";
    const unsigned even = (c & 1) ? c + 1 : c;
    EXPECT_EQ(e4m3_from_float(mid_f), even) << "midpoint of " << c;
    EXPECT_EQ(e4m3_from_float(std::nextafter(mid_f, 0.0f)), c) << "just below the midpoint of " << c;
    EXPECT_EQ(e4m3_from_float(std::nextafter(mid_f, 1e9f)), c + 1) << "just above the midpoint of " << c;
    EXPECT_EQ(e4m3_from_float(-mid_f), even | 0x80) << "negative midpoint of " << c;
  }
}

TEST(E4m3, SaturatesBeyondTheRangeAndKeepsNan) {
  EXPECT_EQ(e4m3_from_float(448.0f), 0x7E);
  EXPECT_EQ(e4m3_from_float(470.0f), 0x7E);
  EXPECT_EQ(e4m3_from_float(1e30f), 0x7E);
  EXPECT_EQ(e4m3_from_float(-INFINITY), 0xFE);
  EXPECT_EQ(e4m3_from_float(INFINITY), 0x7E);
  EXPECT_EQ(e4m3_from_float(NAN) & 0x7F, 0x7F);
  EXPECT_EQ(e4m3_from_float(std::ldexp(1.0f, -11)), 0x00);  // below half the smallest subnormal
}

std::vector<float> spread_values(std::size_t n, std::mt19937& rng) {
  // Magnitudes over 2^-20 .. 2^10 and both signs, so tiles hold values that scale into the
  // subnormals as well as the normals.
  std::uniform_real_distribution<float> exponent(-20.0f, 10.0f);
  std::bernoulli_distribution negative(0.5);
  std::vector<float> x(n);
  for (float& v : x) v = (negative(rng) ? -1.0f : 1.0f) * std::exp2(exponent(rng));
  return x;
}

// |x - read back| within 2^-4 |x| (normal after scaling) or 2^-10 s (subnormal), plus the fp32
// roundings of the scaling (a few ulp).
double round_trip_bound(double x, double s) {
  const double rel = 0x1p-4 * std::fabs(x), abs = 0x1p-10 * s;
  return std::max(rel, abs) + 4e-7 * std::fabs(x);
}

TEST(Fp8Blocked, RoundTripsWithinTheFormatsBoundForActivationAndWeightTiles) {
  std::mt19937 rng(7);
  for (const auto& [rows, cols, tr, tc] : {std::tuple{5, 300, 1, 128}, std::tuple{257, 200, 128, 128}}) {
    const std::vector<float> x = spread_values(static_cast<std::size_t>(rows) * cols, rng);
    const Fp8Blocked q = quantize_blocked(x.data(), rows, cols, tr, tc);
    ASSERT_EQ(q.scales.size(), static_cast<std::size_t>(((rows + tr - 1) / tr) * ((cols + tc - 1) / tc)));
    std::vector<float> back(x.size());
    dequantize_blocked(q, back.data());
    double worst = 0;
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        const std::size_t i = static_cast<std::size_t>(r) * cols + c;
        const double err = std::fabs(static_cast<double>(back[i]) - x[i]);
        const double bound = round_trip_bound(x[i], q.scale(r, c));
        ASSERT_LE(err, bound) << "element (" << r << ", " << c << ") " << x[i] << " read back " << back[i];
        worst = std::max(worst, err / bound);
      }
    }
    // The bound is tight: some element comes close to it (a loose bound would pass anything).
    EXPECT_GT(worst, 0.5) << rows << "x" << cols;
  }
}

TEST(Fp8Blocked, AZeroTileHasScaleZeroAndANonFiniteElementIsRefusedByPosition) {
  std::vector<float> x(256, 0.0f);
  x[200] = 3.0f;
  const Fp8Blocked q = quantize_blocked(x.data(), 1, 256, 1, 128);
  EXPECT_EQ(q.scales[0], 0.0f);
  EXPECT_EQ(q.scales[1], 3.0f / 448.0f);
  EXPECT_EQ(q.codes[200], 0x7E);  // the tile's largest magnitude is 448
  x[70] = NAN;
  try {
    (void)quantize_blocked(x.data(), 1, 256, 1, 128);
    FAIL() << "a NaN was quantised";
  } catch (const ght::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("element (0, 70)"), std::string::npos) << e.what();
  }
}

TEST(Fp8Gemm, MatchesTheFp64ProductWithinTheBoundOfItsOperandsRoundTrips) {
  std::mt19937 rng(11);
  const int M = 7, N = 130, K = 300;  // a partial K tile and a partial weight block
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> a(static_cast<std::size_t>(M) * K), b(static_cast<std::size_t>(N) * K);
  for (float& v : a) v = normal(rng);
  for (float& v : b) v = 0.02f * normal(rng);
  const Fp8Blocked qa = quantize_blocked(a.data(), M, K, 1, kFp8Tile);
  const Fp8Blocked qb = quantize_blocked(b.data(), N, K, kFp8Tile, kFp8Tile);
  std::vector<float> c(static_cast<std::size_t>(M) * N);
  matmul_nt_fp8(c.data(), qa, qb);
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      double exact = 0, bound = 0, magnitude = 0;
      for (int k = 0; k < K; ++k) {
        const double x = a[static_cast<std::size_t>(i) * K + k], y = b[static_cast<std::size_t>(j) * K + k];
        const double ex = round_trip_bound(x, qa.scale(i, k)), ey = round_trip_bound(y, qb.scale(j, k));
        exact += x * y;
        bound += ex * std::fabs(y) + std::fabs(x) * ey + ex * ey;
        magnitude += (std::fabs(x) + ex) * (std::fabs(y) + ey);
      }
      // fp32 sums of K products and K / 128 scaled partials: at most K roundings of 2^-24.
      bound += K * 0x1p-24 * magnitude * 1.01;
      EXPECT_LE(std::fabs(c[static_cast<std::size_t>(i) * N + j] - exact), bound) << i << ", " << j;
    }
  }
}

TEST(Fp8Gemm, RefusesTilesItDoesNotComputeWith) {
  std::vector<float> a(128, 1.0f);
  const Fp8Blocked rows = quantize_blocked(a.data(), 1, 128, 1, 128);
  const Fp8Blocked wrong = quantize_blocked(a.data(), 1, 128, 1, 128);
  float c = 0;
  EXPECT_THROW(matmul_nt_fp8(&c, rows, wrong), ght::logic_error);
}

}  // namespace
