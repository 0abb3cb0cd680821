// The host's AdamW, sum of squares and accumulator loops, once for every Highway target
// (adamw_simd.hpp). Compiled with -ffp-contract=off (optimizer/CMakeLists.txt): GCC would
// otherwise fuse a vector multiply and add into an FMA, which rounds once instead of twice.
// foreach_target.h compiles this file once per target, each copy in its own namespace.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "optimizer/detail/adamw_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <cstring>

#include "optimizer/detail/adamw_simd.hpp"

HWY_BEFORE_NAMESPACE();
namespace ght::optimizer::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using DI = hn::RebindToSigned<DF>;
using DH = hn::Rebind<std::uint16_t, DF>;  // bf16 bits, as many lanes as DF
using VF = hn::Vec<DF>;
using VU = hn::Vec<DU>;

// The most fp32 lanes of any vector of this target (a tail's padded copies hold one vector).
constexpr std::size_t kMaxLanes = HWY_MAX_BYTES / sizeof(float);

HWY_INLINE VF load_f32(DF df, const float* p) { return hn::LoadU(df, p); }
HWY_INLINE VF load_f32(DF df, const std::uint16_t* p) {
  const DU du;
  const DH dh;
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(dh, p))));
}

// bf16 bits (each lane < 2^16) to memory: the i32 -> u16 demotion saturates nothing here.
HWY_INLINE void store_bits(VU bits, std::uint16_t* p) {
  const DI di;
  const DH dh;
  hn::StoreU(hn::DemoteTo(dh, hn::BitCast(di, bits)), dh, p);
}

// NaN lanes (magnitude above +inf's bits) become 0x7FFF, as float_to_bf16_bits(_sr) do.
HWY_INLINE VU nan_to_canonical(VU x, VU rounded) {
  const DU du;
  const DI di;
  const auto mag = hn::BitCast(di, hn::And(x, hn::Set(du, 0x7FFFFFFFu)));
  const auto nan = hn::RebindMask(du, hn::Gt(mag, hn::Set(di, 0x7F800000)));
  return hn::IfThenElse(nan, hn::Set(du, 0x7FFFu), rounded);
}

// float_to_bf16_bits: round to nearest, ties to even.
HWY_INLINE VU round_nearest(VF f) {
  const DU du;
  const VU x = hn::BitCast(du, f);
  const VU lsb = hn::And(hn::ShiftRight<16>(x), hn::Set(du, 1u));
  return nan_to_canonical(x, hn::ShiftRight<16>(hn::Add(hn::Add(x, hn::Set(du, 0x7FFFu)), lsb)));
}

// round_bits(stream, index) for the indices in idx (their low words: 32-bit arithmetic, as the
// scalar).
HWY_INLINE VU round_bits(std::uint32_t stream32, VU idx) {
  const DU du;
  VU x = hn::Add(hn::Set(du, stream32), hn::Mul(idx, hn::Set(du, 0x9E3779B9u)));
  x = hn::Xor(x, hn::ShiftRight<16>(x));
  x = hn::Mul(x, hn::Set(du, 0x7FEB352Du));
  x = hn::Xor(x, hn::ShiftRight<15>(x));
  x = hn::Mul(x, hn::Set(du, 0x846CA68Bu));
  x = hn::Xor(x, hn::ShiftRight<16>(x));
  return hn::ShiftRight<16>(x);
}

// float_to_bf16_bits_sr with 16 random bits per lane.
HWY_INLINE VU round_stochastic(VF f, VU r16) {
  const DU du;
  const VU x = hn::BitCast(du, f);
  return nan_to_canonical(x, hn::ShiftRight<16>(hn::Add(x, r16)));
}

HWY_INLINE void store_m(VF x, std::uint16_t* p) { store_bits(round_nearest(x), p); }
HWY_INLINE void store_m(VF x, float* p) { hn::StoreU(x, DF(), p); }
HWY_INLINE void store_v(VF x, std::uint16_t* p, std::uint32_t stream32, VU idx) {
  store_bits(round_stochastic(x, round_bits(stream32, idx)), p);
}
HWY_INLINE void store_v(VF x, float* p, std::uint32_t, VU) { hn::StoreU(x, DF(), p); }

