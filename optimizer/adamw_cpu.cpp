// Host AdamW and the deterministic host sum of squares. Compiled with -ffp-contract=off and
// -fno-math-errno (optimizer/CMakeLists.txt): the first keeps vector body and scalar tail
// bit-identical (so per-element results never depend on where a thread's range starts), the
// second lets sqrt vectorise.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "optimizer/adamw_kernels.hpp"
#include "optimizer/cpu_threads.hpp"
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

int link_kernel_sms(double link_bps, double hbm_bps, int sms, double state_bytes) {
  GHT_EXPECTS(sms >= 1, "link_kernel_sms: the GPU needs at least one SM, got " + std::to_string(sms));
  GHT_EXPECTS(state_bytes > 0, "link_kernel_sms: state bytes per parameter must be > 0");
  if (!(link_bps > 0) || !(hbm_bps > 0)) return sms;
  // Per parameter the link moves master, m and v each way; the kernel also reads an fp32 (at
  // most) gradient and writes the bf16 weight in HBM.
  const double hbm_per_link_byte = (2 * state_bytes + tier::kHostGradBytes + tier::kUpdateWeightBytes) / (2 * state_bytes);
  const double need = kLinkKernelMargin * link_bps * hbm_per_link_byte / (hbm_bps / sms);
  return static_cast<int>(std::clamp(std::ceil(need), 1.0, static_cast<double>(sms)));
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

inline float load_grad(const float* g, std::size_t i) { return g[i]; }
inline float load_grad(const std::uint16_t* g, std::size_t i) { return bf16_bits_to_float(g[i]); }

// m and v as stored: fp32, or bf16 bits (m rounded to nearest even, v stochastically with the
// bits of its element's index in the region's stream; see adamw_kernels.hpp).
inline float load_state(const float* s, std::size_t i) { return s[i]; }
inline float load_state(const std::uint16_t* s, std::size_t i) { return bf16_bits_to_float(s[i]); }
inline void store_moments(float* m, float* v, std::size_t i, float mi, float vi, std::uint64_t,
                          std::uint64_t) {
  m[i] = mi;
  v[i] = vi;
}
inline void store_moments(std::uint16_t* m, std::uint16_t* v, std::size_t i, float mi, float vi,
                          std::uint64_t stream, std::uint64_t first) {
  m[i] = float_to_bf16_bits(mi);
  v[i] = float_to_bf16_bits_sr(vi, round_bits(stream, first + i));
}

// What the compute weight is written as: W::none (no weight), W::plain (bf16 of p), W::predict
// (bf16 of p extrapolated by k.extrapolate of this update; the same fp32 operations as the GPU).
enum class W { none, plain, predict };

template <typename G, typename S, W kWeight>
void adamw_range(float* __restrict master, S* __restrict m, S* __restrict v,
                 const G* __restrict g, std::uint16_t* __restrict w, std::size_t n,
                 const StepScalars k, std::uint64_t stream, std::uint64_t first) {
#pragma omp simd
  for (std::size_t i = 0; i < n; ++i) {
    const float gi = load_grad(g, i) * k.grad_scale;
    const float mi = k.beta1 * load_state(m, i) + k.one_minus_beta1 * gi;
    const float vi = k.beta2 * load_state(v, i) + k.one_minus_beta2 * (gi * gi);
    const float denom = std::sqrt(vi) * k.inv_sqrt_bc2 + k.eps;
    const float before = master[i];
    const float p = before * k.decay - k.step_size * (mi / denom);
    store_moments(m, v, i, mi, vi, stream, first);
    master[i] = p;
    if constexpr (kWeight == W::plain) w[i] = float_to_bf16_bits(p);
    if constexpr (kWeight == W::predict) w[i] = float_to_bf16_bits(p + k.extrapolate * (p - before));
  }
}

template <typename G, typename S, W kWeight>
void adamw_team(const AdamWSpan& s, const StepScalars& k, int threads) {
  const G* g = static_cast<const G*>(s.grad);
  auto* m = static_cast<S*>(s.m);
  auto* v = static_cast<S*>(s.v);
  auto* w = reinterpret_cast<std::uint16_t*>(s.weight);
  const std::uint64_t stream = round_stream(s.key, k.step);
  parallel_pinned(threads, [&](int tid, int nt) {
    const Range r = thread_range(s.n, tid, nt);
    if (r.end <= r.begin) return;
    adamw_range<G, S, kWeight>(s.master + r.begin, m + r.begin, v + r.begin, g + r.begin,
                               kWeight != W::none ? w + r.begin : nullptr, r.end - r.begin, k, stream,
                               s.first + r.begin);
  });
}

template <typename G, typename S>
void adamw_typed(const AdamWSpan& s, const StepScalars& k, int threads) {
  if (!s.weight) adamw_team<G, S, W::none>(s, k, threads);
  else if (k.extrapolate != 0) adamw_team<G, S, W::predict>(s, k, threads);
  else adamw_team<G, S, W::plain>(s, k, threads);
}

// Below this many elements a parallel region costs more than it saves.
constexpr std::size_t kMinPerThread = 1 << 15;

int team_size(std::size_t n, int threads) {
  const int want = resolve_cpu_threads(threads);
  const std::size_t useful = (n + kMinPerThread - 1) / kMinPerThread;
  return static_cast<int>(std::max<std::size_t>(1, std::min<std::size_t>(want, useful)));
}

template <typename G>
double sumsq_range(const G* __restrict g, std::size_t n) {
  double acc = 0;
#pragma omp simd reduction(+ : acc)
  for (std::size_t i = 0; i < n; ++i) {
    const double x = static_cast<double>(load_grad(g, i));
    acc += x * x;
  }
  return acc;
}

template <typename G>
double sumsq_team(const G* g, std::size_t n, int threads) {
  const std::size_t blocks = (n + kSumsqBlock - 1) / kSumsqBlock;
  std::vector<double> partial(blocks, 0.0);
  // Blocks, not elements, are split between threads; each block's partial is computed by one
  // thread in a fixed order, so the in-order sum below is independent of the team size.
  parallel_pinned(team_size(n, threads), [&](int tid, int nt) {
    const Range r = thread_range(blocks, tid, nt, 1);
    for (std::size_t b = r.begin; b < r.end; ++b) {
      const std::size_t lo = b * kSumsqBlock;
      const std::size_t len = std::min(kSumsqBlock, n - lo);
      partial[b] = sumsq_range(g + lo, len);
    }
  });
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace

void adamw_cpu(const AdamWSpan& s, const StepScalars& k, int threads) {
  if (s.n == 0) return;
  GHT_EXPECTS(s.master && s.m && s.v && s.grad, "adamw_cpu: null master/m/v/grad pointer");
  const int nt = team_size(s.n, threads);
  const bool bf16_state = s.state == StateType::bf16;
  if (s.grad_type == GradType::bf16) {
    if (bf16_state) adamw_typed<std::uint16_t, std::uint16_t>(s, k, nt);
    else adamw_typed<std::uint16_t, float>(s, k, nt);
  } else {
    if (bf16_state) adamw_typed<float, std::uint16_t>(s, k, nt);
    else adamw_typed<float, float>(s, k, nt);
  }
}

double grad_sumsq_cpu(const void* grad, GradType t, std::size_t n, int threads) {
  if (n == 0) return 0.0;
  GHT_EXPECTS(grad != nullptr, "grad_sumsq_cpu: null gradient pointer");
  if (t == GradType::bf16) return sumsq_team(static_cast<const std::uint16_t*>(grad), n, threads);
  return sumsq_team(static_cast<const float*>(grad), n, threads);
}

}  // namespace ght::optimizer
