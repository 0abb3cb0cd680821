#pragma once
/**
 * @file managed.hpp
 * @brief managed: cudaMallocManaged with preferred-location and accessed-by advice.
 *
 * For the host tier the preferred location is the host NUMA node (or the host) and the GPU is
 * advised as an accessor, so its page-table entries map the pages without migrating them; for
 * the hbm tier the GPU is the preferred location. Selected for the host tier with
 * GHT_HOST_MEMORY=managed.
 *
 * In a build without CUDA the constructor throws ght::logic_error.
 */
#include <string>

#include "alloc/resource.hpp"

namespace ght::alloc {

struct ManagedOptions {
  int device = 0;                       ///< the GPU advised as accessor (or preferred location)
  TierKind preferred = TierKind::host;  ///< where the pages should live
  int numa_node = -1;                   ///< host preferred location's NUMA node; -1 = the host
};

class managed final : public memory_resource {
 public:
  /// @throws ght::logic_error without CUDA or for a bad device
  explicit managed(ManagedOptions options = {});

  [[nodiscard]] const ManagedOptions& options() const noexcept { return opts_; }
  [[nodiscard]] TierKind tier() const noexcept override { return opts_.preferred; }
  [[nodiscard]] std::string_view name() const noexcept override { return name_; }
  [[nodiscard]] bool host_accessible() const noexcept override { return true; }
  [[nodiscard]] std::uint64_t physical_free() const noexcept override;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_t stream,
                    TensorClass cls) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream_t stream,
                     TensorClass cls) override;

  ManagedOptions opts_;
  std::string name_;
};

}  // namespace ght::alloc
