#pragma once
/**
 * @file limit.hpp
 * @brief limit_adaptor: a byte budget in front of an upstream resource.
 */
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "alloc/adaptor.hpp"

namespace ght::alloc {

/// Refuses allocations that would take the bytes in use past the budget. The check and the
/// reservation are one atomic step, so concurrent callers never overshoot together.
class limit_adaptor final : public adaptor_base {
 public:
  limit_adaptor(memory_resource& upstream, std::uint64_t budget);
  limit_adaptor(std::unique_ptr<memory_resource> upstream, std::uint64_t budget);

  [[nodiscard]] std::uint64_t budget() const noexcept { return budget_.load(); }
  /// Change the budget; blocks already allocated stay, even if now over it.
  void set_budget(std::uint64_t budget) noexcept { budget_.store(budget); }
  [[nodiscard]] std::uint64_t used() const noexcept { return used_.load(); }
  [[nodiscard]] std::string_view name() const noexcept override { return name_; }
  /// The smaller of what the budget and the upstream still allow.
  [[nodiscard]] std::uint64_t physical_free() const noexcept override;

 private:
  /// @throws ght::out_of_memory naming the budget, the bytes in use and the request
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_t stream,
                    TensorClass cls) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream_t stream,
                     TensorClass cls) override;

  std::string name_;
  std::atomic<std::uint64_t> budget_;
  std::atomic<std::uint64_t> used_{0};
};

}  // namespace ght::alloc
