#pragma once
/**
 * @file device_pool.hpp
 * @brief device_pool: stream-ordered caching pool of HBM, a cudaMemPool_t of its own.
 *
 * Allocation is cudaMallocFromPoolAsync and free is cudaFreeAsync, both ordered on the caller's
 * stream. Reuse across streams is the CUDA pool's own stream-ordered semantics: a block freed on
 * stream A is handed to stream B only once the free has completed, or after the pool has made B
 * wait for A (event dependencies). tests/alloc/device_pool_test.cu checks that with a spin
 * kernel. We wrap CUDA's pool instead of writing our own: bench/alloc compares it with
 * cudaMallocAsync on the default pool and with cudaMalloc.
 *
 * Memory freed to the pool stays reserved up to the release threshold (default: all of it), so
 * steady-state allocation never returns to the driver; trim() gives it back.
 *
 * In a build without CUDA the constructor throws ght::logic_error.
 */
#include <cstdint>
#include <string>

#include "alloc/resource.hpp"

namespace ght::alloc {

struct DevicePoolOptions {
  int device = 0;
  /// Reserved bytes the pool keeps across synchronisations; above it, the driver releases
  /// memory at the next synchronize. UINT64_MAX keeps everything until trim().
  std::uint64_t release_threshold = UINT64_MAX;
};

/// Pool counters from cudaMemPoolGetAttribute.
struct PoolStats {
  std::uint64_t reserved = 0;       ///< bytes the pool holds from the driver
  std::uint64_t used = 0;           ///< bytes in live allocations
  std::uint64_t reserved_high = 0;  ///< high-water marks since creation or reset
  std::uint64_t used_high = 0;
};

class device_pool final : public memory_resource {
 public:
  /// @throws ght::logic_error without CUDA or for a bad device; ght::cuda_error from CUDA
  explicit device_pool(DevicePoolOptions options = {});
  ~device_pool() override;

  [[nodiscard]] PoolStats stats() const;
  /// Share of reserved memory not in live allocations: (reserved - used) / reserved, 0 when
  /// nothing is reserved. CUDA does not expose the largest free extent, so this is the cached
  /// but idle share that other users of the GPU cannot have.
  [[nodiscard]] double fragmentation() const;
  /// Return reserved memory above `keep_bytes` to the driver (cudaMemPoolTrimTo). Frees that
  /// have not completed on their streams are not released; synchronise them first.
  void trim(std::size_t keep_bytes = 0);
  [[nodiscard]] int device() const noexcept { return opts_.device; }
  /// The cudaMemPool_t, as an opaque pointer.
  [[nodiscard]] void* native_handle() const noexcept { return pool_; }

  [[nodiscard]] TierKind tier() const noexcept override { return TierKind::hbm; }
  [[nodiscard]] std::string_view name() const noexcept override { return name_; }
  [[nodiscard]] bool host_accessible() const noexcept override { return false; }
  /// Free HBM plus what the pool holds but does not use.
  [[nodiscard]] std::uint64_t physical_free() const noexcept override;

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_t stream,
                    TensorClass cls) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream_t stream,
                     TensorClass cls) override;

  DevicePoolOptions opts_;
  std::string name_;
  void* pool_ = nullptr;  // cudaMemPool_t
};

}  // namespace ght::alloc
