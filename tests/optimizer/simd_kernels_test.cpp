// The host's Highway loops (optimizer/detail/adamw_simd.cpp, tier/detail/triad_simd.cpp) on every
// target compiled in that this CPU runs (x86-64: AVX-512 where present, AVX2, SSE4, SSSE3 and the
// scalar fallback; aarch64: SVE2_128 or SVE_256 by vector length, SVE2, SVE, NEON, scalar), each against a plain
// scalar loop of the documented semantics, bit for bit: AdamW for fp32 and bf16 grads x fp32,
// bf16 and q8 state x every weight mode, the q8 block quantizer, the sum of squares, the
// accumulator and the triad, with lengths around the vector lengths (below one vector, not a multiple), misaligned starts and
// NaN, infinite and subnormal inputs. Built with -ffp-contract=off (tests/CMakeLists.txt) so the
// references round every multiply and add on their own, as the semantics say.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
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

// ---- q8 state: the fused block loop and the block quantizer against scalar references ----------

// Every finite midpoint lies in (0, 1), and no bucket of the host index (the positive fp32
// values with the same top 16 bits) holds more than one: one comparison after the index lookup
// finds every code, which is what simd::Q8Index relies on.
TEST(Q8Index, OneComparisonAfterTheLookupFindsEveryCode) {
  const Q8Tables& t = q8_tables();
  for (const bool is_v : {false, true}) {
    const float* mid = is_v ? t.v_mid : t.m_mid;
    const unsigned finite = is_v ? 255 : 127;
    std::vector<unsigned> per_bucket(simd::kQ8IndexTop + 1, 0);
    for (unsigned c = 0; c < finite; ++c) {
      ASSERT_GT(mid[c], 0.0f);
      ASSERT_LT(mid[c], 1.0f);
      ++per_bucket[std::bit_cast<std::uint32_t>(mid[c]) >> 16];
    }
    unsigned most = 0;
    for (const unsigned n : per_bucket) most = std::max(most, n);
    EXPECT_EQ(most, 1u) << (is_v ? "v" : "m") << ": comparison steps needed after the lookup";
  }
}

// The block record of x[0, len) as the documented quantizer writes it: scale = absmax by
// a > s ? a : s, codes by the binary search (q8_code_m / q8_code_v), 0 after len.
void q8_store_reference(const float* x, std::size_t len, std::uint8_t* rec, bool is_v) {
  const Q8Tables& t = q8_tables();
  float s = 0;
  for (std::size_t i = 0; i < len; ++i) {
    const float a = x[i] < 0 ? -x[i] : x[i];
    s = a > s ? a : s;
  }
  const float r = s > 0 ? 1.0f / s : 0.0f;
  for (std::size_t i = 0; i < kQ8Block; ++i) {
    rec[i] = i >= len ? 0 : is_v ? q8_code_v(t, x[i] * r) : q8_code_m(t, x[i] * r);
  }
  std::memcpy(rec + kQ8Block, &s, sizeof s);
}

