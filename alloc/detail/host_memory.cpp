#include "alloc/detail/host_memory.hpp"

#include <numa.h>
#include <numaif.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "alloc/resource.hpp"
#include "tier/config.hpp"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
// Free small blocks are poisoned, so AddressSanitizer reports a use after free inside the pool
// as it would for malloc'd memory.
#define GHT_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define GHT_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define GHT_POISON(p, n) ((void)(p), (void)(n))
#define GHT_UNPOISON(p, n) ((void)(p), (void)(n))
#endif
#include "tier/detail/topology_detail.hpp"
#include "tier/error.hpp"

namespace ght::alloc::detail {

bool numa_node_usable(int node) noexcept {
  if (node < 0 || numa_available() < 0 || node > numa_max_node()) return false;
  bitmask* allowed = numa_get_mems_allowed();
  const bool ok = allowed != nullptr && numa_bitmask_isbitset(allowed, static_cast<unsigned>(node));
  if (allowed != nullptr) numa_bitmask_free(allowed);
  return ok && numa_node_size64(node, nullptr) > 0;
}

std::uint64_t numa_node_free_bytes(int node) noexcept {
  try {
    // One node: the system's MemAvailable. In VMs with hot-plugged memory the node's own meminfo
    // can list a fraction of the machine (the H200 VM: 21 GiB of 126 GiB), as tier/topology notes.
    const bool one_node = numa_available() < 0 || numa_max_node() == 0;
    if (node >= 0 && !one_node && node <= numa_max_node()) {
      const std::string text =
          tier::detail::read_text_file("/sys/devices/system/node/node" + std::to_string(node) + "/meminfo");
      const std::string pre = "Node " + std::to_string(node) + " ";
      const std::uint64_t free_b = tier::detail::meminfo_bytes(text, pre + "MemFree");
      if (free_b > 0) {
        const std::uint64_t file = tier::detail::meminfo_bytes(text, pre + "Active(file)") +
                                   tier::detail::meminfo_bytes(text, pre + "Inactive(file)");
        const std::uint64_t dirty = tier::detail::meminfo_bytes(text, pre + "Dirty");
        return free_b + (file > dirty ? file - dirty : 0);
      }
      long long free_bytes = 0;
      if (numa_node_size64(node, &free_bytes) > 0 && free_bytes >= 0) {
        return static_cast<std::uint64_t>(free_bytes);
      }
    }
    const std::string meminfo = tier::detail::read_text_file("/proc/meminfo");
    const std::uint64_t avail = tier::detail::meminfo_bytes(meminfo, "MemAvailable");
    if (avail > 0) return avail;
  } catch (...) {  // out of memory while reading: fall back to the free-page count
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page)
                               : UINT64_MAX;
}

std::size_t mapped_length(std::size_t bytes) noexcept {
  return bytes >= 2 * kHugePageBytes ? align_up(bytes, kHugePageBytes)
                                     : align_up(bytes, kPageBytes);
}

int touch_threads_for(std::size_t len, int max_threads) noexcept {
  const auto by_size = static_cast<int>(len / (std::size_t{64} << 20));
  return std::clamp(by_size, 1, std::max(1, max_threads));
}

int usable_cpus() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

void parallel_slices(std::int64_t n, int threads,
                     const std::function<void(std::int64_t, std::int64_t)>& fn) noexcept {
  const std::int64_t t = std::clamp<std::int64_t>(threads, 1, std::max<std::int64_t>(n, 1));
  auto slice = [&](std::int64_t k) { fn(n * k / t, n * (k + 1) / t); };
  std::vector<std::thread> workers;
  std::int64_t started = 1;
  try {
    workers.reserve(static_cast<std::size_t>(t - 1));
    for (; started < t; ++started) workers.emplace_back(slice, started);
  } catch (...) {  // no thread (or no memory for one): the caller takes the remaining slices
  }
  slice(0);
  for (std::int64_t k = started; k < t; ++k) slice(k);
  for (std::thread& w : workers) w.join();
}

void touch_pages(void* p, std::size_t len, int threads) noexcept {
  auto* base = static_cast<volatile char*>(p);
  const auto pages = static_cast<std::int64_t>(len / kPageBytes);
  parallel_slices(pages, threads, [base](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t i = lo; i < hi; ++i) base[i * static_cast<std::int64_t>(kPageBytes)] = 0;
  });
}

