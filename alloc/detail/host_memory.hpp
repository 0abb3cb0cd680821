#pragma once
/**
 * @file host_memory.hpp
 * @brief Internals of the host resources: NUMA-bound anonymous mappings, parallel page touching,
 * a size-class pool for small blocks carved from such mappings, and a bounded cache of freed
 * large blocks.
 */
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <vector>

namespace ght::alloc::detail {

inline constexpr std::size_t kPageBytes = 4096;
inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

/// True when libnuma works here and `node` is a configured node with memory.
[[nodiscard]] bool numa_node_usable(int node) noexcept;
/// Bytes of a NUMA node that an allocation can get: free pages plus the node's clean, reclaimable
/// page cache (Active(file) + Inactive(file) - Dirty), as the kernel's MemAvailable counts them. A
/// machine that just built a project or read a dataset has most of its memory in page cache,
/// which MemFree alone would report as used. Whole machine (MemAvailable) when node < 0, when
/// there is one node, or when NUMA is unusable.
[[nodiscard]] std::uint64_t numa_node_free_bytes(int node) noexcept;

/// Length mapped for a request of `bytes`: page-rounded, 2 MiB-rounded from 4 MiB up so that
/// transparent huge pages can back the block.
[[nodiscard]] std::size_t mapped_length(std::size_t bytes) noexcept;

/// Set MPOL_PREFERRED for `node` on [p, p+len) (nothing when node < 0 or NUMA is unusable).
/// Returns 0, or the errno of the failed mbind.
[[nodiscard]] int bind_preferred(void* p, std::size_t len, int node) noexcept;

/**
 * @brief mmap anonymous memory of mapped_length(bytes), prefer NUMA node `node` (-1: no policy)
 * and, when `touch_threads` > 0, fault every page in with that many threads.
 * @param huge_pages map blocks of 4 MiB and more 2 MiB-aligned with MADV_HUGEPAGE: faulting,
 *        registering and GPU access (fewer translations) are cheaper, but touching one byte
 *        faults and zeroes a whole 2 MiB page, which costs where blocks are used sparsely
 * @throws ght::out_of_memory when the mapping fails with ENOMEM; ght::logic_error otherwise
 */
[[nodiscard]] void* map_host(std::size_t bytes, int node, int touch_threads, bool huge_pages);
/// Undo map_host(p, bytes, ...).
void unmap_host(void* p, std::size_t bytes) noexcept;
/// CPUs this process may run on (its affinity mask); at least 1.
[[nodiscard]] int usable_cpus() noexcept;
/**
 * @brief Call fn(begin, end) on `threads` contiguous slices of [0, n), each on its own
 * std::thread (the caller runs the first slice). Plain threads rather than OpenMP: the
 * allocator library loads into processes (PyTorch) that bring their own OpenMP runtime. A slice
 * whose thread cannot be started runs on the caller. fn must not throw.
 */
void parallel_slices(std::int64_t n, int threads,
                     const std::function<void(std::int64_t, std::int64_t)>& fn) noexcept;
/// Write one byte per page of [p, p+len) with up to `threads` threads (faults pages in
/// under the mapping's NUMA policy; the memory is already zero, so contents do not change).
void touch_pages(void* p, std::size_t len, int threads) noexcept;
/// Threads worth using to touch `len` bytes: about one per 64 MiB, at most `max_threads`.
[[nodiscard]] int touch_threads_for(std::size_t len, int max_threads) noexcept;

/**
 * @brief Power-of-two size classes from 16 B to 256 KiB carved from 4 MiB slabs.
 *
 * Small blocks would waste a page (and, for pinned memory, a cudaHostRegister call of tens of
 * microseconds) each; carving them from slabs that were mapped, bound and registered once keeps
 * small allocations at a mutex and a list pop. Slabs come from the owning resource and return to
 * it only when the pool is destroyed. One mutex per class keeps threads using different sizes
 * apart; a class run (64 KiB or 8 blocks, whichever is larger) is cut from the current slab.
 */
class small_block_pool {
 public:
  static constexpr std::size_t kMinClass = 16;
  static constexpr std::size_t kMaxClass = std::size_t{256} << 10;
  static constexpr std::size_t kSlabBytes = std::size_t{4} << 20;

