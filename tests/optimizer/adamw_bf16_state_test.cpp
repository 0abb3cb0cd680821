// bf16 m and v (GHT_OPT_STATE=bf16) on the host: the rounding helpers, adamw_cpu against an fp64
// reference that rounds every operation to fp32 and the moments to bf16 as specified (bit
// equality), determinism across thread counts and chunkings, why v rounds stochastically, and
// the AdamW plumbing: allocation sizes, dma slot sizes, load/save conversions, the parse error.
// The GPU kernel and paths against these: adamw_bf16_state_gpu_test.cu.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string_view>
#include <vector>

#include "common/expect.hpp"
#include "optimizer/adamw.hpp"
#include "optimizer/adamw_harness.hpp"
#include "optimizer/adamw_kernels.hpp"
#include "optimizer/bf16_state_util.hpp"
#include "tier/error.hpp"

namespace ght::optimizer {
namespace {

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- the reference, written from the definitions -------------------------------------------

// bf16 of a finite x from the distance to its two bf16 neighbours, in double: nearest (ties to
// the even neighbour) when r16 is unset, else away from zero when r16 / 2^16 >= 1 - fraction.
std::uint16_t ref_bf16(float x, std::optional<std::uint32_t> r16) {
  const auto lo = static_cast<std::uint16_t>(bits_of(x) >> 16);  // toward zero
  const double a = std::abs(static_cast<double>(bf16_bits_to_float(lo)));
  const double b = std::abs(static_cast<double>(bf16_bits_to_float(static_cast<std::uint16_t>(lo + 1))));
  const double frac = (std::abs(static_cast<double>(x)) - a) / (b - a);
  bool up;
  if (r16) {
    up = *r16 / 65536.0 >= 1.0 - frac;
  } else {
    up = frac > 0.5 || (frac == 0.5 && (lo & 1u) != 0);
  }
  return static_cast<std::uint16_t>(up ? lo + 1 : lo);
}

// One fp32 operation: exact in double, rounded to fp32 once (double rounding is innocuous for
// +, -, *, / and sqrt of fp32 operands).
float f32(double x) { return static_cast<float>(x); }

// The documented bf16-state update of one element, every fp32 operation rounded on its own.
void ref_elem(float& p, std::uint16_t& m, std::uint16_t& v, float grad, std::uint16_t* w,
              const StepScalars& k, std::uint64_t stream, std::uint64_t index) {
  const double g = f32(static_cast<double>(grad) * k.grad_scale);
  const double mi = f32(f32(static_cast<double>(k.beta1) * bf16_bits_to_float(m)) +
                        static_cast<double>(f32(static_cast<double>(k.one_minus_beta1) * g)));
  const double vi = f32(f32(static_cast<double>(k.beta2) * bf16_bits_to_float(v)) +
                        static_cast<double>(f32(static_cast<double>(k.one_minus_beta2) * f32(g * g))));
  const double denom = f32(f32(static_cast<double>(f32(std::sqrt(vi))) * k.inv_sqrt_bc2) + static_cast<double>(k.eps));
  p = f32(f32(static_cast<double>(p) * k.decay) - static_cast<double>(f32(k.step_size * f32(mi / denom))));
  m = ref_bf16(static_cast<float>(mi), std::nullopt);
  v = ref_bf16(static_cast<float>(vi), round_bits(stream, index));
  if (w != nullptr) *w = ref_bf16(p, std::nullopt);
}

float grad_at(const test::Bf16StateInputs& in, std::size_t i) {
  if (in.grad_type == GradType::fp32) {
    float g;
    std::memcpy(&g, in.g.data() + 4 * i, 4);
    return g;
  }
  std::uint16_t b;
  std::memcpy(&b, in.g.data() + 2 * i, 2);
  return bf16_bits_to_float(b);
}

AdamWSpan span_of(test::Bf16StateInputs& in, std::vector<bf16>* w, std::uint64_t key, std::uint64_t first) {
  AdamWSpan s{in.p.data(), in.m.data(), in.v.data(), in.g.data(), in.grad_type,
              w != nullptr ? w->data() : nullptr, in.n};
  s.state = StateType::bf16;
  s.key = key;
  s.first = first;
  return s;
}

// ---- rounding helpers ------------------------------------------------------------------------

TEST(Bf16StateRounding, StochasticRoundsUpForExactlyTheDroppedFractionOfRandomValues) {
  for (const float x : {1.0f + 3 * 0x1p-16f, -2.5f - 0x1p-12f, 3.0e-39f, 1e-3f, 65504.123f}) {
    const std::uint32_t dropped = bits_of(x) & 0xFFFFu;
    std::uint32_t up = 0;
    for (std::uint32_t r = 0; r < 65536; ++r) {
      const std::uint16_t b = float_to_bf16_bits_sr(x, r);
      ASSERT_TRUE(b == bits_of(x) >> 16 || b == (bits_of(x) >> 16) + 1) << x << " r " << r;
      up += b != bits_of(x) >> 16;
      ASSERT_EQ(b, ref_bf16(x, r)) << x << " r " << r;
    }
    EXPECT_EQ(up, dropped) << "x = " << x << ": P(up) must be the dropped fraction, so E[bf16] = x";
  }
  EXPECT_EQ(float_to_bf16_bits_sr(std::numeric_limits<float>::quiet_NaN(), 0xFFFF), 0x7FFF);
  EXPECT_EQ(float_to_bf16_bits_sr(std::numeric_limits<float>::infinity(), 0xFFFF), 0x7F80);
  EXPECT_EQ(float_to_bf16_bits_sr(-std::numeric_limits<float>::infinity(), 0xFFFF), 0xFF80);
  EXPECT_EQ(float_to_bf16_bits_sr(2.0f, 0xFFFF), 0x4000) << "representable values never move";
}

TEST(Bf16StateRounding, TheStreamIsPinnedAndDependsOnKeyStepAndIndex) {
  // Pinned, from the definitions computed independently (a changed hash would change every
  // bf16-state run): mix64 is splitmix64's output function (seed 0: first output
  // 0xE220A8397B1DCDAF); round_bits is lowbias32 of the stream's low word + index * 0x9E3779B9.
  EXPECT_EQ(mix64(0x9E3779B97F4A7C15ull), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(round_bits(0x0123456789ABCDEFull, 5), 0x72DEu);
  const std::uint64_t s = round_stream(round_key("layer0.attn"), 7);
  EXPECT_NE(s, round_stream(round_key("layer0.attn"), 8));
  EXPECT_NE(s, round_stream(round_key("layer1.attn"), 7));
  EXPECT_EQ(round_key("layer0.attn"), round_key(std::string_view("layer0.attn.weight", 11)));
  std::vector<int> hist(16, 0);
  for (std::uint64_t i = 0; i < 16000; ++i) hist[round_bits(s, i) >> 12] += 1;
  for (int h : hist) EXPECT_NEAR(h, 1000, 150) << "16 bins of 16000 draws";
}

// ---- the host kernel ---------------------------------------------------------------------------

TEST(Bf16StateCpu, MatchesTheFp64ReferenceBitForBit) {
  for (const GradType t : {GradType::bf16, GradType::fp32}) {
    const std::size_t n = 70001;  // a vector body and a tail per thread
    test::Bf16StateInputs in = test::random_bf16_state(n, t, 5);
    test::Bf16StateInputs ref = in;
    std::vector<bf16> w(n);
    std::vector<std::uint16_t> rw(n);
    const std::uint64_t key = round_key("experts.3"), first = 123457;
    for (std::int64_t step = 1; step <= 3; ++step) {
      const StepScalars k = make_step_scalars(AdamWHyper{}, 1e-2, step, step != 2, step == 3 ? 0.4 : 1.0);
      adamw_cpu(span_of(in, &w, key, first), k, 2);
      const std::uint64_t stream = round_stream(key, k.step);
      for (std::size_t i = 0; i < n; ++i) {
        ref_elem(ref.p[i], ref.m[i], ref.v[i], grad_at(ref, i), &rw[i], k, stream, first + i);
      }
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const bool ok = bits_of(in.p[i]) == bits_of(ref.p[i]) && in.m[i] == ref.m[i] && in.v[i] == ref.v[i] &&
                        w[i].bits == rw[i];
        if (!ok && bad++ < 5) {
          ADD_FAILURE() << "step " << step << " grad " << (t == GradType::bf16 ? "bf16" : "fp32") << " [" << i
                        << "] p " << in.p[i] << "/" << ref.p[i] << " m " << in.m[i] << "/" << ref.m[i] << " v "
                        << in.v[i] << "/" << ref.v[i] << " w " << w[i].bits << "/" << rw[i];
        }
      }
      ASSERT_EQ(bad, 0u) << "elements differing from the reference at step " << step;
    }
    EXPECT_NE(in.m, test::random_bf16_state(n, t, 5).m) << "the state must have changed";
  }
}

TEST(Bf16StateCpu, SameBytesForAnyThreadCountAndChunking) {
  const std::size_t n = 300001;
  const test::Bf16StateInputs start = test::random_bf16_state(n, GradType::bf16, 8);
  const StepScalars k = make_step_scalars(AdamWHyper{}, 3e-3, 11, true, 1.0);
  const std::uint64_t key = round_key("embed");
  test::Bf16StateInputs one = start;
  std::vector<bf16> w1(n);
  adamw_cpu(span_of(one, &w1, key, 0), k, 1);
  for (const int threads : {2, 3, 4, 7}) {
    test::Bf16StateInputs many = start;
    std::vector<bf16> w(n);
    adamw_cpu(span_of(many, &w, key, 0), k, threads);
    EXPECT_EQ(many.p, one.p) << threads << " threads";
    EXPECT_EQ(many.m, one.m) << threads << " threads";
    EXPECT_EQ(many.v, one.v) << threads << " threads";
    EXPECT_EQ(0, std::memcmp(w.data(), w1.data(), n * 2)) << threads << " threads";
  }
  // Two chunks, the second starting at element `cut` of the region: the same as one span.
  const std::size_t cut = 100003;
  test::Bf16StateInputs parts = start;
  std::vector<bf16> wp(n);
  AdamWSpan a = span_of(parts, &wp, key, 0);
  a.n = cut;
  AdamWSpan b = span_of(parts, &wp, key, cut);
  b.master += cut;
  b.m = parts.m.data() + cut;
  b.v = parts.v.data() + cut;
  b.grad = parts.g.data() + 2 * cut;
  b.weight += cut;
  b.n = n - cut;
  adamw_cpu(a, k, 2);
  adamw_cpu(b, k, 3);
  EXPECT_EQ(parts.p, one.p);
  EXPECT_EQ(parts.m, one.m);
  EXPECT_EQ(parts.v, one.v);
}

TEST(Bf16StateCpu, StochasticVTracksTheExactAverageWhereNearestWouldStall) {
  // Constant gradients and beta2 = 0.999: v_t = (1 - beta2^t) g^2. Its per-step change (0.1%)
  // is below bf16's spacing (0.4-0.8%): nearest rounding stalls v near a third of g^2, the
  // stochastic v stays unbiased.
  const std::size_t n = 4096;
  AdamWHyper h;
  h.beta2 = 0.999;
  test::Bf16StateInputs in = test::random_bf16_state(n, GradType::fp32, 3);
  std::fill(in.m.begin(), in.m.end(), std::uint16_t{0});
  std::fill(in.v.begin(), in.v.end(), std::uint16_t{0});
  std::vector<float> g(n), v_nearest(n, 0.0f);
  for (std::size_t i = 0; i < n; ++i) g[i] = 1e-3f * static_cast<float>(1 + i % 7);
  std::memcpy(in.g.data(), g.data(), 4 * n);
  const int steps = 2000;
  for (int t = 1; t <= steps; ++t) {
    const StepScalars k = make_step_scalars(h, 1e-4, t, false, 1.0);
    adamw_cpu(span_of(in, nullptr, round_key("w"), 0), k, 1);
    for (std::size_t i = 0; i < n; ++i) {
      v_nearest[i] = bf16_bits_to_float(float_to_bf16_bits(k.beta2 * v_nearest[i] + k.one_minus_beta2 * (g[i] * g[i])));
    }
  }
  double sr = 0, rne = 0;
  const double bc2 = 1 - std::pow(h.beta2, steps);
  for (std::size_t i = 0; i < n; ++i) {
    const double exact = bc2 * static_cast<double>(g[i]) * g[i];
    sr += bf16_bits_to_float(in.v[i]) / exact;
    rne += v_nearest[i] / exact;
  }
  EXPECT_NEAR(sr / n, 1.0, 5e-3) << "mean of v / exact v with stochastic rounding";
  EXPECT_LT(rne / n, 0.6) << "nearest rounding was expected to stall (else this test shows nothing)";
}

// ---- AdamW plumbing ----------------------------------------------------------------------------

AdamWOptions cpu_bf16(int threads = 0) {
  AdamWOptions o;
  o.path = PathChoice::cpu;
  o.cpu_threads = threads;
  o.state_type = StateType::bf16;
  return o;
}

TEST(Bf16StateAdamW, StateBytesFollowTheStateType) {
  const std::size_t sizes[] = {4096, 8192};
  std::uint64_t m_bytes[2] = {}, v_bytes[2] = {}, master_bytes[2] = {};
  for (const StateType st : {StateType::fp32, StateType::bf16}) {
    auto a = test::host_state();
    AdamWOptions o = cpu_bf16();
    o.state_type = st;
    std::vector<Region> rs;
    for (const char* name : {"r0", "r1"}) rs.push_back({name, sizes[rs.size()], true, nullptr, nullptr, GradType::bf16});
    AdamW opt(rs, o, a);
    EXPECT_EQ(opt.state_type(), st);
    const int k = static_cast<int>(st);
    m_bytes[k] = a->tier_class_usage(TierKind::host, TensorClass::adam_m).current;
    v_bytes[k] = a->tier_class_usage(TierKind::host, TensorClass::adam_v).current;
    master_bytes[k] = a->tier_class_usage(TierKind::host, TensorClass::master).current;
  }
  const std::uint64_t params = sizes[0] + sizes[1];
  EXPECT_EQ(m_bytes[0], 4 * params);
  EXPECT_EQ(v_bytes[0], 4 * params);
  EXPECT_EQ(m_bytes[1], state_bytes(StateType::bf16, params));
  EXPECT_EQ(v_bytes[1], 2 * params);
  EXPECT_EQ(master_bytes[1], master_bytes[0]) << "master stays fp32";
  // dma slots: master 4 + m 2 + v 2 bytes per parameter instead of 12.
  EXPECT_EQ(3 * dma_slot_bytes(1 << 20, StateType::bf16), 2 * dma_slot_bytes(1 << 20, StateType::fp32));
}

TEST(Bf16StateAdamW, CpuPathIsTheKernelWithTheRegionsKeyAndStep) {
  test::Mem host;
  auto run = [&](int threads) {
    return test::run_bf16_state(cpu_bf16(threads), host, host, test::host_state(), {5000, 70001}, 4, 100.0f);
  };
  const test::RunBytes a = run(1), b = run(3);
  EXPECT_TRUE(test::same_bytes(a, b)) << "thread count";

  // Step by step against adamw_cpu on raw spans with the region's key and the step count.
  const std::size_t n = 9000;
  std::vector<std::uint16_t> g(n);
  Region d{"layer2.attn", n, true, nullptr, g.data(), GradType::bf16};
  AdamW opt({d}, cpu_bf16(), test::host_state());
  test::Bf16StateInputs ref = test::random_bf16_state(n, GradType::bf16, 1);
  opt.load_state(0, ref.p.data(), nullptr, nullptr);
  std::fill(ref.m.begin(), ref.m.end(), std::uint16_t{0});
  std::fill(ref.v.begin(), ref.v.end(), std::uint16_t{0});
  test::three_steps_second_clipped(opt, g, ref.g.data(), [&](const StepScalars& k) {
    adamw_cpu(span_of(ref, nullptr, round_key("layer2.attn"), 0), k, 1);
  });
  std::vector<float> p(n), m(n), v(n);
  opt.save_state(0, p.data(), m.data(), v.data());
  EXPECT_EQ(p, ref.p);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(bits_of(m[i]), static_cast<std::uint32_t>(ref.m[i]) << 16) << i;
    ASSERT_EQ(bits_of(v[i]), static_cast<std::uint32_t>(ref.v[i]) << 16) << i;
  }
}

TEST(Bf16StateAdamW, LoadAndSaveConvertBetweenTypes) {
  const std::size_t n = 3001;
  std::vector<std::uint16_t> g(n, 0);
  const Region d{"r", n, true, nullptr, g.data(), GradType::bf16};
  std::mt19937 rng(6);
  std::normal_distribution<float> nd;
  std::vector<float> p(n), m(n), v(n);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = nd(rng);
    m[i] = 0.1f * nd(rng);
    v[i] = 0.01f * std::abs(nd(rng));
  }
  AdamWOptions fp32 = cpu_bf16();
  fp32.state_type = StateType::fp32;

