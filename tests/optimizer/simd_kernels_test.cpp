// The host's Highway loops (optimizer/detail/adamw_simd.cpp, tier/detail/triad_simd.cpp) on every
// target compiled in that this CPU runs (x86-64: AVX-512 where present, AVX2, SSE4, SSSE3 and the
// scalar fallback; aarch64: SVE2_128 or SVE_256 by vector length, SVE2, SVE, NEON, scalar), each against a plain
// scalar loop of the documented semantics, bit for bit: AdamW for fp32 and bf16 grads x fp32
// and bf16 state x every weight mode, the sum of squares, the accumulator and the triad, with
// lengths around the vector lengths (below one vector, not a multiple), misaligned starts and
// NaN, infinite and subnormal inputs. Built with -ffp-contract=off (tests/CMakeLists.txt) so the
// references round every multiply and add on their own, as the semantics say.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "optimizer/adamw_kernels.hpp"
#include "optimizer/detail/adamw_simd.hpp"
#include "tier/detail/triad_simd.hpp"

namespace ght::optimizer {
namespace {

using simd::Weight;

const std::size_t kLengths[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 129, 1000, 4099};
const std::size_t kOffsets[] = {0, 1, 3};

class SimdTargets : public ::testing::TestWithParam<std::int64_t> {
 protected:
  void SetUp() override {
    simd::force_target_for_test(GetParam());
    ASSERT_EQ(simd::active_target(), simd::target_name(GetParam()));
  }
  void TearDown() override { simd::force_target_for_test(0); }
};

// Random values of every magnitude, with a few NaN, infinities, zeros of both signs and
// subnormals sprinkled in at fixed places.
std::vector<float> values(std::size_t n, std::mt19937& rng, float scale, bool specials) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = nd(rng) * scale * (i % 3 == 0 ? 1e-3f : i % 3 == 1 ? 1.0f : 1e3f);
  }
  if (specials) {
    const float sp[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::infinity(), 0.0f, -0.0f,
                        std::numeric_limits<float>::denorm_min(), -1e-40f};
    for (std::size_t k = 0; k < 7; ++k) {
      if (37 * k + 11 < n) x[37 * k + 11] = sp[k];
    }
  }
  return x;
}

std::vector<std::uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<std::uint16_t> b(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) b[i] = float_to_bf16_bits(x[i]);
  return b;
}

// One AdamW problem: the arrays of n + offset elements (the kernel sees them from `offset`).
struct Problem {
  std::vector<float> master, m32, v32, g32;
  std::vector<std::uint16_t> m16, v16, g16, w;
};

Problem make_problem(std::size_t len, std::mt19937& rng) {
  Problem p;
  p.master = values(len, rng, 1.0f, false);
  p.m32 = values(len, rng, 1e-3f, false);
  p.v32 = values(len, rng, 1e-3f, false);
  for (float& v : p.v32) v = v * v;  // v >= 0
  p.g32 = values(len, rng, 1.0f, true);
  p.m16 = to_bf16(p.m32);
  p.v16 = to_bf16(p.v32);
  p.g16 = to_bf16(p.g32);
  p.w.assign(len, 0xABCD);
  return p;
}

float widen(float x) { return x; }
float widen(std::uint16_t b) { return bf16_bits_to_float(b); }

// The update of adamw_kernels.hpp, one element at a time.
template <typename G, typename S>
void reference(float* master, S* m, S* v, const G* g, std::uint16_t* w, std::size_t n, Weight wm,
               const StepScalars& k, std::uint64_t stream, std::uint64_t first) {
  for (std::size_t i = 0; i < n; ++i) {
    const float before = master[i];
    const float gi = widen(g[i]) * k.grad_scale;
    const float mi = k.beta1 * widen(m[i]) + k.one_minus_beta1 * gi;
    const float vi = k.beta2 * widen(v[i]) + k.one_minus_beta2 * (gi * gi);
    const float denom = std::sqrt(vi) * k.inv_sqrt_bc2 + k.eps;
    const float p = before * k.decay - k.step_size * (mi / denom);
    if constexpr (sizeof(S) == 2) {
      m[i] = float_to_bf16_bits(mi);
      v[i] = float_to_bf16_bits_sr(vi, round_bits(stream, first + i));
    } else {
      m[i] = mi;
      v[i] = vi;
    }
    master[i] = p;
    if (wm == Weight::plain) w[i] = float_to_bf16_bits(p);
    if (wm == Weight::predict) w[i] = float_to_bf16_bits(p + k.extrapolate * (p - before));
  }
}

