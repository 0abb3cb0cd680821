#pragma once
/**
 * @file pinned_host.hpp
 * @brief pinned_host: NUMA-bound host memory registered with CUDA as mapped (zero-copy).
 *
 * A large block is mmap'd, bound to the NUMA node, faulted in by several threads at once, then
 * registered (cudaHostRegisterMapped | cudaHostRegisterPortable). Where the device accesses
 * registered memory at the host address (cudaDevAttrCanUseHostPointerForRegisteredMem), a block
 * is registered in chunks from several threads, since slow pinned allocation is a known GH200
 * complaint and one cudaHostRegister call pins pages on a single thread. Blocks up to 256 KiB
 * come from registered 4 MiB slabs. Freed blocks up to 256 MiB stay registered in a bounded
 * cache (detail::large_block_cache, 1 GiB by default), so a block is registered once however
 * often it is reused.
 *
 * Without CUDA nothing is registered: the resource is NUMA-bound host memory whose
 * device_pointer() is the host pointer.
 */
#include <cstddef>
#include <map>
#include <shared_mutex>
#include <string>

#include "alloc/detail/host_memory.hpp"
#include "alloc/resource.hpp"

namespace ght::alloc {

struct PinnedHostOptions {
  int numa_node = -1;  ///< node whose memory is preferred; -1 leaves placement to the kernel
  int device = 0;      ///< CUDA device whose attributes decide chunked registration
  /// Register large blocks in chunks of this many bytes from parallel threads; 0 = one call.
  /// Off by default: the driver treats each registered chunk as its own allocation, so one
  /// cudaMemcpy or cudaMemset may not span two chunks (kernels may). The H200 run showed a
  /// memset across chunks failing; opt in only where every copy stays inside a chunk.
  std::size_t register_chunk_bytes = 0;
  int threads = 0;     ///< threads for touching and registering; 0 = the CPUs this process may use
  bool prefault = true;///< fault pages in (in parallel) before registering (CUDA builds only)
  bool huge_pages = true;  ///< transparent huge pages for blocks of 4 MiB and more
  detail::HostCacheOptions cache;  ///< freed large blocks kept registered (max_bytes 0: none)
};

class pinned_host final : public memory_resource {
 public:
  /**
   * @throws ght::logic_error for an unusable NUMA node
   * @throws ght::cuda_error when CUDA is built in but the device cannot be queried
   */
  explicit pinned_host(PinnedHostOptions options = {});

  /**
   * @brief The address a CUDA kernel uses for host pointer `p` (any address inside a block).
   * @throws ght::logic_error when `p` is not inside memory of this resource (only checked where
   * device and host addresses differ)
   */
  [[nodiscard]] void* device_pointer(const void* p) const;
  /// Whether blocks are registered with CUDA (false in builds without CUDA).
  [[nodiscard]] bool registered() const noexcept { return registered_; }
  /// Whether large blocks are registered in parallel chunks.
  [[nodiscard]] bool chunked_registration() const noexcept { return chunked_; }
  [[nodiscard]] int numa_node() const noexcept { return opts_.numa_node; }
  [[nodiscard]] const PinnedHostOptions& options() const noexcept { return opts_; }

  [[nodiscard]] TierKind tier() const noexcept override { return TierKind::host; }
  [[nodiscard]] std::string_view name() const noexcept override { return name_; }
  [[nodiscard]] std::size_t max_alignment() const noexcept override { return detail::kPageBytes; }
  [[nodiscard]] bool host_accessible() const noexcept override { return true; }
  [[nodiscard]] std::uint64_t physical_free() const noexcept override;
  [[nodiscard]] std::size_t pool_reserved_bytes() const { return small_.reserved_bytes(); }
  /// The large-block cache: bytes and blocks held free, hits, misses, bytes released.
  [[nodiscard]] detail::HostCacheStats cache_stats() const { return large_.stats(); }
  /// Unregister and unmap cached free blocks until at most `keep_bytes` remain; returns the
  /// bytes released.
  std::size_t trim(std::size_t keep_bytes = 0) noexcept { return large_.trim(keep_bytes); }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_t stream,
                    TensorClass cls) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream_t stream,
                     TensorClass cls) override;

  /// Map, bind, touch and register a block of mapped_length(bytes).
  void* map_registered(std::size_t bytes);
  /// Unregister and unmap; returns false when CUDA reported an error unregistering.
  bool unmap_registered(void* p, std::size_t bytes) noexcept;

  PinnedHostOptions opts_;
  std::string name_;
  bool registered_ = false;
  bool same_address_ = true;  // device address == host address for registered memory
  bool chunked_ = false;
  int threads_ = 1;
  // Registered ranges (base -> length), kept only where device and host addresses differ, so
  // device_pointer() can find the registration that contains an interior pointer.
  mutable std::shared_mutex ranges_mu_;
  std::map<std::uintptr_t, std::size_t> ranges_;
  // Last: their blocks are returned through the members above.
  detail::small_block_pool small_;
  detail::large_block_cache large_;
};

}  // namespace ght::alloc