  // fp32 -> bf16: m and v rounded to nearest even, master untouched.
  AdamW low({d}, cpu_bf16(), test::host_state());
  low.load_state(0, p.data(), m.data(), v.data());
  std::vector<float> p1(n), m1(n), v1(n);
  low.save_state(0, p1.data(), m1.data(), v1.data());
  EXPECT_EQ(p1, p);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(bits_of(m1[i]), static_cast<std::uint32_t>(float_to_bf16_bits(m[i])) << 16) << i;
    ASSERT_EQ(bits_of(v1[i]), static_cast<std::uint32_t>(float_to_bf16_bits(v[i])) << 16) << i;
  }
  // bf16 -> bf16: what save_state gave loads back to the same bytes.
  AdamW again({d}, cpu_bf16(), test::host_state());
  again.load_state(0, p1.data(), m1.data(), v1.data());
  EXPECT_EQ(0, std::memcmp(again.state(0, TensorClass::adam_m).host, low.state(0, TensorClass::adam_m).host, 2 * n));
  EXPECT_EQ(0, std::memcmp(again.state(0, TensorClass::adam_v).host, low.state(0, TensorClass::adam_v).host, 2 * n));
  // bf16 -> fp32: widened exactly.
  AdamW high({d}, fp32, test::host_state());
  high.load_state(0, p1.data(), m1.data(), v1.data());
  std::vector<float> p2(n), m2(n), v2(n);
  high.save_state(0, p2.data(), m2.data(), v2.data());
  EXPECT_EQ(p2, p1);
  EXPECT_EQ(m2, m1);
  EXPECT_EQ(v2, v1);
}

TEST(Bf16StateAdamW, ParseNamesTheVariableAndTheText) {
  EXPECT_EQ(parse_state_type("BF16"), StateType::bf16);
  EXPECT_EQ(parse_state_type("fp32"), StateType::fp32);
  const std::string msg = ght::test::error_of<ght::config_error>([] { (void)parse_state_type("fp16"); });
  EXPECT_CONTAINS(msg, "GHT_OPT_STATE");
  EXPECT_CONTAINS(msg, "fp16");
  EXPECT_CONTAINS(msg, "fp32|bf16");
}

}  // namespace
}  // namespace ght::optimizer