// Random block records: random codes and a scale per block from a list with the corner cases
// (zero, subnormal: 1 / scale overflows to +inf, +inf, NaN).
std::vector<std::uint8_t> q8_records(std::size_t n, std::mt19937& rng) {
  const std::size_t blocks = (n + kQ8Block - 1) / kQ8Block;
  std::vector<std::uint8_t> rec(blocks * kQ8Record);
  std::uniform_int_distribution<int> byte(0, 255);
  const float scales[] = {0.0f, std::numeric_limits<float>::denorm_min(), 1e-30f,
                          std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  std::lognormal_distribution<float> ln(-6.0f, 3.0f);
  for (std::size_t b = 0; b < blocks; ++b) {
    for (std::size_t i = 0; i < kQ8Block; ++i) rec[b * kQ8Record + i] = static_cast<std::uint8_t>(byte(rng));
    const float s = b % 4 == 3 ? scales[(b / 4) % 5] : ln(rng);
    std::memcpy(rec.data() + b * kQ8Record + kQ8Block, &s, sizeof s);
  }
  return rec;
}

template <typename G>
void check_adamw_q8(Weight wm, bool predict_scalars) {
  AdamWHyper h;
  h.weight_extrapolation = predict_scalars ? 1.0 : 0.0;
  const StepScalars k = make_step_scalars(h, 1e-3, 3, true, 0.7);
  const Q8Tables& t = q8_tables();
  std::mt19937 rng(17);
  for (const std::size_t n : {1, 7, 8, 9, 17, 255, 256, 257, 511, 4 * 256, 20 * 256 + 100}) {
    const std::size_t blocks = (n + kQ8Block - 1) / kQ8Block;
    Problem a = make_problem(n, rng);
    std::vector<std::uint8_t> mr = q8_records(n, rng), vr = q8_records(n, rng);
    if (n > 300) {  // block 1: zero gradients and zero scales, so all of its new m and v are 0
      std::fill(a.g32.begin() + 256, a.g32.begin() + 512, 0.0f);
      a.g16 = to_bf16(a.g32);
      std::memset(mr.data() + kQ8Record + kQ8Block, 0, 4);
      std::memset(vr.data() + kQ8Record + kQ8Block, 0, 4);
    }
    Problem b = a;
    std::vector<std::uint8_t> mr_want = mr, vr_want = vr;
    simd::Q8Range r;
    r.master = a.master.data();
    r.m = mr.data();
    r.v = vr.data();
    r.g = sizeof(G) == 2 ? static_cast<const void*>(a.g16.data()) : a.g32.data();
    r.w = wm == Weight::none ? nullptr : a.w.data();
    r.n = n;
    r.grad = sizeof(G) == 2 ? GradType::bf16 : GradType::fp32;
    r.weight = wm;
    simd::adamw_q8(r, k);
    // The reference: dequantize, the fp32-state scalar update, the reference quantizer.
    for (std::size_t blk = 0; blk < blocks; ++blk) {
      const std::size_t e = blk * kQ8Block, len = std::min(kQ8Block, n - e);
      std::uint8_t* mrec = mr_want.data() + blk * kQ8Record;
      std::uint8_t* vrec = vr_want.data() + blk * kQ8Record;
      float sm, sv;
      std::memcpy(&sm, mrec + kQ8Block, 4);
      std::memcpy(&sv, vrec + kQ8Block, 4);
      std::vector<float> mo(len), vo(len);
      for (std::size_t i = 0; i < len; ++i) {
        mo[i] = t.m[mrec[i]] * sm;
        vo[i] = t.v[vrec[i]] * sv;
      }
      const G* g = nullptr;
      if constexpr (sizeof(G) == 2) g = b.g16.data() + e;
      else g = b.g32.data() + e;
      reference<G, float>(b.master.data() + e, mo.data(), vo.data(), g, b.w.data() + e, len, wm, k, 0, 0);
      q8_store_reference(mo.data(), len, mrec, false);
      q8_store_reference(vo.data(), len, vrec, true);
    }
    SCOPED_TRACE("n " + std::to_string(n));
    ASSERT_TRUE(same_bytes(a.master, b.master));
    ASSERT_TRUE(same_bytes(a.w, b.w));
    ASSERT_TRUE(same_bytes(mr, mr_want));
    ASSERT_TRUE(same_bytes(vr, vr_want));
  }
}

TEST_P(SimdTargets, AdamWQ8StateMatchesScalar) {
  for (const Weight wm : {Weight::none, Weight::plain, Weight::predict}) {
    SCOPED_TRACE("weight mode " + std::to_string(static_cast<int>(wm)));
    check_adamw_q8<float>(wm, wm == Weight::predict);
    check_adamw_q8<std::uint16_t>(wm, wm == Weight::predict);
  }
}

// The quantizer on blocks of every kind: random magnitudes of both signs with NaN, ±inf, ±0 and
// subnormals; all zero; all NaN; one infinity; values around the midpoints of the maps (their
// neighbours scaled by a block absmax of 1); a subnormal absmax (1 / absmax is +inf).
TEST_P(SimdTargets, Q8StoreBlockMatchesScalar) {
  const Q8Tables& t = q8_tables();
  std::mt19937 rng(23);
  std::vector<std::vector<float>> blocks;
  for (const std::size_t len : {1, 3, 8, 9, 100, 255, 256}) {
    blocks.push_back(values(len, rng, 1.0f, true));
    blocks.push_back(std::vector<float>(len, 0.0f));
    blocks.push_back(std::vector<float>(len, std::numeric_limits<float>::quiet_NaN()));
    std::vector<float> x = values(len, rng, 1e-3f, false);
    x[len / 2] = -std::numeric_limits<float>::infinity();
    blocks.push_back(x);
    for (float& y : x) y = std::numeric_limits<float>::denorm_min() * static_cast<float>(rng() % 5);
    blocks.push_back(x);
  }
  for (const float* mid : {t.m_mid, t.v_mid}) {
    const int count = mid == t.m_mid ? 127 : 255;
    std::vector<float> x{1.0f};
    for (int c = 0; c < count; ++c) {
      x.insert(x.end(), {mid[c], std::nextafter(mid[c], 0.0f), std::nextafter(mid[c], 2.0f), -mid[c]});
    }
    for (std::size_t e = 0; e < x.size(); e += kQ8Block - 1) {
      std::vector<float> blk(x.begin() + static_cast<std::ptrdiff_t>(e),
                             x.begin() + static_cast<std::ptrdiff_t>(std::min(x.size(), e + kQ8Block - 1)));
      blk.push_back(1.0f);  // absmax 1: q is the value itself
      blocks.push_back(blk);
    }
  }
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    for (const bool is_v : {false, true}) {
      std::vector<std::uint8_t> got(kQ8Record, 0xEE), want(kQ8Record, 0x11);
      simd::q8_store_block(blocks[i].data(), blocks[i].size(), got.data(), is_v);
      q8_store_reference(blocks[i].data(), blocks[i].size(), want.data(), is_v);
      EXPECT_TRUE(same_bytes(got, want)) << "block " << i << (is_v ? ", v" : ", m");
    }
  }
}

