#pragma once
/**
 * @file small_heap.hpp
 * @brief Small host blocks from mimalloc, in an arena of ghtier's own on one NUMA node.
 *
 * A mix of small and large host allocations from many threads needs what a general-purpose
 * allocator does well: per-thread free lists, no lock on the fast path, blocks freed on another
 * thread returned without contention. Rather than grow an allocator of our own, system_host
 * hands blocks up to kMaxBytes to mimalloc: when the build found its header (GHT_HAVE_MIMALLOC)
 * and libmimalloc.so.2 loads at run time. It is opened with RTLD_LOCAL, not linked, because
 * Debian's build also exports malloc and free and would otherwise replace malloc process-wide.
 *
 * Placement: one exclusive mimalloc arena per NUMA node, over memory this file maps (1 GiB of
 * address space, 32 MiB-aligned as mimalloc's segments need) with the same MPOL_PREFERRED policy
 * as the other host blocks, so pages fault in on the node. Each thread allocates through a
 * mimalloc heap of its own bound to that arena (mimalloc heaps are single-threaded; any thread
 * may free). The arena is committed and never decommitted: pages stay resident once touched, as
 * the slabs of detail::small_block_pool did, and are never remapped (a remap would drop the NUMA
 * policy). Arenas live as long as the process (mimalloc cannot remove one) and are shared by
 * every resource on their node.
 *
 * When the arena is full, or mimalloc is absent, allocate() returns nullptr and the caller uses
 * its own path (the slab pool, the large-block cache). Budgets and statistics are unaffected:
 * the adaptors above the resource count the requested bytes.
 *
 * Pinned memory never comes from here: pinned_host keeps its registered slabs, so every block of
 * a pinned resource is page-locked and has a device address.
 */
#include <cstddef>

namespace ght::alloc::detail {

class small_heap {
 public:
  /// Largest block served here, counting the alignment: blocks that mimalloc keeps in pages
  /// shared with other blocks of their size. mimalloc 2.0.9 gives each block above 128 KiB (with
  /// an aligned request's padding) a page of its own; a thread that allocates and frees one such
  /// block again and again measured 1.4-1.9 us a pair (the page, and with it the segment, is
  /// released and set up again) against 60 ns from the slab pool (bench/alloc, host_pair 128KiB).
  /// Larger blocks take the slab pool (to 256 KiB) and the large-block cache, as before.
  static constexpr std::size_t kMaxBytes = std::size_t{128} << 10;
  /// Address space of one node's arena: 32 segments of 32 MiB, at least one per thread that
  /// allocates small blocks. Only touched pages use memory.
  static constexpr std::size_t kArenaBytes = std::size_t{1} << 30;
  /// Largest alignment served here (system_host's max_alignment()).
  static constexpr std::size_t kMaxAlignment = 4096;

  /// Whether small blocks can come from mimalloc here (built with it, and the library loads).
  [[nodiscard]] static bool available() noexcept;
  /// The heap of NUMA node `node` (-1: no policy), created on first use; nullptr when mimalloc is
  /// absent or the arena could not be set up (no address space, mimalloc's 64 arenas taken).
  [[nodiscard]] static small_heap* for_node(int node) noexcept;
  /// Whether (bytes, alignment) may be served here: mimalloc pads an aligned request of more
  /// than 1 KiB by the alignment, so bytes + alignment must fit kMaxBytes.
  [[nodiscard]] static bool handles(std::size_t bytes, std::size_t alignment) noexcept {
    return alignment <= kMaxAlignment && bytes <= kMaxBytes - alignment;
  }

  /// A block of `bytes` aligned to `alignment`, or nullptr when the arena is full.
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment) noexcept;
  /// Return a block from allocate(); any thread may.
  static void deallocate(void* p) noexcept;
  /// Whether `p` lies in this heap's arena.
  [[nodiscard]] bool owns(const void* p) const noexcept {
    const auto* c = static_cast<const char*>(p);
    return c >= base_ && c < base_ + bytes_;
  }
  [[nodiscard]] int numa_node() const noexcept { return node_; }

  small_heap(const small_heap&) = delete;
  small_heap& operator=(const small_heap&) = delete;

 private:
  small_heap(int node, int slot, char* base, std::size_t bytes, int arena_id) noexcept
      : node_(node), slot_(slot), base_(base), bytes_(bytes), arena_id_(arena_id) {}

  int node_;
  int slot_;  // index of this heap in the per-thread table of mimalloc heaps
  char* base_;
  std::size_t bytes_;
  int arena_id_;  // mi_arena_id_t
};

}  // namespace ght::alloc::detail
