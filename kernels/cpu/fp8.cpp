#include "kernels/cpu/fp8.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <string>

#include "tier/error.hpp"

namespace ght::kernels::cpu {

std::uint8_t e4m3_from_float(float x) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint8_t>((bits >> 24) & 0x80u);
  if (std::isnan(x)) return static_cast<std::uint8_t>(sign | kE4m3Nan);
  const float a = std::fabs(x);
  if (a >= 0x1p-6f) {
    if (a >= kE4m3Max) return static_cast<std::uint8_t>(sign | 0x7Eu);  // satfinite
    // Normal: keep 3 of the 23 mantissa bits, rounding the other 20 to nearest even. A carry out
    // of the mantissa moves to the next exponent, as the bit pattern's addition does.
    const std::uint32_t ab = bits & 0x7FFFFFFFu;
    const std::uint32_t rest = ab & 0xFFFFFu;
    std::uint32_t kept = ab >> 20;  // exponent (8 bits) and the top 3 mantissa bits
    if (rest > 0x80000u || (rest == 0x80000u && (kept & 1u))) ++kept;
    // Rebias the exponent from 127 to 7: subtract (127 - 7) << 3.
    const std::uint32_t code = kept - (120u << 3);
    return static_cast<std::uint8_t>(sign | std::min<std::uint32_t>(code, 0x7Eu));
  }
  // Subnormal (or zero): multiples of 2^-9, rounded to nearest even; 8 of them is the smallest
  // normal, whose code is 0x08 as well.
  const auto m = static_cast<std::uint32_t>(std::nearbyint(a * 0x1p9f));
  return static_cast<std::uint8_t>(sign | m);
}

float e4m3_to_float(std::uint8_t code) noexcept {
  const bool negative = (code & 0x80u) != 0;
  const unsigned exponent = (code >> 3) & 0xFu, mantissa = code & 7u;
  if (exponent == 0xFu && mantissa == 7u) return std::numeric_limits<float>::quiet_NaN();
  const float mag = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                  : std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, static_cast<int>(exponent) - 7);
  return negative ? -mag : mag;
}

Fp8Blocked quantize_blocked(const float* x, std::int64_t rows, std::int64_t cols, int tile_rows, int tile_cols) {
  GHT_EXPECTS(rows >= 0 && cols >= 0 && tile_rows > 0 && tile_cols > 0,
              "quantize_blocked: shape and tile must be positive");
  Fp8Blocked q;
  q.rows = rows;
  q.cols = cols;
  q.tile_rows = tile_rows;
  q.tile_cols = tile_cols;
  q.codes.resize(static_cast<std::size_t>(rows * cols));
  const std::int64_t down = (rows + tile_rows - 1) / tile_rows, across = q.tiles_across();
  q.scales.resize(static_cast<std::size_t>(down * across));
  for (std::int64_t tr = 0; tr < down; ++tr) {
    for (std::int64_t tc = 0; tc < across; ++tc) {
      const std::int64_t r0 = tr * tile_rows, r1 = std::min(rows, r0 + tile_rows);
      const std::int64_t c0 = tc * tile_cols, c1 = std::min(cols, c0 + tile_cols);
      float amax = 0;
      for (std::int64_t r = r0; r < r1; ++r) {
        for (std::int64_t c = c0; c < c1; ++c) {
          const float v = x[r * cols + c];
          GHT_EXPECTS(std::isfinite(v), "quantize_blocked: element (" + std::to_string(r) + ", " + std::to_string(c) +
                                            ") is not finite; its tile's scale would carry it to every element");
          amax = std::max(amax, std::fabs(v));
        }
      }
      const float inv = amax > 0 ? kE4m3Max / amax : 0.0f;
      q.scales[static_cast<std::size_t>(tr * across + tc)] = amax / kE4m3Max;
      for (std::int64_t r = r0; r < r1; ++r) {
        for (std::int64_t c = c0; c < c1; ++c) {
          q.codes[static_cast<std::size_t>(r * cols + c)] = e4m3_from_float(x[r * cols + c] * inv);
        }
      }
    }
  }
  return q;
}

void dequantize_blocked(const Fp8Blocked& q, float* out) {
  for (std::int64_t r = 0; r < q.rows; ++r) {
    for (std::int64_t c = 0; c < q.cols; ++c) {
      const auto i = static_cast<std::size_t>(r * q.cols + c);
      out[i] = e4m3_to_float(q.codes[i]) * q.scale(r, c);
    }
  }
}

void matmul_nt_fp8(float* C, const Fp8Blocked& A, const Fp8Blocked& B) {
  GHT_EXPECTS(A.tile_rows == 1 && A.tile_cols == kFp8Tile,
              "matmul_nt_fp8: A's tiles must be 1 x " + std::to_string(kFp8Tile));
  GHT_EXPECTS(B.tile_rows == kFp8Tile && B.tile_cols == kFp8Tile,
              "matmul_nt_fp8: B's tiles must be " + std::to_string(kFp8Tile) + " x " + std::to_string(kFp8Tile));
  GHT_EXPECTS(A.cols == B.cols, "matmul_nt_fp8: A has K = " + std::to_string(A.cols) + ", B has K = " +
                                    std::to_string(B.cols));
  const std::int64_t M = A.rows, N = B.rows, K = A.cols;
  float decoded[256];
  for (int c = 0; c < 256; ++c) decoded[c] = e4m3_to_float(static_cast<std::uint8_t>(c));
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < M; ++i) {
    for (std::int64_t j = 0; j < N; ++j) {
      float acc = 0;
      for (std::int64_t k0 = 0; k0 < K; k0 += kFp8Tile) {
        const std::int64_t k1 = std::min(K, k0 + kFp8Tile);
        float partial = 0;
        for (std::int64_t k = k0; k < k1; ++k) {
          partial += decoded[A.codes[static_cast<std::size_t>(i * K + k)]] *
                     decoded[B.codes[static_cast<std::size_t>(j * K + k)]];
        }
        acc += partial * (A.scale(i, k0) * B.scale(j, k0));
      }
      C[i * N + j] = acc;
    }
  }
}

}  // namespace ght::kernels::cpu
