#include "trainer/diloco.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <string_view>

#include "optimizer/bf16.hpp"
#include "tier/error.hpp"

namespace ght::trainer {

namespace {

alloc::unique_block host_block(alloc::tiered_allocator& a, std::size_t n, TensorClass cls, const char* region) {
  alloc::unique_block b(a, n * sizeof(float), alloc::AllocRequest{cls, region, TierKind::host, /*may_spill=*/false});
  std::fill_n(b.as<float>(), n, 0.0f);
  return b;
}

// The bf16 wire buffer (bf16 pseudo-gradients only): n values, 2 bytes each.
alloc::unique_block wire_block(alloc::tiered_allocator& a, std::size_t n, bool bf16) {
  if (!bf16) return {};
  return alloc::unique_block(a, n * sizeof(optimizer::bf16),
                             alloc::AllocRequest{TensorClass::other, "diloco.pseudo_grad_bf16", TierKind::host, false});
}

// One element of the outer step, fp32 as torch.optim.SGD(nesterov=True): Δ (averaged) into the
// momentum buffer, then θ_global. Returns Δ for the norm.
float nesterov(float sum, float ranks, float lr, float mu, float& buf, float& g) {
  const float delta = sum / ranks;
  buf = mu * buf + delta;
  g -= lr * (delta + mu * buf);
  return delta;
}

// The tensor's unit: 0 the embedding, 1 + l layer l, `last` the rest.
std::size_t unit_of(const std::string& name, std::size_t last) {
  if (name == "model.embed_tokens.weight") return 0;
  constexpr std::string_view pre = "model.layers.";
  if (name.rfind(pre, 0) != 0) return last;
  return 1 + std::stoul(name.substr(pre.size(), name.find('.', pre.size()) - pre.size()));
}

}  // namespace

DilocoOuter::DilocoOuter(const DilocoConfig& cfg, std::size_t n, dist::Communicator& comm, alloc::tiered_allocator& a)
    : cfg_(cfg),
      n_(n),
      comm_(comm),
      alloc_(a),
      global_(host_block(a, n, TensorClass::master, "diloco.global")),
      momentum_(host_block(a, n, TensorClass::other, "diloco.momentum")),
      local_(host_block(a, n, TensorClass::other, "diloco.pseudo_grad")),
      wire_(wire_block(a, n, cfg.bf16_pseudo_grads)) {
  GHT_EXPECTS(cfg.on(), "DilocoOuter: diloco.inner_steps must be > 0");
  GHT_EXPECTS(n > 0, "DilocoOuter: no parameters");
}

std::size_t DilocoOuter::wire_bytes(std::size_t n) const noexcept {
  return n * (cfg_.bf16_pseudo_grads ? sizeof(optimizer::bf16) : sizeof(float));
}

double DilocoOuter::step() {
  float* g = global_.as<float>();
  float* buf = momentum_.as<float>();
  float* d = local_.as<float>();
  const auto n = static_cast<std::ptrdiff_t>(n_);
  const bool bf16 = cfg_.bf16_pseudo_grads;
  optimizer::bf16* w = bf16 ? wire_.as<optimizer::bf16>() : nullptr;
  if (bf16) {
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t i = 0; i < n; ++i) w[i] = optimizer::to_bf16(g[i] - d[i]);
  } else {
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t i = 0; i < n; ++i) d[i] = g[i] - d[i];
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (bf16) {
    comm_.allreduce_sum(w, n_);
  } else {
    comm_.allreduce_sum(d, n_);
  }
  allreduce_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  allreduce_bytes_ = wire_bytes(n_);
  if (bf16) {
#pragma omp parallel for schedule(static)
    for (std::ptrdiff_t i = 0; i < n; ++i) d[i] = optimizer::to_float(w[i]);
  }
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
      const float delta = nesterov(d[i], ranks, lr, mu, buf[i], g[i]);
      s += static_cast<double>(delta) * delta;
      d[i] = g[i];
    }
    sq[static_cast<std::size_t>(c)] = s;
  }
  double total = 0;
  for (double s : sq) total += s;
  return std::sqrt(total);
}

std::vector<std::vector<std::size_t>> diloco_fragment_tensors(const std::vector<NamedTensor>& tensors, int fragments) {
  GHT_EXPECTS(fragments >= 1, "diloco.fragments must be >= 1, got " + std::to_string(fragments));
  std::size_t layers = 0;
  for (const NamedTensor& t : tensors) {
    const std::size_t u = unit_of(t.name, 0);
    if (u > 0) layers = std::max(layers, u);  // 1 + the highest layer index
  }
  const std::size_t units = layers + 2;  // the embedding, the layers, the rest
  GHT_EXPECTS(static_cast<std::size_t>(fragments) <= units,
              "diloco.fragments=" + std::to_string(fragments) + ": the model has only " + std::to_string(units) +
                  " units (the embedding, " + std::to_string(layers) + " layers, the final norm) to deal out");
  std::vector<std::vector<std::size_t>> out(static_cast<std::size_t>(fragments));
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    out[unit_of(tensors[t].name, units - 1) % static_cast<std::size_t>(fragments)].push_back(t);
  }
  return out;
}

