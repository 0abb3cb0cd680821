#pragma once
/**
 * @file system_host.hpp
 * @brief system_host: aligned host memory on a NUMA node, not registered with CUDA.
 *
 * Where the link is c2c (GH200) the GPU dereferences this memory directly; on a pcie link only
 * the CPU may use it. Blocks up to 128 KiB come from mimalloc, in an arena on the same node
 * (detail::small_heap, where mimalloc is available); the other blocks up to 256 KiB come from a
 * size-class pool carved from bound 4 MiB slabs. Larger blocks are mappings of their own. Freed
 * blocks up to 256 MiB stay mapped in a bounded cache (detail::large_block_cache, 1 GiB by
 * default) for reuse; larger ones, and any freed while the node is short of memory, go back to
 * the OS.
 */
#include <string>

#include "alloc/detail/host_memory.hpp"
#include "alloc/detail/small_heap.hpp"
#include "alloc/resource.hpp"

namespace ght::alloc {

class system_host final : public memory_resource {
 public:
  /**
   * @param numa_node node whose memory is preferred; -1 leaves placement to the kernel
   * @param huge_pages back blocks of 4 MiB and more with transparent huge pages (see
   *        detail::map_host); off suits blocks that are touched sparsely
   * @param cache the cache of freed large blocks (max_bytes = 0 turns it off)
   * @param mimalloc_small_blocks serve blocks up to detail::small_heap::kMaxBytes from mimalloc
   *        where the build has it; false keeps them in the slab pool
   * @throws ght::logic_error if numa_node names no usable node
   */
  explicit system_host(int numa_node = -1, bool huge_pages = true,
                       detail::HostCacheOptions cache = {}, bool mimalloc_small_blocks = true);

  [[nodiscard]] int numa_node() const noexcept { return node_; }
  [[nodiscard]] bool huge_pages() const noexcept { return huge_; }
  [[nodiscard]] TierKind tier() const noexcept override { return TierKind::host; }
  [[nodiscard]] std::string_view name() const noexcept override { return name_; }
  [[nodiscard]] std::size_t max_alignment() const noexcept override { return detail::kPageBytes; }
  [[nodiscard]] bool host_accessible() const noexcept override { return true; }
  [[nodiscard]] std::uint64_t physical_free() const noexcept override;
  /// Whether small blocks come from mimalloc (detail::small_heap) rather than the slab pool.
  [[nodiscard]] bool mimalloc_small_blocks() const noexcept { return heap_ != nullptr; }
  /// Whether `p` is a block from mimalloc.
  [[nodiscard]] bool from_mimalloc(const void* p) const noexcept {
    return heap_ != nullptr && heap_->owns(p);
  }
  /// Bytes held by the small-block pool's slabs.
  [[nodiscard]] std::size_t pool_reserved_bytes() const { return small_.reserved_bytes(); }
  /// The large-block cache: bytes and blocks held free, hits, misses, bytes released.
  [[nodiscard]] detail::HostCacheStats cache_stats() const { return large_.stats(); }
  /// Unmap cached free blocks until at most `keep_bytes` remain; returns the bytes released.
  std::size_t trim(std::size_t keep_bytes = 0) noexcept { return large_.trim(keep_bytes); }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_t stream,
                    TensorClass cls) override;
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream_t stream,
                     TensorClass cls) override;

  int node_;
  bool huge_;
  std::string name_;
  detail::small_heap* heap_;  // nullptr: no mimalloc; shared by the resources of this node
  detail::small_block_pool small_;
  detail::large_block_cache large_;
};

}  // namespace ght::alloc