template <typename T>
::testing::AssertionResult same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) {
      return ::testing::AssertionFailure() << "first difference at element " << i;
    }
  }
  return ::testing::AssertionSuccess();
}

template <typename G, typename S>
void check_adamw(Weight wm, bool predict_scalars) {
  AdamWHyper h;
  h.weight_extrapolation = predict_scalars ? 1.0 : 0.0;
  const StepScalars k = make_step_scalars(h, 1e-3, 3, true, 0.7);
  std::mt19937 rng(11);
  // Region indices near 2^32 (the rounding bits' 32-bit index wraps inside a vector) and above.
  const std::uint64_t firsts[] = {0, 0xFFFFFFF5ull, (1ull << 40) + 5};
  for (const std::size_t n : kLengths) {
    for (const std::size_t off : kOffsets) {
      for (const std::uint64_t first : firsts) {
        Problem a = make_problem(n + off, rng), b = a;
        auto ms = [](Problem& p) -> S* {
          if constexpr (sizeof(S) == 2) return p.m16.data();
          else return p.m32.data();
        };
        auto vs = [](Problem& p) -> S* {
          if constexpr (sizeof(S) == 2) return p.v16.data();
          else return p.v32.data();
        };
        auto gs = [](Problem& p) -> const G* {
          if constexpr (sizeof(G) == 2) return p.g16.data();
          else return p.g32.data();
        };
        const std::uint64_t stream = round_stream(0x1234567890ull, k.step);
        simd::AdamWRange r;
        r.master = a.master.data() + off;
        r.m = ms(a) + off;
        r.v = vs(a) + off;
        r.g = gs(a) + off;
        r.w = wm == Weight::none ? nullptr : a.w.data() + off;
        r.n = n;
        r.grad = sizeof(G) == 2 ? GradType::bf16 : GradType::fp32;
        r.bf16_state = sizeof(S) == 2;
        r.weight = wm;
        r.stream = stream;
        r.first = first;
        simd::adamw(r, k);
        reference<G, S>(b.master.data() + off, ms(b) + off, vs(b) + off, gs(b) + off, b.w.data() + off,
                        n, wm, k, stream, first);
        SCOPED_TRACE("n " + std::to_string(n) + ", offset " + std::to_string(off) + ", first " +
                     std::to_string(first));
        ASSERT_TRUE(same_bytes(a.master, b.master));
        ASSERT_TRUE(same_bytes(a.m32, b.m32));
        ASSERT_TRUE(same_bytes(a.v32, b.v32));
        ASSERT_TRUE(same_bytes(a.m16, b.m16));
        ASSERT_TRUE(same_bytes(a.v16, b.v16));
        ASSERT_TRUE(same_bytes(a.w, b.w));
      }
    }
  }
}

TEST_P(SimdTargets, AdamWFp32StateMatchesScalar) {
  for (const Weight wm : {Weight::none, Weight::plain, Weight::predict}) {
    SCOPED_TRACE("weight mode " + std::to_string(static_cast<int>(wm)));
    check_adamw<float, float>(wm, wm == Weight::predict);
    check_adamw<std::uint16_t, float>(wm, wm == Weight::predict);
  }
}

TEST_P(SimdTargets, AdamWBf16StateMatchesScalar) {
  for (const Weight wm : {Weight::none, Weight::plain, Weight::predict}) {
    SCOPED_TRACE("weight mode " + std::to_string(static_cast<int>(wm)));
    check_adamw<float, std::uint16_t>(wm, wm == Weight::predict);
    check_adamw<std::uint16_t, std::uint16_t>(wm, wm == Weight::predict);
  }
}

