// Host AdamW and the deterministic host sum of squares: the threads' split and the q8 maps and
// search index here, the element loops (the q8 blocks' included) in detail/adamw_simd.cpp
// (Google Highway, one source for every ISA).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "optimizer/adamw_kernels.hpp"
#include "optimizer/cpu_threads.hpp"
#include "optimizer/detail/adamw_simd.hpp"
#include "tier/cost_model.hpp"
#include "tier/error.hpp"

namespace ght::optimizer {

StepScalars make_step_scalars(const AdamWHyper& h, double lr, std::int64_t step, bool decay,
                              double grad_scale) {
  GHT_EXPECTS(step >= 1, "AdamW step must be >= 1, got " + std::to_string(step));
  GHT_EXPECTS(lr >= 0 && std::isfinite(lr), "AdamW lr must be finite and >= 0, got " +
                                                std::to_string(lr));
  GHT_EXPECTS(h.beta1 >= 0 && h.beta1 < 1, "AdamW beta1 must be in [0, 1), got " +
                                               std::to_string(h.beta1));
  GHT_EXPECTS(h.beta2 >= 0 && h.beta2 < 1, "AdamW beta2 must be in [0, 1), got " +
                                               std::to_string(h.beta2));
  GHT_EXPECTS(h.eps > 0, "AdamW eps must be > 0, got " + std::to_string(h.eps));
  GHT_EXPECTS(grad_scale > 0 && grad_scale <= 1, "grad_scale must be in (0, 1], got " +
                                                     std::to_string(grad_scale));
  const double t = static_cast<double>(step);
  const double bc1 = 1.0 - std::pow(h.beta1, t);
  const double bc2 = 1.0 - std::pow(h.beta2, t);
  StepScalars k;
  k.beta1 = static_cast<float>(h.beta1);
  k.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
  k.beta2 = static_cast<float>(h.beta2);
  k.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  k.eps = static_cast<float>(h.eps);
  k.step_size = static_cast<float>(lr / bc1);
  k.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  k.decay = static_cast<float>(decay ? 1.0 - lr * h.weight_decay : 1.0);
  k.grad_scale = static_cast<float>(grad_scale);
  GHT_EXPECTS(std::isfinite(h.weight_extrapolation), "AdamW weight extrapolation must be finite");
  k.extrapolate = static_cast<float>(h.weight_extrapolation);
  k.step = static_cast<std::uint64_t>(step);
  return k;
}

int link_kernel_sms(double link_bps, double hbm_bps, int sms, const LinkKernelLoad& load) {
  GHT_EXPECTS(sms >= 1, "link_kernel_sms: the GPU needs at least one SM, got " + std::to_string(sms));
  GHT_EXPECTS(load.state_bytes > 0, "link_kernel_sms: state bytes per parameter must be > 0");
  GHT_EXPECTS(load.link_bytes >= 0 && load.gpu_params_per_second >= 0,
              "link_kernel_sms: link bytes and the kernel's rate must be >= 0");
  if (!(link_bps > 0) || !(hbm_bps > 0)) return sms;
  const double link_bytes = load.link_bytes > 0 ? load.link_bytes : load.state_bytes;
  const double delivered = link_bps / (2 * link_bytes);
  // Per parameter the kernel reads and writes master, m and v, reads an fp32 (at most) gradient
  // and writes the bf16 weight.
  const double hbm_bytes = 2 * load.state_bytes + tier::kHostGradBytes + tier::kUpdateWeightBytes;
  double per_sm = hbm_bps / sms / hbm_bytes;
  if (load.gpu_params_per_second > 0) per_sm = std::min(per_sm, load.gpu_params_per_second / sms);
  const double need = kLinkKernelMargin * delivered / per_sm;
  return static_cast<int>(std::clamp(std::ceil(need), 1.0, static_cast<double>(sms)));
}

int split_update_sms(int sms, double link_params, double hbm_params, int link_alone) {
  GHT_EXPECTS(link_params >= 0 && hbm_params >= 0, "split_update_sms: parameter counts must be >= 0");
  if (sms < 2 || !(link_params > 0) || !(hbm_params > 0)) return 0;
  const double share = std::round(sms * link_params / (link_params + hbm_params));
  const int most = std::clamp(link_alone, 1, sms - 1);
  return static_cast<int>(std::clamp(share, 1.0, static_cast<double>(most)));
}

std::uint64_t round_key(std::string_view region_name) noexcept {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (const char c : region_name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001B3ull;
  }
  return h;
}

namespace {

// The q8 maps (adamw_kernels.hpp): each value one double division of exact integers, then fp32.
Q8Tables make_q8_tables() {
  Q8Tables t{};
  double p10[9] = {1};
  for (int i = 1; i < 9; ++i) p10[i] = p10[i - 1] * 10;  // exact
  // Code c >= 1 with `top` bits below the first set one at most: the decade is given by the
  // leading zeros, the fraction by the bits after the first set one.
  auto value = [&](unsigned c, unsigned top) {
    const unsigned f_bits = static_cast<unsigned>(std::bit_width(c)) - 1;
    const unsigned z = top - f_bits, f = c - (1u << f_bits);
    const double numer = static_cast<double>((1u << f_bits) + 9 * (f + 1));
    return static_cast<float>(numer / (10.0 * static_cast<double>(1u << f_bits) * p10[z]));
  };
  float mag[128];
  mag[0] = 0;
  for (unsigned a = 1; a < 128; ++a) mag[a] = value(a, 6);
  t.v[0] = static_cast<float>(1.0 / p10[8]);
  for (unsigned c = 1; c < 256; ++c) t.v[c] = value(c, 7);
  for (unsigned c = 0; c < 256; ++c) t.m[c] = c < 128 ? mag[c] : -mag[c - 128];
  auto mid = [](float a, float b) { return static_cast<float>((static_cast<double>(a) + b) / 2); };
  for (unsigned a = 0; a < 127; ++a) t.m_mid[a] = mid(mag[a], mag[a + 1]);
  for (unsigned c = 0; c < 255; ++c) t.v_mid[c] = mid(t.v[c], t.v[c + 1]);
  t.m_mid[127] = t.v_mid[255] = std::numeric_limits<float>::infinity();
  return t;
}

// The host's nearest-code search (simd::Q8Index): per bucket of 65,536 fp32 values the count of
// midpoints below it and the one midpoint inside it, if any. Fails if a bucket below 1.0 held two
// midpoints (one comparison per value would not find the code) or if a midpoint were 1.0 or more.
void fill_q8_index(std::uint32_t* out, const float* mid, unsigned count, unsigned half) {
  for (std::uint32_t b = 0; b <= simd::kQ8IndexTop; ++b) {
    out[b] = (q8_search(mid, half, std::bit_cast<float>(b << 16)) << 16) | 0xFFFFu;
  }
  for (unsigned c = 0; c + 1 < count; ++c) {  // the last midpoint is +inf
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(mid[c]);
    GHT_EXPECTS(mid[c] > 0 && mid[c] < 1.0f, "q8 index: a finite midpoint outside (0, 1)");
    std::uint32_t& e = out[bits >> 16];
    GHT_EXPECTS((e & 0xFFFFu) == 0xFFFFu, "q8 index: two midpoints in one bucket");
    e = (e & ~0xFFFFu) | (bits & 0xFFFFu);
  }
}

simd::Q8Index make_q8_index(const Q8Tables& t) {
  simd::Q8Index x{};
  fill_q8_index(x.m, t.m_mid, 128, 64);
  fill_q8_index(x.v, t.v_mid, 256, 128);
  return x;
}

// The number of midpoints below q (0 for NaN and for every q with the sign bit), one element of
// the vector search in detail/adamw_simd.cpp.
inline unsigned q8_count(const std::uint32_t* index, float q) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(q);
  if (bits > 0x7F800000u) return 0;
  const std::uint32_t e = index[std::min(bits >> 16, simd::kQ8IndexTop)];
  return (e >> 16) + ((bits & 0xFFFFu) > (e & 0xFFFFu) ? 1u : 0u);
}

// The compute weight the span asks for: none, bf16 of p, or bf16 of p extrapolated by
// k.extrapolate of this update (adamw_kernels.hpp).
simd::Weight weight_mode(const AdamWSpan& s, const StepScalars& k) {
  if (!s.weight) return simd::Weight::none;
  return k.extrapolate != 0 ? simd::Weight::predict : simd::Weight::plain;
}

// The Highway loop (detail/adamw_simd.cpp) over each thread's contiguous range; every element is
// computed on its own, so the split never changes a byte.
void adamw_team(const AdamWSpan& s, const StepScalars& k, int threads) {
  const std::size_t gsize = grad_type_size(s.grad_type);
  const std::size_t ssize = s.state == StateType::bf16 ? 2 : 4;
  const simd::Weight wm = weight_mode(s, k);
  const std::uint64_t stream = round_stream(s.key, k.step);
  parallel_pinned(threads, [&](int tid, int nt) {
    const Range r = thread_range(s.n, tid, nt);
    if (r.end <= r.begin) return;
    simd::AdamWRange a;
    a.master = s.master + r.begin;
    a.m = static_cast<char*>(s.m) + r.begin * ssize;
    a.v = static_cast<char*>(s.v) + r.begin * ssize;
    a.g = static_cast<const char*>(s.grad) + r.begin * gsize;
    a.w = wm != simd::Weight::none ? reinterpret_cast<std::uint16_t*>(s.weight) + r.begin : nullptr;
    a.n = r.end - r.begin;
    a.grad = s.grad_type;
    a.bf16_state = s.state == StateType::bf16;
    a.weight = wm;
    a.stream = stream;
    a.first = s.first + r.begin;
    simd::adamw(a, k);
  });
}

// Below this many elements a parallel region costs more than it saves.
constexpr std::size_t kMinPerThread = 1 << 15;

int team_size(std::size_t n, int threads) {
  const int want = resolve_cpu_threads(threads);
  const std::size_t useful = (n + kMinPerThread - 1) / kMinPerThread;
  return static_cast<int>(std::max<std::size_t>(1, std::min<std::size_t>(want, useful)));
}

double sumsq_team(const void* grad, GradType t, std::size_t n, int threads) {
  const std::size_t blocks = (n + kSumsqBlock - 1) / kSumsqBlock;
  const std::size_t gsize = grad_type_size(t);
  std::vector<double> partial(blocks, 0.0);
  // Blocks, not elements, are split between threads; each block's partial is computed by one
  // thread in a fixed order (the same on every SIMD target, adamw_simd.hpp), so the in-order sum
  // below is independent of the team size.
  parallel_pinned(team_size(n, threads), [&](int tid, int nt) {
    const Range r = thread_range(blocks, tid, nt, 1);
    for (std::size_t b = r.begin; b < r.end; ++b) {
      const std::size_t lo = b * kSumsqBlock;
      const std::size_t len = std::min(kSumsqBlock, n - lo);
      partial[b] = simd::sumsq(static_cast<const char*>(grad) + lo * gsize, t, len);
    }
  });
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

// q8 state: each thread's whole blocks through the fused block loop (detail/adamw_simd.cpp).
void adamw_q8_team(const AdamWSpan& s, const StepScalars& k, int threads) {
  const std::size_t gsize = grad_type_size(s.grad_type);
  const simd::Weight wm = weight_mode(s, k);
  const std::size_t blocks = (s.n + kQ8Block - 1) / kQ8Block;
  parallel_pinned(threads, [&](int tid, int nt) {
    const Range r = thread_range(blocks, tid, nt, 1);
    if (r.end <= r.begin) return;
    const std::size_t e = r.begin * kQ8Block;
    simd::Q8Range q;
    q.master = s.master + e;
    q.m = static_cast<std::uint8_t*>(s.m) + r.begin * kQ8Record;
    q.v = static_cast<std::uint8_t*>(s.v) + r.begin * kQ8Record;
    q.g = static_cast<const char*>(s.grad) + e * gsize;
    q.w = wm != simd::Weight::none ? reinterpret_cast<std::uint16_t*>(s.weight) + e : nullptr;
    q.n = std::min(r.end * kQ8Block, s.n) - e;
    q.grad = s.grad_type;
    q.weight = wm;
    simd::adamw_q8(q, k);
  });
}

}  // namespace

const Q8Tables& q8_tables() noexcept {
  static const Q8Tables t = make_q8_tables();
  return t;
}

namespace simd {
const Q8Index& q8_index() {
  static const Q8Index x = make_q8_index(q8_tables());
  return x;
}
}  // namespace simd

std::uint8_t q8_code_m_host(float q) noexcept {
  const unsigned mag = q8_count(simd::q8_index().m, q < 0 ? -q : q);
  return static_cast<std::uint8_t>(mag == 0 ? 0u : mag | (q < 0 ? 0x80u : 0u));
}
std::uint8_t q8_code_v_host(float q) noexcept {
  return static_cast<std::uint8_t>(q8_count(simd::q8_index().v, q));
}

void q8_quantize(const float* x, std::size_t n, std::uint8_t* records, bool is_v) {
  for (std::size_t e = 0, b = 0; e < n; e += kQ8Block, ++b) {
    simd::q8_store_block(x + e, std::min(kQ8Block, n - e), records + b * kQ8Record, is_v);
  }
}

void q8_dequantize(const std::uint8_t* records, std::size_t n, float* x, bool is_v) {
  for (std::size_t e = 0, b = 0; e < n; e += kQ8Block, ++b) {
    simd::q8_load_block(records + b * kQ8Record, std::min(kQ8Block, n - e), x + e, is_v);
  }
}

void adamw_cpu(const AdamWSpan& s, const StepScalars& k, int threads) {
  if (s.n == 0) return;
  GHT_EXPECTS(s.master && s.m && s.v && s.grad, "adamw_cpu: null master/m/v/grad pointer");
  const int nt = team_size(s.n, threads);
  if (s.state == StateType::q8) adamw_q8_team(s, k, nt);
  else adamw_team(s, k, nt);
}

double grad_sumsq_cpu(const void* grad, GradType t, std::size_t n, int threads) {
  if (n == 0) return 0.0;
  GHT_EXPECTS(grad != nullptr, "grad_sumsq_cpu: null gradient pointer");
  return sumsq_team(grad, t, n, threads);
}

}  // namespace ght::optimizer
