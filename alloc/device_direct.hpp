#pragma once
/**
 * @file device_direct.hpp
 * @brief device_direct: cudaMalloc / cudaFree for every block, nothing cached.
 *
 * Slow, but compute-sanitizer (and cuda-memcheck style tools) see every block with its exact
 * bounds, which a pool hides. Select it with GHT_DEVICE_POOL=direct. cudaFree synchronises the
 * device, so the stream argument needs no further ordering.
 *
 * In a build without CUDA the constructor throws ght::logic_error.
 */
#include <string>

#include "alloc/resource.hpp"

namespace ght::alloc {

class device_direct final : public memory_resource {
 public:
  /// @throws ght::logic_error without CUDA or for a bad device
  explicit device_direct(int device = 0);

  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] TierKind tier() const noexcept override { return TierKind::hbm; }
  [[nodiscard]] std::string_view name() const noexcept override { return name_; }
  [[nodiscard]] bool host_accessible() const noexcept override { return false; }
  [[nodiscard]] std::uint64_t physical_free() const noexcept override;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_t stream,
                    TensorClass cls) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream_t stream,
                     TensorClass cls) override;

  int device_;
  std::string name_;
};

}  // namespace ght::alloc