void DilocoOuter::set_fragments(std::vector<std::vector<dist::Range>> fragments) {
  GHT_EXPECTS(!pending_, "DilocoOuter::set_fragments while a fragment is in flight");
  std::size_t largest = 0;
  for (const auto& f : fragments) {
    std::size_t n = 0;
    for (const dist::Range& r : f) {
      GHT_EXPECTS(r.end <= n_ && r.begin <= r.end, "DilocoOuter: a fragment range outside the parameters");
      n += r.size();
    }
    largest = std::max(largest, n);
  }
  fragments_ = std::move(fragments);
  send_ = alloc::unique_block(alloc_, std::max<std::size_t>(largest, 1) * sizeof(float),
                              alloc::AllocRequest{TensorClass::other, "diloco.fragment_send", TierKind::host, false});
}

std::size_t DilocoOuter::fragment_size(std::size_t p) const {
  GHT_EXPECTS(p < fragments_.size(), "DilocoOuter: no fragment " + std::to_string(p));
  std::size_t n = 0;
  for (const dist::Range& r : fragments_[p]) n += r.size();
  return n;
}

OuterDue DilocoOuter::due_streaming(std::int64_t step, std::int64_t last_step) const {
  OuterDue d;
  if (pending_ && (step == sent_at_ + cfg_.overlap_steps || step == last_step)) d.apply = pending_;
  if (step == last_step) {
    d.full = true;
    return d;
  }
  const auto P = static_cast<std::int64_t>(fragments_.size());
  const std::int64_t spacing = cfg_.inner_steps / P;
  for (std::int64_t p = 0; p < P; ++p) {
    const std::int64_t first = spacing * (p + 1);
    if (step >= first && (step - first) % cfg_.inner_steps == 0) d.send = static_cast<std::size_t>(p);
  }
  // τ = 0: the fragment sent now is applied now.
  if (d.send && cfg_.overlap_steps == 0) d.apply = d.send;
  return d;
}

void DilocoOuter::send(std::size_t p, std::int64_t step) {
  GHT_EXPECTS(!pending_, "DilocoOuter::send: fragment " + std::to_string(*pending_) + " is still in flight");
  const std::size_t n = fragment_size(p);
  const float* g = global_.as<float>();
  const float* l = local_.as<float>();
  std::size_t k = 0;
  if (cfg_.bf16_pseudo_grads) {
    optimizer::bf16* w = wire_.as<optimizer::bf16>();
    for (const dist::Range& r : fragments_[p]) {
      for (std::size_t i = r.begin; i < r.end; ++i) w[k++] = optimizer::to_bf16(g[i] - l[i]);
    }
    comm_.start_allreduce_sum(w, n);
  } else {
    float* d = send_.as<float>();
    for (const dist::Range& r : fragments_[p]) {
      for (std::size_t i = r.begin; i < r.end; ++i) d[k++] = g[i] - l[i];
    }
    comm_.start_allreduce_sum(d, n);
  }
  pending_ = p;
  sent_at_ = step;
  summed_ = false;
}

std::span<const float> DilocoOuter::settle() {
  if (!pending_) return {};
  const std::size_t n = fragment_size(*pending_);
  if (!summed_) {
    comm_.wait_allreduce();
    if (cfg_.bf16_pseudo_grads) {  // the sum widens exactly: a checkpoint holds the bf16 values
      const optimizer::bf16* w = wire_.as<optimizer::bf16>();
      std::transform(w, w + n, send_.as<float>(), [](optimizer::bf16 b) { return optimizer::to_float(b); });
    }
    summed_ = true;
  }
  return {send_.as<float>(), n};
}

void DilocoOuter::restore_pending(std::size_t p, std::int64_t sent_at, std::span<const float> sum) {
  GHT_EXPECTS(sum.size() == fragment_size(p), "DilocoOuter::restore_pending: " + std::to_string(sum.size()) +
                                                  " values for fragment " + std::to_string(p) + " of " +
                                                  std::to_string(fragment_size(p)));
  std::copy(sum.begin(), sum.end(), send_.as<float>());
  pending_ = p;
  sent_at_ = sent_at;
  summed_ = true;
}

double DilocoOuter::apply(std::size_t p) {
  GHT_EXPECTS(pending_ && *pending_ == p, "DilocoOuter::apply: fragment " + std::to_string(p) + " was not sent");
  const auto t0 = std::chrono::steady_clock::now();
  (void)settle();
  allreduce_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  allreduce_bytes_ = wire_bytes(fragment_size(p));
  float* g = global_.as<float>();
  float* buf = momentum_.as<float>();
  float* l = local_.as<float>();
  const float* d = send_.as<float>();
  const auto ranks = static_cast<float>(comm_.size());
  const auto lr = static_cast<float>(cfg_.outer_lr), mu = static_cast<float>(cfg_.outer_momentum);
  const auto alpha = static_cast<float>(cfg_.mix);
  double sq = 0;  // in element order: the logged norm is the same on every rank and run
  std::size_t k = 0;
  for (const dist::Range& r : fragments_[p]) {
    for (std::size_t i = r.begin; i < r.end; ++i) {
      const float delta = nesterov(d[k++], ranks, lr, mu, buf[i], g[i]);
      sq += static_cast<double>(delta) * delta;
      l[i] = alpha == 0 ? g[i] : alpha * l[i] + (1 - alpha) * g[i];
    }
  }
  pending_.reset();
  summed_ = false;
  return std::sqrt(sq);
}

}  // namespace ght::trainer