int bind_preferred(void* p, std::size_t len, int node) noexcept {
  if (node < 0 || numa_available() < 0 || node > numa_max_node()) return 0;
  // Preferred rather than strict binding: with MPOL_BIND an exhausted node ends in the OOM
  // killer at fault time instead of an error; budgets keep usage within the node anyway.
  constexpr std::size_t kBits = 8 * sizeof(unsigned long);
  const unsigned long maxnode = static_cast<unsigned long>(numa_max_node()) + 2;
  try {
    std::vector<unsigned long> mask((maxnode + kBits - 1) / kBits, 0UL);
    mask[static_cast<std::size_t>(node) / kBits] |= 1UL << (static_cast<std::size_t>(node) % kBits);
    return mbind(p, len, MPOL_PREFERRED, mask.data(), maxnode, 0) == 0 ? 0 : errno;
  } catch (const std::bad_alloc&) {
    return ENOMEM;
  }
}

void* map_host(std::size_t bytes, int node, int touch_threads, bool huge_pages) {
  const std::size_t len = mapped_length(bytes);
  // Huge-page-sized blocks are mapped 2 MiB-aligned (over-map, then trim) so THP can back them:
  // faulting, touching and registering 2 MiB pages is far cheaper than 4 KiB ones.
  const bool huge = huge_pages && len >= 2 * kHugePageBytes;
  const std::size_t map_len = huge ? len + kHugePageBytes : len;
  void* raw = mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    const int err = errno;
    if (err == ENOMEM) {
      throw ght::out_of_memory("host mmap of " + config::format_bytes(len) + " failed: " +
                               std::strerror(err));
    }
    GHT_FAIL("host mmap of " + std::to_string(len) + " bytes failed: " + std::strerror(err));
  }
  char* p = static_cast<char*>(raw);
  if (huge) {
    char* aligned = reinterpret_cast<char*>(
        align_up(reinterpret_cast<std::uintptr_t>(p), kHugePageBytes));
    const std::size_t head = static_cast<std::size_t>(aligned - p);
    if (head > 0) munmap(p, head);
    const std::size_t tail = map_len - head - len;
    if (tail > 0) munmap(aligned + len, tail);
    p = aligned;
    (void)madvise(p, len, MADV_HUGEPAGE);  // advisory: fails harmlessly where THP is off
  }
  if (const int err = bind_preferred(p, len, node); err != 0) {
    munmap(p, len);
    GHT_FAIL("mbind of " + std::to_string(len) + " bytes to NUMA node " + std::to_string(node) +
             " failed: " + std::strerror(err));
  }
  if (touch_threads > 0) touch_pages(p, len, touch_threads);
  return p;
}

void unmap_host(void* p, std::size_t bytes) noexcept {
  if (p != nullptr) munmap(p, mapped_length(bytes));
}

// ---- small_block_pool -------------------------------------------------------------------------

small_block_pool::small_block_pool(slab_alloc_fn slab_alloc, slab_free_fn slab_free)
    : slab_alloc_(std::move(slab_alloc)), slab_free_(std::move(slab_free)) {}

small_block_pool::~small_block_pool() {
  for (auto& [p, n] : slabs_) {
    GHT_UNPOISON(p, n);  // the address range may be mapped again for something else
    slab_free_(p, n);
  }
}

std::size_t small_block_pool::class_bytes(std::size_t bytes, std::size_t alignment) noexcept {
  return std::max({std::bit_ceil(bytes), alignment, kMinClass});
}

int small_block_pool::class_index(std::size_t cls) noexcept {
  return std::countr_zero(cls) - std::countr_zero(kMinClass);
}

