#pragma once
/**
 * @file vector_compare.hpp
 * @brief Error measures of a computed vector against its reference, in double:
 *   rel_l2 = ||g - r||_2 / ||r||_2      cosine = <g, r> / (||g||·||r||)
 */
#include <algorithm>
#include <cmath>
#include <span>

namespace ght::test {

struct VectorError {
  double rel_l2 = 0, cosine = 0;
};

inline VectorError compare_vectors(std::span<const float> got, std::span<const float> ref) {
  double dd = 0, rr = 0, gg = 0, gr = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double g = got[i], r = ref[i];
    dd += (g - r) * (g - r);
    rr += r * r;
    gg += g * g;
    gr += g * r;
  }
  VectorError e;
  e.rel_l2 = std::sqrt(dd) / std::max(std::sqrt(rr), 1e-30);
  e.cosine = gr / std::max(std::sqrt(gg * rr), 1e-30);
  return e;
}

}  // namespace ght::test