// One vector of the update (adamw_element in adamw_cpu.cpp, operation for operation: separate
// multiplies and adds, IEEE sqrt and division). idx: the low words of the lanes' region indices
// (bf16 v's rounding bits).
template <typename G, typename S, Weight kWeight>
HWY_INLINE void adamw_vector(float* HWY_RESTRICT master, S* HWY_RESTRICT m, S* HWY_RESTRICT v,
                             const G* HWY_RESTRICT g, std::uint16_t* HWY_RESTRICT w,
                             const StepScalars& k, std::uint32_t stream32, VU idx) {
  const DF df;
  const VF before = hn::LoadU(df, master);
  const VF gi = hn::Mul(load_f32(df, g), hn::Set(df, k.grad_scale));
  const VF mi = hn::Add(hn::Mul(hn::Set(df, k.beta1), load_f32(df, m)),
                        hn::Mul(hn::Set(df, k.one_minus_beta1), gi));
  const VF vi = hn::Add(hn::Mul(hn::Set(df, k.beta2), load_f32(df, v)),
                        hn::Mul(hn::Set(df, k.one_minus_beta2), hn::Mul(gi, gi)));
  const VF denom = hn::Add(hn::Mul(hn::Sqrt(vi), hn::Set(df, k.inv_sqrt_bc2)), hn::Set(df, k.eps));
  const VF p = hn::Sub(hn::Mul(before, hn::Set(df, k.decay)),
                       hn::Mul(hn::Set(df, k.step_size), hn::Div(mi, denom)));
  store_m(mi, m);
  store_v(vi, v, stream32, idx);
  hn::StoreU(p, df, master);
  if constexpr (kWeight == Weight::plain) store_bits(round_nearest(p), w);
  if constexpr (kWeight == Weight::predict) {
    store_bits(round_nearest(hn::Add(p, hn::Mul(hn::Set(df, k.extrapolate), hn::Sub(p, before)))), w);
  }
}

template <typename G, typename S, Weight kWeight>
void adamw_typed(const AdamWRange& r, const StepScalars& k) {
  float* master = r.master;
  auto* m = static_cast<S*>(r.m);
  auto* v = static_cast<S*>(r.v);
  const auto* g = static_cast<const G*>(r.g);
  std::uint16_t* w = r.w;
  const auto stream32 = static_cast<std::uint32_t>(r.stream);
  const auto first32 = static_cast<std::uint32_t>(r.first);
  const DU du;
  const std::size_t lanes = hn::Lanes(du);
  // The lanes' indices, stepped by a vector add: Iota builds its vector through memory on x86,
  // and rebuilding it per vector held the bf16-state loop back (bench/results, 2026-12-05).
  VU idx = hn::Iota(du, first32);
  const VU step = hn::Set(du, static_cast<std::uint32_t>(lanes));
  std::size_t i = 0;
  for (; i + lanes <= r.n; i += lanes, idx = hn::Add(idx, step)) {
    adamw_vector<G, S, kWeight>(master + i, m + i, v + i, g + i,
                                kWeight == Weight::none ? nullptr : w + i, k, stream32, idx);
  }
  if (i == r.n) return;
  // The last partial vector: the same vector code on zero-padded copies, so every element of
  // a range goes through one code path whatever its length and start.
  const std::size_t rest = r.n - i;
  HWY_ALIGN float pb[kMaxLanes] = {};
  HWY_ALIGN S mb[kMaxLanes] = {}, vb[kMaxLanes] = {};
  HWY_ALIGN G gb[kMaxLanes] = {};
  HWY_ALIGN std::uint16_t wb[kMaxLanes] = {};
  std::memcpy(pb, master + i, rest * sizeof(float));
  std::memcpy(mb, m + i, rest * sizeof(S));
  std::memcpy(vb, v + i, rest * sizeof(S));
  std::memcpy(gb, g + i, rest * sizeof(G));
  adamw_vector<G, S, kWeight>(pb, mb, vb, gb, wb, k, stream32, idx);
  std::memcpy(master + i, pb, rest * sizeof(float));
  std::memcpy(m + i, mb, rest * sizeof(S));
  std::memcpy(v + i, vb, rest * sizeof(S));
  if (kWeight != Weight::none) std::memcpy(w + i, wb, rest * sizeof(std::uint16_t));
}

template <typename G, typename S>
void adamw_weight(const AdamWRange& r, const StepScalars& k) {
  switch (r.weight) {
    case Weight::none: return adamw_typed<G, S, Weight::none>(r, k);
    case Weight::plain: return adamw_typed<G, S, Weight::plain>(r, k);
    case Weight::predict: return adamw_typed<G, S, Weight::predict>(r, k);
  }
}

void adamw_target(const AdamWRange& r, const StepScalars& k) {
  using U16 = std::uint16_t;
  if (r.grad == GradType::bf16) {
    r.bf16_state ? adamw_weight<U16, U16>(r, k) : adamw_weight<U16, float>(r, k);
  } else {
    r.bf16_state ? adamw_weight<float, U16>(r, k) : adamw_weight<float, float>(r, k);
  }
}

