#pragma once
// Shared by the q8-state optimizer tests (host and GPU): random inputs for one AdamW span with
// blockwise 8-bit m and v (block records, optimizer/adamw_kernels.hpp).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "optimizer/adamw_kernels.hpp"

namespace ght::optimizer::test {

/// Inputs of one span: fp32 master, q8 m and v records, gradients of either type (raw bytes).
struct Q8StateInputs {
  std::vector<float> p;
  std::vector<std::uint8_t> m, v;  ///< state_bytes(q8, n) each
  std::vector<unsigned char> g;    ///< n elements of grad_type
  GradType grad_type = GradType::bf16;
  std::size_t n = 0;
};

/// Magnitudes of m, v and the gradients vary over four decades within every block, so the
/// codes cover most of each map.
inline Q8StateInputs random_q8_state(std::size_t n, GradType t, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> decades(-4.0f, 0.0f);
  Q8StateInputs in;
  in.n = n;
  in.grad_type = t;
  in.p.resize(n);
  std::vector<float> m(n), v(n);
  in.g.resize(n * grad_type_size(t));
  for (std::size_t i = 0; i < n; ++i) {
    const float scale = std::pow(10.0f, decades(rng));
    in.p[i] = nd(rng);
    m[i] = 0.1f * scale * nd(rng);
    v[i] = 0.01f * scale * scale * std::abs(nd(rng));
    const float g = nd(rng) * scale;
    if (t == GradType::bf16) {
      const std::uint16_t b = float_to_bf16_bits(g);
      std::memcpy(in.g.data() + 2 * i, &b, 2);
    } else {
      std::memcpy(in.g.data() + 4 * i, &g, 4);
    }
  }
  in.m.resize(state_bytes(StateType::q8, n));
  in.v.resize(state_bytes(StateType::q8, n));
  q8_quantize(m.data(), n, in.m.data(), false);
  q8_quantize(v.data(), n, in.v.data(), true);
  return in;
}

inline AdamWSpan q8_span(Q8StateInputs& in, bf16* w) {
  AdamWSpan s{in.p.data(), in.m.data(), in.v.data(), in.g.data(), in.grad_type, w, in.n};
  s.state = StateType::q8;
  return s;
}

}  // namespace ght::optimizer::test
