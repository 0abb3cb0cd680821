// The host's AdamW (fp32, bf16 and q8 state), q8 quantizer, sum of squares and accumulator
// loops, once for every Highway target (adamw_simd.hpp). Compiled with -ffp-contract=off
// (optimizer/CMakeLists.txt): GCC would otherwise fuse a vector multiply and add into an FMA,
// which rounds once instead of twice. foreach_target.h compiles this file once per target, each
// copy in its own namespace.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "optimizer/detail/adamw_simd.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep

#include <hwy/highway.h>

#include <algorithm>
#include <cstring>

#include "optimizer/detail/adamw_simd.hpp"
#include "optimizer/detail/q8_decades.hpp"

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

// The update of one vector on fp32 m and v held in registers (adamw_element in adamw_cpu.cpp,
// operation for operation: separate multiplies and adds, IEEE sqrt and division): m and v become
// this step's values; returns the new master from its value before.
template <typename G>
HWY_INLINE VF update(VF before, VF& m, VF& v, const G* HWY_RESTRICT g, const StepScalars& k) {
  const DF df;
  const VF gi = hn::Mul(load_f32(df, g), hn::Set(df, k.grad_scale));
  m = hn::Add(hn::Mul(hn::Set(df, k.beta1), m), hn::Mul(hn::Set(df, k.one_minus_beta1), gi));
  v = hn::Add(hn::Mul(hn::Set(df, k.beta2), v), hn::Mul(hn::Set(df, k.one_minus_beta2), hn::Mul(gi, gi)));
  const VF denom = hn::Add(hn::Mul(hn::Sqrt(v), hn::Set(df, k.inv_sqrt_bc2)), hn::Set(df, k.eps));
  return hn::Sub(hn::Mul(before, hn::Set(df, k.decay)), hn::Mul(hn::Set(df, k.step_size), hn::Div(m, denom)));
}

// The new master p and the compute weight the mode asks for.
template <Weight kWeight>
HWY_INLINE void store_master(VF p, VF before, float* HWY_RESTRICT master, std::uint16_t* HWY_RESTRICT w,
                             const StepScalars& k) {
  const DF df;
  hn::StoreU(p, df, master);
  if constexpr (kWeight == Weight::plain) store_bits(round_nearest(p), w);
  if constexpr (kWeight == Weight::predict) {
    store_bits(round_nearest(hn::Add(p, hn::Mul(hn::Set(df, k.extrapolate), hn::Sub(p, before)))), w);
  }
}