  using slab_alloc_fn = std::function<void*(std::size_t)>;
  using slab_free_fn = std::function<void(void*, std::size_t)>;

  small_block_pool(slab_alloc_fn slab_alloc, slab_free_fn slab_free);
  ~small_block_pool();
  small_block_pool(const small_block_pool&) = delete;
  small_block_pool& operator=(const small_block_pool&) = delete;

  /// Whether (bytes, alignment) is served here rather than by a mapping of its own.
  [[nodiscard]] static bool handles(std::size_t bytes, std::size_t alignment) noexcept {
    return class_bytes(bytes, alignment) <= kMaxClass;
  }
  [[nodiscard]] void* allocate(std::size_t bytes, std::size_t alignment);
  void deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept;
  /// Bytes held in slabs.
  [[nodiscard]] std::size_t reserved_bytes() const;
  /// The slabs, for resources that map pointers back to registrations.
  [[nodiscard]] std::vector<std::pair<void*, std::size_t>> slabs() const;

 private:
  static constexpr int kNumClasses = 15;  // 2^4 .. 2^18
  [[nodiscard]] static std::size_t class_bytes(std::size_t bytes, std::size_t alignment) noexcept;
  [[nodiscard]] static int class_index(std::size_t cls) noexcept;
  /// A run of `bytes` from the current slab, mapping a new slab when it is used up.
  [[nodiscard]] char* take_run(std::size_t bytes);

  struct FreeBlock {
    FreeBlock* next;
  };
  struct alignas(64) SizeClass {
    std::mutex mu;
    FreeBlock* free = nullptr;
    char* cur = nullptr;  // unused part of this class's run
    char* end = nullptr;
  };
  std::array<SizeClass, kNumClasses> classes_;

  slab_alloc_fn slab_alloc_;
  slab_free_fn slab_free_;
  mutable std::mutex slab_mu_;
  std::vector<std::pair<void*, std::size_t>> slabs_;
  char* slab_cur_ = nullptr;
  char* slab_end_ = nullptr;
};

/// Settings of a large_block_cache (and of the host resources that own one).
struct HostCacheOptions {
  /// Most bytes that freed blocks may hold while cached; 0 turns the cache off (every large
  /// block is mapped and unmapped, as before the cache existed).
  std::size_t max_bytes = std::size_t{1} << 30;
  /// Blocks above this size are never cached, nor rounded to a size class: a multi-GiB buffer
  /// (optimizer state) is allocated once, and rounding it up would waste up to a fifth of it.
  std::size_t max_block_bytes = std::size_t{256} << 20;
  /// When the memory the resource draws from (its NUMA node) has less than this free, freed
  /// blocks go straight back to the OS and the cache is emptied.
  std::uint64_t min_free_bytes = std::uint64_t{2} << 30;
  /// Free memory is read (a /proc or /sys file) at most this often, when a block is freed.
  /// Zero reads it at every free (tests).
  std::chrono::milliseconds pressure_check_interval{50};
};

/// What a large_block_cache holds and has done. Live blocks are not counted here: the statistics
/// adaptor counts them; these bytes are mapped but free.
struct HostCacheStats {
  std::uint64_t cached_bytes = 0;   ///< bytes of free blocks held (mapped, bound, registered)
  std::uint64_t cached_blocks = 0;  ///< free blocks held
  std::uint64_t hits = 0;           ///< allocations served from the cache
  std::uint64_t misses = 0;         ///< cacheable allocations that mapped a new block
  std::uint64_t released_bytes = 0; ///< bytes handed back to the OS by the bound, trim or pressure
  std::uint64_t pressure_trims = 0; ///< times low free memory emptied the cache
};

/**
 * @brief Size-class cache of large host blocks (above small_block_pool::kMaxClass).
 *
 * Mapping, binding, faulting in and (for pinned memory) registering a block costs tens of
 * microseconds to milliseconds; glibc and the device pool avoid it by keeping freed memory. This
 * keeps freed blocks up to max_bytes, grouped by size class, and hands them back whole: a cached
 * block keeps its NUMA policy, its resident pages and its CUDA registration, so each is paid
 * once per block, not once per allocation. Its contents are not cleared.
 *
 * Classes are quarter steps between powers of two (2^k, 1.25·2^k, 1.5·2^k, 1.75·2^k), at least
 * 2 MiB apart from 4 MiB up so that classes match the huge-page rounding of mapped_length(): a
 * block wastes under a fifth of its size. Blocks above max_block_bytes are mapped exactly and
 * never cached.
 *
 * Bounded: a freed block that would take the cache over max_bytes evicts the least recently
 * freed blocks first. Under memory pressure (free memory of the source below min_free_bytes,
 * read at most every pressure_check_interval) the cache empties and frees bypass it; an
 * allocation that fails for lack of memory empties the cache and retries once. trim() empties
 * it on request. Mapping and unmapping happen outside the lock.
 */
class large_block_cache {
 public:
  /// Map a block of exactly this many bytes (a class size or an uncached request); may throw.
  using map_fn = std::function<void*(std::size_t)>;
  /// Unmap a block that map_fn returned for `bytes`; false when that failed (the block is gone).
  using unmap_fn = std::function<bool(void*, std::size_t)>;
  /// Bytes free in the memory the blocks come from.
  using free_bytes_fn = std::function<std::uint64_t()>;

