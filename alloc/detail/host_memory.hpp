#pragma once
/**
 * @file host_memory.hpp
 * @brief Internals of the host resources: NUMA-bound anonymous mappings, parallel page touching,
 * and a size-class pool for small blocks carved from such mappings.
 */
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
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

}  // namespace ght::alloc::detail
