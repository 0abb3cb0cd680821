#pragma once
/**
 * @file adaptor.hpp
 * @brief adaptor_base: what every adaptor shares: an upstream resource, owned or borrowed, and
 * the queries forwarded to it.
 */
#include <memory>

#include "alloc/resource.hpp"

namespace ght::alloc {

class adaptor_base : public memory_resource {
 public:
  /// The resource calls are forwarded to.
  [[nodiscard]] memory_resource& upstream() const noexcept { return *upstream_; }

  [[nodiscard]] TierKind tier() const noexcept override { return upstream_->tier(); }
  [[nodiscard]] TierKind tier_of(const void* p) const noexcept override {
    return upstream_->tier_of(p);
  }
  [[nodiscard]] std::size_t max_alignment() const noexcept override {
    return upstream_->max_alignment();
  }
  [[nodiscard]] bool host_accessible() const noexcept override {
    return upstream_->host_accessible();
  }
  [[nodiscard]] std::uint64_t physical_free() const noexcept override {
    return upstream_->physical_free();
  }

 protected:
  /// Borrow `upstream`; it must outlive the adaptor.
  explicit adaptor_base(memory_resource& upstream) : upstream_(&upstream) {}
  /// Own `upstream`. @throws ght::logic_error if it is null
  explicit adaptor_base(std::unique_ptr<memory_resource> upstream);

 private:
  std::unique_ptr<memory_resource> owned_;
  memory_resource* upstream_;
};

}  // namespace ght::alloc