  large_block_cache(HostCacheOptions opts, map_fn map, unmap_fn unmap, free_bytes_fn free_bytes);
  ~large_block_cache();
  large_block_cache(const large_block_cache&) = delete;
  large_block_cache& operator=(const large_block_cache&) = delete;

  /// Bytes mapped for a request of `bytes` when it is cacheable: its class size.
  [[nodiscard]] static std::size_t class_bytes(std::size_t bytes) noexcept;
  /// Whether a block of `bytes` goes through the cache (cache on and bytes <= max_block_bytes).
  [[nodiscard]] bool cacheable(std::size_t bytes) const noexcept {
    return opts_.max_bytes > 0 && bytes <= opts_.max_block_bytes;
  }

  /// A block of at least `bytes`, page-aligned. @throws what map_fn throws
  [[nodiscard]] void* allocate(std::size_t bytes);
  /// Return a block from allocate(bytes). False when unmapping some block failed.
  bool deallocate(void* p, std::size_t bytes);
  /// Release cached blocks until at most `keep_bytes` remain (oldest first); returns the bytes
  /// released.
  std::size_t trim(std::size_t keep_bytes = 0) noexcept;
  [[nodiscard]] HostCacheStats stats() const;
  /// stats().cached_bytes without taking the lock.
  [[nodiscard]] std::uint64_t cached_bytes() const noexcept {
    return cached_bytes_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] const HostCacheOptions& options() const noexcept { return opts_; }

 private:
  static constexpr int kMinLog = 18;  // classes start above 256 KiB (2^18)
  static constexpr int kNumClasses = (64 - kMinLog) * 4;
  [[nodiscard]] static int class_index(std::size_t cls) noexcept;

  struct Block {
    void* p;
    std::size_t bytes;  // class size
  };
  using lru_list = std::list<Block>;
  /// Move the oldest blocks out of the cache until at most `keep` bytes remain (lock held).
  void take_oldest_locked(std::size_t keep, std::vector<Block>& out);
  /// Unmap blocks taken from the cache (lock not held); false when one failed.
  bool release(const std::vector<Block>& blocks) noexcept;
  /// True when the source is short of memory; reads it at most every pressure_check_interval.
  bool under_pressure();

  HostCacheOptions opts_;
  map_fn map_;
  unmap_fn unmap_;
  free_bytes_fn free_bytes_;

  mutable std::mutex mu_;
  lru_list lru_;  // every cached block, least recently freed first
  // Per class, the cached blocks' positions in lru_, most recently freed last.
  std::array<std::deque<lru_list::iterator>, kNumClasses> by_class_;
  HostCacheStats stats_;
  std::atomic<std::uint64_t> cached_bytes_{0};  // stats_.cached_bytes, for lock-free readers

  std::atomic<std::int64_t> next_check_ns_{0};
  std::atomic<bool> pressure_{false};
};

}  // namespace ght::alloc::detail
