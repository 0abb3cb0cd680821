#include "trainer/diloco.hpp"

#include <algorithm>
#include <array>
#include <cmath>

#include "optimizer/bf16.hpp"
#include "tier/error.hpp"

namespace ght::trainer {

namespace {

alloc::unique_block host_block(alloc::tiered_allocator& a, std::size_t n, TensorClass cls, const char* region) {
  alloc::unique_block b(a, n * sizeof(float), alloc::AllocRequest{cls, region, TierKind::host, /*may_spill=*/false});
  std::fill_n(b.as<float>(), n, 0.0f);
  return b;
}

}  // namespace

DilocoOuter::DilocoOuter(const DilocoConfig& cfg, std::size_t n, dist::Communicator& comm, alloc::tiered_allocator& a)
    : cfg_(cfg),
      n_(n),
      comm_(comm),
      global_(host_block(a, n, TensorClass::master, "diloco.global")),
      momentum_(host_block(a, n, TensorClass::other, "diloco.momentum")),
      local_(host_block(a, n, TensorClass::other, "diloco.pseudo_grad")) {
  GHT_EXPECTS(cfg.on(), "DilocoOuter: diloco.inner_steps must be > 0");
  GHT_EXPECTS(n > 0, "DilocoOuter: no parameters");
}

double DilocoOuter::step() {
  float* g = global_.as<float>();
  float* buf = momentum_.as<float>();
  float* d = local_.as<float>();
  const auto n = static_cast<std::ptrdiff_t>(n_);
  const bool bf16 = cfg_.bf16_pseudo_grads;
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t i = 0; i < n; ++i) {
    const float delta = g[i] - d[i];
    d[i] = bf16 ? optimizer::bf16_bits_to_float(optimizer::float_to_bf16_bits(delta)) : delta;
  }
  const auto t0 = std::chrono::steady_clock::now();
  comm_.allreduce_sum(d, n_);
  allreduce_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // fp32 throughout, as torch.optim.SGD(nesterov=True) on fp32 parameters.
  const auto ranks = static_cast<float>(comm_.size());
  const auto lr = static_cast<float>(cfg_.outer_lr), mu = static_cast<float>(cfg_.outer_momentum);
  // Σ Δ² in fixed chunks added in order: the logged norm does not depend on the thread count.
  constexpr std::ptrdiff_t kChunks = 64;
  std::array<double, kChunks> sq{};
  const std::ptrdiff_t per = (n + kChunks - 1) / kChunks;
#pragma omp parallel for schedule(static)
  for (std::ptrdiff_t c = 0; c < kChunks; ++c) {
    double s = 0;
    for (std::ptrdiff_t i = c * per; i < std::min(n, (c + 1) * per); ++i) {
      const float delta = d[i] / ranks;
      s += static_cast<double>(delta) * delta;
      buf[i] = mu * buf[i] + delta;
      g[i] -= lr * (delta + mu * buf[i]);
      d[i] = g[i];
    }
    sq[static_cast<std::size_t>(c)] = s;
  }
  double total = 0;
  for (double s : sq) total += s;
  return std::sqrt(total);
}

}  // namespace ght::trainer