// One vector of the update on fp32 or bf16 state in memory. idx: the low words of the lanes'
// region indices (bf16 v's rounding bits). m and v are stored before master (stored after it,
// the bf16-state loop runs 6% slower on AVX2 with GCC 12).
template <typename G, typename S, Weight kWeight>
HWY_INLINE void adamw_vector(float* HWY_RESTRICT master, S* HWY_RESTRICT m, S* HWY_RESTRICT v,
                             const G* HWY_RESTRICT g, std::uint16_t* HWY_RESTRICT w,
                             const StepScalars& k, std::uint32_t stream32, VU idx) {
  const DF df;
  const VF before = hn::LoadU(df, master);
  VF mi = load_f32(df, m);
  VF vi = load_f32(df, v);
  const VF p = update(before, mi, vi, g, k);
  store_m(mi, m);
  store_v(vi, v, stream32, idx);
  store_master<kWeight>(p, before, master, w, k);
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

// ---- q8 state (adamw_q8, q8_store_block) ----

using D8 = hn::Rebind<std::uint8_t, DF>;  // codes, as many lanes as DF

HWY_INLINE VU load_codes(const std::uint8_t* p) { return hn::PromoteTo(DU(), hn::LoadU(D8(), p)); }
// Codes (each lane < 256) to memory: the i32 -> u8 demotion saturates nothing here.
HWY_INLINE void store_codes(VU codes, std::uint8_t* p) {
  hn::StoreU(hn::DemoteTo(D8(), hn::BitCast(DI(), codes)), D8(), p);
}

// ---- q8 dequantization in closed form (q8_decades.hpp: the math and why it is exact) ----

static_assert(kMaxLanes <= kQ8DecadeLanes, "a decade table must fill the widest vector");

// Entry idx (0..7) of an 8-entry decade table per lane: one in-register permutation where a
// vector holds 8 lanes or more, two and a select at 4 lanes (SSE4, NEON, 128-bit SVE), a load
// for the one-lane fallback.
HWY_INLINE VF decade_lookup(const float* HWY_RESTRICT table, hn::Vec<DI> idx) {
  const DF df;
#if HWY_TARGET == HWY_SCALAR
  return hn::Set(df, table[hn::GetLane(idx)]);
#else
  if (hn::Lanes(df) >= 8) return hn::TableLookupLanes(hn::LoadU(df, table), hn::IndicesFromVec(df, idx));
  const DI di;
  const auto low = hn::IndicesFromVec(df, hn::And(idx, hn::Set(di, 3)));
  const VF first = hn::TableLookupLanes(hn::LoadU(df, table), low);
  const VF second = hn::TableLookupLanes(hn::LoadU(df, table + 4), low);
  return hn::IfThenElse(hn::RebindMask(df, hn::Gt(idx, hn::Set(di, 3))), second, first);
#endif
}

// RN32(N · hi + RN32(N · lo)) = RN32(N / D) of codes 1..255 (q8_decades.hpp); lanes of code 0
// hold a value the callers replace. The conversion of the code gives F in its exponent: 2^F is
// those bits without the mantissa, the decade's entry their low 3 bits.
HWY_INLINE VF closed_value(VU c, const float* HWY_RESTRICT hi, const float* HWY_RESTRICT lo) {
  const DF df;
  const DU du;
  const DI di;
  const VF cf = hn::ConvertTo(df, hn::BitCast(di, c));
  const VU bits = hn::BitCast(du, cf);
  const VF pow2 = hn::BitCast(df, hn::And(bits, hn::Set(du, 0xFF800000u)));
  const VF n = hn::Sub(hn::Add(hn::Mul(cf, hn::Set(df, 9.0f)), hn::Set(df, 9.0f)), hn::Mul(pow2, hn::Set(df, 8.0f)));
  const auto idx = hn::BitCast(di, hn::And(hn::ShiftRight<23>(bits), hn::Set(du, 7u)));
  return hn::Add(hn::Mul(n, decade_lookup(hi, idx)), hn::Mul(n, decade_lookup(lo, idx)));
}

// m's code value x scale: the magnitude's value (0 for magnitude 0), the code's sign bit moved
// to the float's (code 0x80 gives -0, as the map), then one fp32 multiply (q8_dequantize).
HWY_INLINE VF dequantize_m(const Q8Decades& d, VU codes, VF scale) {
  const DF df;
  const DU du;
  const VU a = hn::And(codes, hn::Set(du, 0x7Fu));
  const VF mag = hn::IfThenZeroElse(hn::RebindMask(df, hn::Eq(a, hn::Zero(du))), closed_value(a, d.m_hi, d.m_lo));
  const VU sign = hn::ShiftLeft<24>(hn::And(codes, hn::Set(du, 0x80u)));
  return hn::Mul(hn::BitCast(df, hn::Or(hn::BitCast(du, mag), sign)), scale);
}

// v's code value x scale (code 0: 10^-8).
HWY_INLINE VF dequantize_v(const Q8Decades& d, VU codes, VF scale) {
  const DF df;
  const DU du;
  const auto zero = hn::RebindMask(df, hn::Eq(codes, hn::Zero(du)));
  return hn::Mul(hn::IfThenElse(zero, hn::Set(df, kQ8VZero), closed_value(codes, d.v_hi, d.v_lo)), scale);
}

// One step of the block absmax: acc = |x| > acc ? |x| : acc (a NaN lane never replaces acc, so
// every lane stays +0 or positive and the lanes' maximum is the scalar loop's result).
HWY_INLINE VF absmax_step(VF acc, VF x) {
  const VF a = hn::Abs(x);
  return hn::IfThenElse(hn::Gt(a, acc), a, acc);
}
HWY_INLINE float absmax_of(VF acc) { return hn::GetLane(hn::MaxOfLanes(DF(), acc)); }

// The number of midpoints below q for the bits of a q >= +0 (Q8Index): the start of its bucket
// (every q from 1.0 up in the last one), plus one when q is above the bucket's midpoint.
HWY_INLINE VU search(const std::uint32_t* HWY_RESTRICT index, VU bits) {
  const DU du;
  const DI di;
  const VU bucket = hn::Min(hn::ShiftRight<16>(bits), hn::Set(du, kQ8IndexTop));
  const VU e = hn::GatherIndex(du, index, hn::BitCast(di, bucket));
  const VU low16 = hn::Set(du, 0xFFFFu);
  const auto above = hn::Gt(hn::BitCast(di, hn::And(bits, low16)), hn::BitCast(di, hn::And(e, low16)));
  return hn::Add(hn::ShiftRight<16>(e), hn::IfThenElseZero(hn::RebindMask(du, above), hn::Set(du, 1u)));
}

// q8_code_m: the magnitude's code, 0 for NaN; the sign bit for q < 0 unless the magnitude is 0.
HWY_INLINE VU code_m(const std::uint32_t* HWY_RESTRICT index, VF q) {
  const DF df;
  const DU du;
  const DI di;
  const VU mag_bits = hn::And(hn::BitCast(du, q), hn::Set(du, 0x7FFFFFFFu));
  const auto nan = hn::RebindMask(du, hn::Gt(hn::BitCast(di, mag_bits), hn::Set(di, 0x7F800000)));
  const VU mag = hn::IfThenZeroElse(nan, search(index, mag_bits));
  const VU sign = hn::IfThenElseZero(hn::RebindMask(du, hn::Lt(q, hn::Zero(df))), hn::Set(du, 0x80u));
  return hn::IfThenZeroElse(hn::Eq(mag, hn::Zero(du)), hn::Or(mag, sign));
}

// q8_code_v: 0 for NaN and for every q with the sign bit (each is below every midpoint).
HWY_INLINE VU code_v(const std::uint32_t* HWY_RESTRICT index, VF q) {
  const DU du;
  const DI di;
  const VU bits = hn::BitCast(du, q);
  const auto bi = hn::BitCast(di, bits);
  const auto none = hn::Or(hn::Lt(bi, hn::Zero(di)), hn::Gt(bi, hn::Set(di, 0x7F800000)));
  return hn::IfThenZeroElse(hn::RebindMask(du, none), search(index, bits));
}

// The record of a block from the fp32 values x (readable up to len rounded up to whole vectors)
// and their absmax s: the codes of x · (1 / s), 0 after len, then s.
template <bool kV>
void quantize_block(const float* HWY_RESTRICT x, std::size_t len, float s, std::uint8_t* HWY_RESTRICT rec,
                    const std::uint32_t* HWY_RESTRICT index) {
  const DF df;
  const std::size_t lanes = hn::Lanes(df);
  const VF r = hn::Set(df, s > 0 ? 1.0f / s : 0.0f);
  for (std::size_t i = 0; i < len; i += lanes) {
    const VF q = hn::Mul(hn::LoadU(df, x + i), r);
    store_codes(kV ? code_v(index, q) : code_m(index, q), rec + i);
  }
  std::memset(rec + len, 0, kQ8Block - len);
  std::memcpy(rec + kQ8Block, &s, sizeof s);
}

HWY_INLINE float record_scale(const std::uint8_t* rec) {
  float s;
  std::memcpy(&s, rec + kQ8Block, sizeof s);
  return s;
}

// The tables one q8 block needs.
struct Q8Maps {
  const Q8Decades& d;
  const Q8Index& ix;
};

// One q8 block of len <= kQ8Block elements, fused: the codes are widened and scaled, updated,
// kept in L1-resident fp32 copies while the absmax accumulates, and quantized from there. The
// last partial vector runs on zero-padded copies of master and g (a record always holds
// kQ8Block codes), its padding lanes left out of the absmax.
template <typename G, Weight kWeight>
void q8_block(float* HWY_RESTRICT master, std::uint8_t* mrec, std::uint8_t* vrec,
              const G* HWY_RESTRICT g, std::uint16_t* HWY_RESTRICT w, std::size_t len,
              const StepScalars& k, const Q8Maps& q) {
  const DF df;
  const std::size_t lanes = hn::Lanes(df);
  const VF sm = hn::Set(df, record_scale(mrec)), sv = hn::Set(df, record_scale(vrec));
  HWY_ALIGN float mo[kQ8Block], vo[kQ8Block];
  VF am = hn::Zero(df), av = hn::Zero(df);
  std::size_t i = 0;
  for (; i + lanes <= len; i += lanes) {
    VF mi = dequantize_m(q.d, load_codes(mrec + i), sm);
    VF vi = dequantize_v(q.d, load_codes(vrec + i), sv);
    const VF before = hn::LoadU(df, master + i);
    const VF p = update(before, mi, vi, g + i, k);
    store_master<kWeight>(p, before, master + i, kWeight == Weight::none ? nullptr : w + i, k);
    hn::Store(mi, df, mo + i);
    hn::Store(vi, df, vo + i);
    am = absmax_step(am, mi);
    av = absmax_step(av, vi);
  }
  if (i < len) {
    const std::size_t rest = len - i;
    HWY_ALIGN float pb[kMaxLanes] = {};
    HWY_ALIGN G gb[kMaxLanes] = {};
    HWY_ALIGN std::uint16_t wb[kMaxLanes] = {};
    std::memcpy(pb, master + i, rest * sizeof(float));
    std::memcpy(gb, g + i, rest * sizeof(G));
    VF mi = dequantize_m(q.d, load_codes(mrec + i), sm);
    VF vi = dequantize_v(q.d, load_codes(vrec + i), sv);
    const VF before = hn::Load(df, pb);
    store_master<kWeight>(update(before, mi, vi, gb, k), before, pb, wb, k);
    std::memcpy(master + i, pb, rest * sizeof(float));
    if (kWeight != Weight::none) std::memcpy(w + i, wb, rest * sizeof(std::uint16_t));
    hn::Store(mi, df, mo + i);
    hn::Store(vi, df, vo + i);
    const auto real = hn::FirstN(df, rest);
    am = absmax_step(am, hn::IfThenElseZero(real, mi));
    av = absmax_step(av, hn::IfThenElseZero(real, vi));
  }
  quantize_block<false>(mo, len, absmax_of(am), mrec, q.ix.m);
  quantize_block<true>(vo, len, absmax_of(av), vrec, q.ix.v);
}

template <typename G, Weight kWeight>
void adamw_q8_typed(const Q8Range& r, const StepScalars& k, const Q8Maps& q) {
  const auto* g = static_cast<const G*>(r.g);
  for (std::size_t e = 0, b = 0; e < r.n; e += kQ8Block, ++b) {
    q8_block<G, kWeight>(r.master + e, r.m + b * kQ8Record, r.v + b * kQ8Record, g + e,
                         kWeight == Weight::none ? nullptr : r.w + e, std::min(kQ8Block, r.n - e), k, q);
  }
}

template <typename G>
void adamw_q8_weight(const Q8Range& r, const StepScalars& k, const Q8Maps& q) {
  switch (r.weight) {
    case Weight::none: return adamw_q8_typed<G, Weight::none>(r, k, q);
    case Weight::plain: return adamw_q8_typed<G, Weight::plain>(r, k, q);
    case Weight::predict: return adamw_q8_typed<G, Weight::predict>(r, k, q);
  }
}

void adamw_q8_target(const Q8Range& r, const StepScalars& k, const Q8Decades& d, const Q8Index& ix) {
  const Q8Maps q{d, ix};
  if (r.grad == GradType::bf16) adamw_q8_weight<std::uint16_t>(r, k, q);
  else adamw_q8_weight<float>(r, k, q);
}

// q8_store_block: the values copied into a zero-padded block first (padding adds nothing to the
// absmax, and the quantizer reads whole vectors).
void q8_store_block_target(const float* x, std::size_t len, std::uint8_t* rec, bool is_v, const Q8Index& ix) {
  const DF df;
  const std::size_t lanes = hn::Lanes(df);
  HWY_ALIGN float b[kQ8Block] = {};
  std::memcpy(b, x, len * sizeof(float));
  VF acc = hn::Zero(df);
  for (std::size_t i = 0; i < len; i += lanes) acc = absmax_step(acc, hn::Load(df, b + i));
  if (is_v) quantize_block<true>(b, len, absmax_of(acc), rec, ix.v);
  else quantize_block<false>(b, len, absmax_of(acc), rec, ix.m);
}

// q8_load_block: whole vectors of codes (a record holds kQ8Block of them), the last partial one
// stored through a buffer.
void q8_load_block_target(const std::uint8_t* rec, std::size_t len, float* x, bool is_v, const Q8Decades& d) {
  const DF df;
  const std::size_t lanes = hn::Lanes(df);
  const VF s = hn::Set(df, record_scale(rec));
  for (std::size_t i = 0; i < len; i += lanes) {
    const VU c = load_codes(rec + i);
    const VF y = is_v ? dequantize_v(d, c, s) : dequantize_m(d, c, s);
    if (i + lanes <= len) {
      hn::StoreU(y, df, x + i);
    } else {
      HWY_ALIGN float b[kMaxLanes];
      hn::Store(y, df, b);
      std::memcpy(x + i, b, (len - i) * sizeof(float));
    }
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
HWY_EXPORT(adamw_q8_target);
HWY_EXPORT(q8_store_block_target);
HWY_EXPORT(q8_load_block_target);
HWY_EXPORT(this_target);

void adamw(const AdamWRange& r, const StepScalars& k) {
  if (r.n > 0) HWY_DYNAMIC_DISPATCH(adamw_target)(r, k);
}

void adamw_q8(const Q8Range& r, const StepScalars& k) {
  if (r.n > 0) HWY_DYNAMIC_DISPATCH(adamw_q8_target)(r, k, q8_decades(), q8_index());
}

void q8_store_block(const float* x, std::size_t len, std::uint8_t* rec, bool is_v) {
  HWY_DYNAMIC_DISPATCH(q8_store_block_target)(x, len, rec, is_v, q8_index());
}

void q8_load_block(const std::uint8_t* rec, std::size_t len, float* x, bool is_v) {
  if (len > 0) HWY_DYNAMIC_DISPATCH(q8_load_block_target)(rec, len, x, is_v, q8_decades());
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
