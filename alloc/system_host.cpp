#include "alloc/system_host.hpp"

#include "tier/error.hpp"

namespace ght::alloc {

namespace {
int checked_node(int node) {
  GHT_EXPECTS(node >= -1, "system_host: NUMA node " + std::to_string(node) + " is invalid");
  GHT_EXPECTS(node == -1 || detail::numa_node_usable(node),
              "system_host: NUMA node " + std::to_string(node) +
                  " does not exist, has no memory or is not allowed for this process");
  return node;
}
}  // namespace

system_host::system_host(int numa_node, bool huge_pages, detail::HostCacheOptions cache,
                         bool mimalloc_small_blocks)
    : node_(checked_node(numa_node)),
      huge_(huge_pages),
      name_(node_ >= 0 ? "system_host(node " + std::to_string(node_) + ")" : "system_host"),
      heap_(mimalloc_small_blocks ? detail::small_heap::for_node(node_) : nullptr),
      small_([node = node_](std::size_t n) { return detail::map_host(n, node, 0, true); },
             [](void* p, std::size_t n) { detail::unmap_host(p, n); }),
      // Pages are left to fault in lazily: they follow the mapping's NUMA policy when first
      // touched, and a block that is never fully used costs only what is touched.
      large_(cache,
             [node = node_, huge = huge_](std::size_t n) { return detail::map_host(n, node, 0, huge); },
             [](void* p, std::size_t n) {
               detail::unmap_host(p, n);
               return true;
             },
             [node = node_] { return detail::numa_node_free_bytes(node); }) {}

std::uint64_t system_host::physical_free() const noexcept {
  // Cached free blocks are this resource's to hand out (or to give back under pressure).
  return detail::numa_node_free_bytes(node_) + large_.cached_bytes();
}

void* system_host::do_allocate(std::size_t bytes, std::size_t alignment, stream_t, TensorClass) {
  if (heap_ != nullptr && detail::small_heap::handles(bytes, alignment)) {
    // nullptr when the node's arena is full: then the slab pool or the cache, by size.
    if (void* p = heap_->allocate(bytes, alignment)) return p;
  }
  if (detail::small_block_pool::handles(bytes, alignment)) return small_.allocate(bytes, alignment);
  return large_.allocate(bytes);
}

void system_host::do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream_t,
                                TensorClass) {
  if (heap_ != nullptr && heap_->owns(p)) {
    detail::small_heap::deallocate(p);
  } else if (detail::small_block_pool::handles(bytes, alignment)) {
    small_.deallocate(p, bytes, alignment);
  } else {
    (void)large_.deallocate(p, bytes);  // munmap of a range we mapped does not fail
  }
}

}  // namespace ght::alloc
