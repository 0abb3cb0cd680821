#pragma once
/**
 * @file statistics.hpp
 * @brief Usage counters per tier and per tensor class, and the statistics adaptor.
 */
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "alloc/adaptor.hpp"

namespace ght::alloc {

/// Bytes in use now, the most ever in use, bytes ever allocated, and allocations ever made.
struct Usage {
  std::uint64_t current = 0;
  std::uint64_t peak = 0;
  std::uint64_t total = 0;
  std::uint64_t count = 0;
};

/// Lock-free counters per tier, per class and overall. Peaks are exact per key: each key's peak
/// is the maximum of its own current value.
class usage_counters {
 public:
  void on_allocate(TierKind tier, TensorClass cls, std::uint64_t bytes) noexcept;
  void on_deallocate(TierKind tier, TensorClass cls, std::uint64_t bytes) noexcept;
  /// Take back an on_deallocate() whose free then failed (the block is still live).
  void undo_deallocate(TierKind tier, TensorClass cls, std::uint64_t bytes) noexcept;

  [[nodiscard]] Usage tier(TierKind t) const noexcept;
  [[nodiscard]] Usage cls(TensorClass c) const noexcept;
  [[nodiscard]] Usage all() const noexcept;
  /// One class on one tier (its peak is that cell's own peak).
  [[nodiscard]] Usage cell(TierKind t, TensorClass c) const noexcept;
  /// {"all": {...}, "tiers": {"hbm": {...}, ...}, "classes": {"weight": {...}, ...},
  /// "tier_classes": {"hbm": {"weight": {...}}, ...}}, each {"current", "peak", "total",
  /// "count"} in bytes and allocations; tier_classes lists only cells that were ever used.
  [[nodiscard]] std::string to_json() const;

 private:
  struct Counter {
    std::atomic<std::uint64_t> current{0}, peak{0}, total{0}, count{0};
    void add(std::uint64_t n) noexcept;
    void sub(std::uint64_t n) noexcept;
    [[nodiscard]] Usage load() const noexcept;
  };
  std::array<Counter, kNumTiers> tiers_;
  std::array<Counter, kNumTensorClasses> classes_;
  std::array<Counter, kNumTiers * kNumTensorClasses> cells_;
  Counter all_;
  static constexpr std::size_t cell_index(TierKind t, TensorClass c) noexcept {
    return static_cast<std::size_t>(t) * kNumTensorClasses + static_cast<std::size_t>(c);
  }
};

/// Counts what passes through to the upstream resource; only successful calls are counted.
class statistics_adaptor final : public adaptor_base {
 public:
  explicit statistics_adaptor(memory_resource& upstream);
  explicit statistics_adaptor(std::unique_ptr<memory_resource> upstream);

  [[nodiscard]] const usage_counters& counters() const noexcept { return counters_; }
  [[nodiscard]] Usage tier_usage(TierKind t) const noexcept { return counters_.tier(t); }
  [[nodiscard]] Usage class_usage(TensorClass c) const noexcept { return counters_.cls(c); }
  [[nodiscard]] Usage total_usage() const noexcept { return counters_.all(); }
  /// usage_counters::to_json() plus "resource": the upstream's name.
  [[nodiscard]] std::string to_json() const;
  [[nodiscard]] std::string_view name() const noexcept override { return name_; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_t stream,
                    TensorClass cls) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream_t stream,
                     TensorClass cls) override;

  std::string name_;
  usage_counters counters_;
};

}  // namespace ght::alloc