char* small_block_pool::take_run(std::size_t bytes) {
  std::lock_guard lock(slab_mu_);
  if (slab_cur_ == nullptr || static_cast<std::size_t>(slab_end_ - slab_cur_) < bytes) {
    // The tail of the old slab (smaller than any run) is abandoned: runs are 64 KiB-aligned
    // multiples, so at most one run's worth per slab is lost.
    char* slab = static_cast<char*>(slab_alloc_(kSlabBytes));
    slabs_.emplace_back(slab, kSlabBytes);
    slab_cur_ = slab;
    slab_end_ = slab + kSlabBytes;
  }
  char* run = slab_cur_;
  slab_cur_ += bytes;
  return run;
}

void* small_block_pool::allocate(std::size_t bytes, std::size_t alignment) {
  const std::size_t cls = class_bytes(bytes, alignment);
  SizeClass& c = classes_[static_cast<std::size_t>(class_index(cls))];
  std::lock_guard lock(c.mu);
  if (c.free != nullptr) {
    FreeBlock* b = c.free;
    GHT_UNPOISON(b, cls);
    c.free = b->next;
    return b;
  }
  if (c.cur == c.end) {
    const std::size_t run = std::max(std::size_t{64} << 10, 8 * cls);
    c.cur = take_run(run);
    c.end = c.cur + run;
  }
  void* p = c.cur;
  c.cur += cls;
  return p;
}

void small_block_pool::deallocate(void* p, std::size_t bytes, std::size_t alignment) noexcept {
  const std::size_t cls = class_bytes(bytes, alignment);
  SizeClass& c = classes_[static_cast<std::size_t>(class_index(cls))];
  auto* b = static_cast<FreeBlock*>(p);
  std::lock_guard lock(c.mu);
  b->next = c.free;
  c.free = b;
  GHT_POISON(b, cls);
}

std::size_t small_block_pool::reserved_bytes() const {
  std::lock_guard lock(slab_mu_);
  return slabs_.size() * kSlabBytes;
}

std::vector<std::pair<void*, std::size_t>> small_block_pool::slabs() const {
  std::lock_guard lock(slab_mu_);
  return slabs_;
}

// ---- large_block_cache -------------------------------------------------------------------------

large_block_cache::large_block_cache(HostCacheOptions opts, map_fn map, unmap_fn unmap,
                                     free_bytes_fn free_bytes)
    : opts_(opts), map_(std::move(map)), unmap_(std::move(unmap)), free_bytes_(std::move(free_bytes)) {
  // A block larger than the whole cache could never be kept; mapping it exactly wastes nothing.
  opts_.max_block_bytes = std::min(opts_.max_block_bytes, opts_.max_bytes);
}

large_block_cache::~large_block_cache() { (void)trim(0); }

std::size_t large_block_cache::class_bytes(std::size_t bytes) noexcept {
  // Small blocks come from small_block_pool; any that reach here share the first class.
  if (bytes <= std::size_t{1} << kMinLog) return std::size_t{1} << kMinLog;
  const std::size_t pow = std::bit_floor(bytes);
  // From 4 MiB up mapped_length() rounds to 2 MiB, so finer classes would map the same length.
  const std::size_t step = pow >= 2 * kHugePageBytes ? std::max(pow / 4, kHugePageBytes) : pow / 4;
  return align_up(bytes, step);
}

int large_block_cache::class_index(std::size_t cls) noexcept {
  const int k = std::bit_width(cls) - 1;
  return (k - kMinLog) * 4 + static_cast<int>((cls >> (k - 2)) & 3);
}

void* large_block_cache::allocate(std::size_t bytes) {
  if (!cacheable(bytes)) return map_(bytes);
  const std::size_t cls = class_bytes(bytes);
  {
    std::lock_guard lock(mu_);
    auto& list = by_class_[static_cast<std::size_t>(class_index(cls))];
    if (!list.empty()) {
      const auto it = list.back();  // the most recently freed: likeliest still in cache and TLB
      list.pop_back();
      void* p = it->p;
      lru_.erase(it);
      stats_.cached_bytes -= cls;
      cached_bytes_.store(stats_.cached_bytes, std::memory_order_relaxed);
      --stats_.cached_blocks;
      ++stats_.hits;
      GHT_UNPOISON(p, cls);
      return p;
    }
    ++stats_.misses;
  }
  try {
    return map_(cls);
  } catch (const ght::out_of_memory&) {
    // Memory held here may be what is missing: give it back and try once more.
    if (trim(0) == 0) throw;
  }
  return map_(cls);
}

