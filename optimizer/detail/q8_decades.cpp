// The q8 maps' closed form (q8_decades.hpp): the per-decade split reciprocals and the scalar
// value of one code. Compiled with -ffp-contract=off (optimizer/CMakeLists.txt): the closed form
// rounds N · lo and the sum on their own, as the vector lanes do.
#include "optimizer/detail/q8_decades.hpp"

#include <bit>
#include <cmath>
#include <string>

#include "optimizer/adamw_kernels.hpp"
#include "tier/error.hpp"

namespace ght::optimizer::simd {
namespace {

// 1 / D of decade F (maps with `top` = 7 for v, 6 for m's magnitudes) split into hi (12
// significant bits, so N · hi is exact for N < 2^11) and lo = RN32(1 / D - hi).
void fill_decades(float* hi, float* lo, unsigned top) {
  for (unsigned f_bits = 0; f_bits <= top; ++f_bits) {
    double d = 10.0 * std::ldexp(1.0, static_cast<int>(f_bits));
    for (unsigned z = top - f_bits; z > 0; --z) d *= 10;  // exact: 2^8 · 5^8 < 2^53
    const double r = 1.0 / d;
    int e = 0;
    const double frac = std::frexp(r, &e);
    const double h = std::ldexp(std::nearbyint(std::ldexp(frac, 12)), e - 12);
    const unsigned slot = (127 + f_bits) & 7;
    hi[slot] = static_cast<float>(h);  // exact: 12 bits
    lo[slot] = static_cast<float>(r - h);
  }
}

Q8Decades make_q8_decades() {
  Q8Decades d{};
  fill_decades(d.m_hi, d.m_lo, 6);
  fill_decades(d.v_hi, d.v_lo, 7);
  const Q8Tables& t = q8_tables();
  for (unsigned c = 0; c < 256; ++c) {
    const auto code = static_cast<std::uint8_t>(c);
    GHT_EXPECTS(std::bit_cast<std::uint32_t>(q8_closed_value(d, code, false)) ==
                    std::bit_cast<std::uint32_t>(t.m[c]),
                "q8 closed form: m code " + std::to_string(c) + " differs from its map entry");
    GHT_EXPECTS(std::bit_cast<std::uint32_t>(q8_closed_value(d, code, true)) ==
                    std::bit_cast<std::uint32_t>(t.v[c]),
                "q8 closed form: v code " + std::to_string(c) + " differs from its map entry");
  }
  return d;
}

}  // namespace

const Q8Decades& q8_decades() {
  static const Q8Decades d = make_q8_decades();
  return d;
}

float q8_closed_value(const Q8Decades& d, std::uint8_t code, bool is_v) noexcept {
  const unsigned c = is_v ? code : code & 0x7Fu;
  float value = is_v ? kQ8VZero : 0.0f;
  if (c != 0) {
    const auto cf = static_cast<float>(c);
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(cf);
    const float pow2 = std::bit_cast<float>(bits & 0xFF800000u);  // 2^F
    const float n = (cf * 9.0f + 9.0f) - pow2 * 8.0f;               // N, exact
    const unsigned slot = (bits >> 23) & 7u;
    const float* hi = is_v ? d.v_hi : d.m_hi;
    const float* lo = is_v ? d.v_lo : d.m_lo;
    value = n * hi[slot] + n * lo[slot];
  }
  if (!is_v && (code & 0x80u)) value = -value;  // code 0x80 gives -0, as the map
  return value;
}

}  // namespace ght::optimizer::simd