// Every code of both maps through the vector dequantization (the closed form, q8_decades.hpp)
// gives its map entry times the scale, bit for bit: the codes in order and shuffled, whole blocks
// and partial ones, scales of every kind (NaN and infinite included).
TEST_P(SimdTargets, Q8LoadBlockGivesEveryCodesMapEntryTimesTheScale) {
  const Q8Tables& t = q8_tables();
  std::mt19937 rng(29);
  std::vector<std::uint8_t> order(kQ8Block);
  for (std::size_t c = 0; c < kQ8Block; ++c) order[c] = static_cast<std::uint8_t>(c);
  std::vector<std::uint8_t> shuffled = order;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  const float scales[] = {1.0f, 0.75f, 3.1e-5f, 1e30f, std::numeric_limits<float>::denorm_min(), 0.0f,
                          std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()};
  for (const auto* codes : {&order, &shuffled}) {
    for (const float s : scales) {
      std::vector<std::uint8_t> rec(codes->begin(), codes->end());
      rec.resize(kQ8Record);
      std::memcpy(rec.data() + kQ8Block, &s, sizeof s);
      for (const std::size_t len : {std::size_t{256}, std::size_t{255}, std::size_t{13}, std::size_t{1}}) {
        for (const bool is_v : {false, true}) {
          std::vector<float> got(len + 1, 7.0f);
          simd::q8_load_block(rec.data(), len, got.data(), is_v);
          const float* map = is_v ? t.v : t.m;
          for (std::size_t i = 0; i < len; ++i) {
            const float want = map[rec[i]] * s;
            ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(want))
                << (is_v ? "v" : "m") << " code " << int{rec[i]} << " scale " << s << ": " << got[i] << " vs " << want;
          }
          EXPECT_EQ(got[len], 7.0f) << "wrote past len";
        }
      }
    }
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