bool large_block_cache::deallocate(void* p, std::size_t bytes) {
  if (p == nullptr) return true;
  if (!cacheable(bytes)) return unmap_(p, bytes);
  const std::size_t cls = class_bytes(bytes);
  const bool pressure = under_pressure();
  std::vector<Block> out;
  bool cached = false;
  {
    std::lock_guard lock(mu_);
    // Room for every block that may leave, so nothing below throws with blocks half moved.
    out.reserve(stats_.cached_blocks + 1);
    if (pressure) {
      take_oldest_locked(0, out);
      if (!out.empty()) ++stats_.pressure_trims;
    } else {
      take_oldest_locked(opts_.max_bytes - cls, out);  // cls <= max_block_bytes <= max_bytes
      try {
        const auto it = lru_.insert(lru_.end(), Block{p, cls});
        try {
          by_class_[static_cast<std::size_t>(class_index(cls))].push_back(it);
        } catch (...) {
          lru_.erase(it);
          throw;
        }
        stats_.cached_bytes += cls;
        cached_bytes_.store(stats_.cached_bytes, std::memory_order_relaxed);
        ++stats_.cached_blocks;
        GHT_POISON(p, cls);
        cached = true;
      } catch (const std::bad_alloc&) {  // no memory to note the block: release it instead
      }
    }
    if (!cached) {
      stats_.released_bytes += cls;
      out.push_back({p, cls});
    }
  }
  return release(out);
}

void large_block_cache::take_oldest_locked(std::size_t keep, std::vector<Block>& out) {
  while (stats_.cached_bytes > keep) {
    const Block b = lru_.front();
    // The oldest block of all is also the oldest of its class: the front of that class's list.
    auto& list = by_class_[static_cast<std::size_t>(class_index(b.bytes))];
    list.pop_front();
    lru_.pop_front();
    stats_.cached_bytes -= b.bytes;
    cached_bytes_.store(stats_.cached_bytes, std::memory_order_relaxed);
    --stats_.cached_blocks;
    stats_.released_bytes += b.bytes;
    GHT_UNPOISON(b.p, b.bytes);
    out.push_back(b);
  }
}

bool large_block_cache::release(const std::vector<Block>& blocks) noexcept {
  bool ok = true;
  for (const Block& b : blocks) {
    try {
      ok = unmap_(b.p, b.bytes) && ok;
    } catch (...) {
      ok = false;
    }
  }
  return ok;
}

std::size_t large_block_cache::trim(std::size_t keep_bytes) noexcept {
  std::vector<Block> out;
  try {
    std::lock_guard lock(mu_);
    out.reserve(stats_.cached_blocks);
    take_oldest_locked(keep_bytes, out);
  } catch (...) {  // no memory for the list: release what was taken
  }
  std::size_t n = 0;
  for (const Block& b : out) n += b.bytes;
  (void)release(out);
  return n;
}

bool large_block_cache::under_pressure() {
  if (opts_.min_free_bytes == 0 || !free_bytes_) return false;
  const std::int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now().time_since_epoch())
                               .count();
  std::int64_t next = next_check_ns_.load(std::memory_order_relaxed);
  // One thread per interval reads free memory; the others use the last answer.
  if (now >= next && next_check_ns_.compare_exchange_strong(
                         next, now + std::chrono::nanoseconds(opts_.pressure_check_interval).count(),
                         std::memory_order_relaxed)) {
    pressure_.store(free_bytes_() < opts_.min_free_bytes, std::memory_order_relaxed);
  }
  return pressure_.load(std::memory_order_relaxed);
}

HostCacheStats large_block_cache::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace ght::alloc::detail
