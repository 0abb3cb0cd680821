#include "alloc/statistics.hpp"

#include "alloc/detail/usage_json.hpp"

namespace ght::alloc {

// Relaxed ordering: the counters are statistics, read as a snapshot; nothing is published
// through them.
void usage_counters::Counter::add(std::uint64_t n) noexcept {
  const std::uint64_t now = current.fetch_add(n, std::memory_order_relaxed) + n;
  std::uint64_t seen = peak.load(std::memory_order_relaxed);
  while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
  total.fetch_add(n, std::memory_order_relaxed);
  count.fetch_add(1, std::memory_order_relaxed);
}

void usage_counters::Counter::sub(std::uint64_t n) noexcept {
  current.fetch_sub(n, std::memory_order_relaxed);
}

Usage usage_counters::Counter::load() const noexcept {
  return {current.load(std::memory_order_relaxed), peak.load(std::memory_order_relaxed),
          total.load(std::memory_order_relaxed), count.load(std::memory_order_relaxed)};
}

void usage_counters::on_allocate(TierKind tier, TensorClass cls, std::uint64_t bytes) noexcept {
  tiers_[static_cast<std::size_t>(tier)].add(bytes);
  classes_[static_cast<std::size_t>(cls)].add(bytes);
  cells_[cell_index(tier, cls)].add(bytes);
  all_.add(bytes);
}

void usage_counters::on_deallocate(TierKind tier, TensorClass cls, std::uint64_t bytes) noexcept {
  tiers_[static_cast<std::size_t>(tier)].sub(bytes);
  classes_[static_cast<std::size_t>(cls)].sub(bytes);
  cells_[cell_index(tier, cls)].sub(bytes);
  all_.sub(bytes);
}

void usage_counters::undo_deallocate(TierKind tier, TensorClass cls, std::uint64_t bytes) noexcept {
  tiers_[static_cast<std::size_t>(tier)].current.fetch_add(bytes, std::memory_order_relaxed);
  classes_[static_cast<std::size_t>(cls)].current.fetch_add(bytes, std::memory_order_relaxed);
  cells_[cell_index(tier, cls)].current.fetch_add(bytes, std::memory_order_relaxed);
  all_.current.fetch_add(bytes, std::memory_order_relaxed);
}

Usage usage_counters::tier(TierKind t) const noexcept {
  return tiers_[static_cast<std::size_t>(t)].load();
}
Usage usage_counters::cls(TensorClass c) const noexcept {
  return classes_[static_cast<std::size_t>(c)].load();
}
Usage usage_counters::all() const noexcept { return all_.load(); }
Usage usage_counters::cell(TierKind t, TensorClass c) const noexcept {
  return cells_[cell_index(t, c)].load();
}

std::string usage_counters::to_json() const { return detail::counters_json(*this).dump(); }

namespace detail {
nlohmann::json usage_json(const Usage& u) {
  return {{"current", u.current}, {"peak", u.peak}, {"total", u.total}, {"count", u.count}};
}

nlohmann::json counters_json(const usage_counters& c) {
  nlohmann::json tiers = nlohmann::json::object();
  for (int t = 0; t < kNumTiers; ++t) {
    const auto tk = static_cast<TierKind>(t);
    tiers[std::string(to_string(tk))] = usage_json(c.tier(tk));
  }
  nlohmann::json classes = nlohmann::json::object();
  nlohmann::json cells = nlohmann::json::object();
  for (int k = 0; k < kNumTensorClasses; ++k) {
    const auto ck = static_cast<TensorClass>(k);
    classes[std::string(to_string(ck))] = usage_json(c.cls(ck));
    for (int t = 0; t < kNumTiers; ++t) {
      const auto tk = static_cast<TierKind>(t);
      const Usage u = c.cell(tk, ck);
      if (u.count > 0) cells[std::string(to_string(tk))][std::string(to_string(ck))] = usage_json(u);
    }
  }
  return {{"all", usage_json(c.all())}, {"tiers", tiers}, {"classes", classes}, {"tier_classes", cells}};
}
}  // namespace detail

statistics_adaptor::statistics_adaptor(memory_resource& upstream)
    : adaptor_base(upstream), name_("statistics(" + std::string(upstream.name()) + ")") {}

statistics_adaptor::statistics_adaptor(std::unique_ptr<memory_resource> upstream)
    : adaptor_base(std::move(upstream)),
      name_("statistics(" + std::string(this->upstream().name()) + ")") {}

std::string statistics_adaptor::to_json() const {
  nlohmann::json j = detail::counters_json(counters_);
  j["resource"] = std::string(upstream().name());
  return j.dump();
}

void* statistics_adaptor::do_allocate(std::size_t bytes, std::size_t alignment, stream_t stream,
                                      TensorClass cls) {
  void* p = upstream().allocate(bytes, alignment, stream, cls);
  counters_.on_allocate(upstream().tier_of(p), cls, bytes);
  return p;
}

void statistics_adaptor::do_deallocate(void* p, std::size_t bytes, std::size_t alignment,
                                       stream_t stream, TensorClass cls) {
  // Counted before the block is returned: once upstream has it, another thread may get it
  // again, and counting that allocation before this free would overstate the peak.
  const TierKind t = upstream().tier_of(p);
  counters_.on_deallocate(t, cls, bytes);
  try {
    upstream().deallocate(p, bytes, alignment, stream, cls);
  } catch (...) {
    counters_.undo_deallocate(t, cls, bytes);
    throw;
  }
}

}  // namespace ght::alloc