// The documented order: element i into partial i mod 8, the partials added pairwise.
template <typename G>
double sumsq_reference(const G* g, std::size_t n) {
  double s[8] = {};
  for (std::size_t i = 0; i < n; ++i) {
    const double x = widen(g[i]);
    s[i % 8] += x * x;
  }
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

TEST_P(SimdTargets, SumsqMatchesScalarOrder) {
  std::mt19937 rng(5);
  for (const std::size_t n : kLengths) {
    for (const std::size_t off : kOffsets) {
      const std::vector<float> f = values(n + off, rng, 1.0f, false);
      const std::vector<std::uint16_t> b = to_bf16(f);
      const double got32 = simd::sumsq(f.data() + off, GradType::fp32, n);
      const double got16 = simd::sumsq(b.data() + off, GradType::bf16, n);
      const double want32 = sumsq_reference(f.data() + off, n);
      const double want16 = sumsq_reference(b.data() + off, n);
      EXPECT_EQ(std::memcmp(&got32, &want32, sizeof got32), 0) << "fp32, n " << n << ", offset " << off;
      EXPECT_EQ(std::memcmp(&got16, &want16, sizeof got16), 0) << "bf16, n " << n << ", offset " << off;
    }
  }
  std::vector<float> bad = values(100, rng, 1.0f, false);
  bad[42] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(simd::sumsq(bad.data(), GradType::fp32, bad.size())));
  bad[42] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isinf(simd::sumsq(bad.data(), GradType::fp32, bad.size())));
  EXPECT_EQ(simd::sumsq(bad.data(), GradType::fp32, 0), 0.0);
}

TEST_P(SimdTargets, AccumulateMatchesScalar) {
  std::mt19937 rng(9);
  for (const std::size_t n : kLengths) {
    for (const std::size_t off : kOffsets) {
      for (const bool assign : {false, true}) {
        // NaN in the source only: with NaN on both sides, which payload an add returns is the
        // compiler's choice (it may swap the operands).
        const std::vector<float> d0 = values(n + off, rng, 1.0f, false);
        const std::vector<float> f = values(n + off, rng, 1.0f, true);
        const std::vector<std::uint16_t> b = to_bf16(values(n + off, rng, 1.0f, true));
        std::vector<float> got32 = d0, got16 = d0, want32 = d0, want16 = d0;
        simd::accumulate(got32.data() + off, f.data() + off, GradType::fp32, n, assign);
        simd::accumulate(got16.data() + off, b.data() + off, GradType::bf16, n, assign);
        for (std::size_t i = off; i < n + off; ++i) {
          want32[i] = assign ? f[i] : want32[i] + f[i];
          want16[i] = assign ? widen(b[i]) : want16[i] + widen(b[i]);
        }
        SCOPED_TRACE("n " + std::to_string(n) + ", offset " + std::to_string(off) +
                     (assign ? ", assign" : ", add"));
        EXPECT_TRUE(same_bytes(got32, want32));
        EXPECT_TRUE(same_bytes(got16, want16));
      }
    }
  }
}

// The triad on 64-byte aligned arrays (streaming stores on x86) and on misaligned ones.
TEST_P(SimdTargets, TriadMatchesScalar) {
  std::mt19937 rng(3);
  const std::size_t cap = 4099 + 16;
  auto alloc = [&] { return static_cast<float*>(std::aligned_alloc(64, (cap * sizeof(float) + 63) / 64 * 64)); };
  float *a = alloc(), *b = alloc(), *c = alloc();
  const float s = 3.3f;
  for (const std::size_t n : kLengths) {
    for (const std::size_t off : {std::size_t{0}, std::size_t{1}, std::size_t{16}}) {
      const std::vector<float> bv = values(n, rng, 1.0f, true), cv = values(n, rng, 1.0f, true);
      std::memcpy(b + off, bv.data(), n * sizeof(float));
      std::memcpy(c + off, cv.data(), n * sizeof(float));
      tier::detail::triad(a + off, b + off, c + off, s, n);
      std::vector<float> got(a + off, a + off + n), want(n);
      for (std::size_t i = 0; i < n; ++i) want[i] = bv[i] + s * cv[i];
      EXPECT_TRUE(same_bytes(got, want)) << "n " << n << ", offset " << off;
    }
  }
  std::free(a);
  std::free(b);
  std::free(c);
}

// The dispatch picks the best target listed (the first), and says which one ran.
TEST(SimdDispatch, PicksTheBestCompiledTarget) {
  const std::vector<std::int64_t> t = simd::targets();
  ASSERT_FALSE(t.empty());
  std::cout << "Highway targets compiled and supported here:";
  for (const std::int64_t x : t) std::cout << " " << simd::target_name(x);
  std::cout << "; running " << simd::active_target() << "\n";
  EXPECT_EQ(simd::active_target(), simd::target_name(t.front()));
}

INSTANTIATE_TEST_SUITE_P(Highway, SimdTargets, ::testing::ValuesIn(simd::targets()),
                         [](const ::testing::TestParamInfo<std::int64_t>& info) {
                           return simd::target_name(info.param);
                         });

}  // namespace
}  // namespace ght::optimizer