// Σ x² in double with eight partial sums, element i into partial i mod 8 on every target: four
// accumulators of two double lanes (a width every vector target has), lane j of accumulator a
// holding the elements 2a + j mod 8. HWY_SCALAR (the fallback, one lane) keeps the eight
// partials in a plain array.
template <typename G>
double sumsq_typed(const G* HWY_RESTRICT g, std::size_t n) {
  HWY_ALIGN double s[8] = {};
#if HWY_TARGET == HWY_SCALAR
  for (std::size_t i = 0; i < n; ++i) {
    double x;
    if constexpr (sizeof(G) == 2) x = bf16_bits_to_float(g[i]);
    else x = g[i];
    s[i % 8] += x * x;
  }
#else
  const hn::FixedTag<double, 2> dd;
  const hn::Rebind<float, decltype(dd)> df2;
  auto pair = [&](const G* p) {
    hn::Vec<decltype(df2)> f;
    if constexpr (sizeof(G) == 2) {
      const hn::RebindToUnsigned<decltype(df2)> du2;
      const hn::Rebind<std::uint16_t, decltype(df2)> dh2;
      f = hn::BitCast(df2, hn::ShiftLeft<16>(hn::PromoteTo(du2, hn::LoadU(dh2, p))));
    } else {
      f = hn::LoadU(df2, p);
    }
    const auto x = hn::PromoteTo(dd, f);
    return hn::Mul(x, x);
  };
  auto a0 = hn::Zero(dd), a1 = hn::Zero(dd), a2 = hn::Zero(dd), a3 = hn::Zero(dd);
  auto group = [&](const G* p) {
    a0 = hn::Add(a0, pair(p));
    a1 = hn::Add(a1, pair(p + 2));
    a2 = hn::Add(a2, pair(p + 4));
    a3 = hn::Add(a3, pair(p + 6));
  };
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) group(g + i);
  if (i < n) {  // zero padding adds +0.0: a partial (+0.0 or more, or NaN) does not change
    G tail[8] = {};
    std::memcpy(tail, g + i, (n - i) * sizeof(G));
    group(tail);
  }
  hn::StoreU(a0, dd, s);
  hn::StoreU(a1, dd, s + 2);
  hn::StoreU(a2, dd, s + 4);
  hn::StoreU(a3, dd, s + 6);
#endif
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

double sumsq_target(const void* g, GradType t, std::size_t n) {
  if (t == GradType::bf16) return sumsq_typed(static_cast<const std::uint16_t*>(g), n);
  return sumsq_typed(static_cast<const float*>(g), n);
}

template <typename S, bool kAssign>
void accumulate_typed(float* HWY_RESTRICT d, const S* HWY_RESTRICT s, std::size_t n) {
  const DF df;
  const std::size_t lanes = hn::Lanes(df);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const VF x = load_f32(df, s + i);
    hn::StoreU(kAssign ? x : hn::Add(hn::LoadU(df, d + i), x), df, d + i);
  }
  // The tail: one addition per element, the same as a lane's.
  for (; i < n; ++i) {
    float x;
    if constexpr (sizeof(S) == 2) x = bf16_bits_to_float(s[i]);
    else x = s[i];
    d[i] = kAssign ? x : d[i] + x;
  }
}

void accumulate_target(float* d, const void* s, GradType t, std::size_t n, bool assign) {
  if (t == GradType::bf16) {
    const auto* b = static_cast<const std::uint16_t*>(s);
    assign ? accumulate_typed<std::uint16_t, true>(d, b, n) : accumulate_typed<std::uint16_t, false>(d, b, n);
  } else {
    const auto* f = static_cast<const float*>(s);
    assign ? accumulate_typed<float, true>(d, f, n) : accumulate_typed<float, false>(d, f, n);
  }
}

std::int64_t this_target() { return HWY_TARGET; }

}  // namespace HWY_NAMESPACE
}  // namespace ght::optimizer::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace ght::optimizer::simd {

HWY_EXPORT(adamw_target);
HWY_EXPORT(sumsq_target);
HWY_EXPORT(accumulate_target);
HWY_EXPORT(this_target);

void adamw(const AdamWRange& r, const StepScalars& k) {
  if (r.n > 0) HWY_DYNAMIC_DISPATCH(adamw_target)(r, k);
}

double sumsq(const void* g, GradType t, std::size_t n) { return HWY_DYNAMIC_DISPATCH(sumsq_target)(g, t, n); }

void accumulate(float* dst, const void* src, GradType t, std::size_t n, bool assign) {
  if (n > 0) HWY_DYNAMIC_DISPATCH(accumulate_target)(dst, src, t, n, assign);
}

std::vector<std::int64_t> targets() {
  std::vector<std::int64_t> t = hwy::SupportedAndGeneratedTargets();
  // Highway 1.0.3's SupportedTargets(), called before the first dispatch, leaves the dispatch
  // initialised without the vector-length targets it adds last (aarch64: SVE2_128 at 128 bits,
  // SVE_256 at 256), so every later call would run SVE2. Setting it from the full answer keeps
  // the dispatch on the best target, as when the first dispatch comes first.
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
  return t;
}

std::string target_name(std::int64_t target) { return hwy::TargetName(target); }

std::string active_target() { return target_name(HWY_DYNAMIC_DISPATCH(this_target)()); }

void force_target_for_test(std::int64_t target) { hwy::SetSupportedTargetsForTest(target); }

}  // namespace ght::optimizer::simd
#endif  // HWY_ONCE
