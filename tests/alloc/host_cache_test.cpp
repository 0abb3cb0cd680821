// The cache of freed large host blocks (detail::large_block_cache) and the host resources that
// own one: reuse, the byte bound, trim, memory pressure, an out-of-memory retry and statistics.
// The cache's own tests map nothing: fake map/unmap functions record what would be mapped, and a
// fake free-memory reading stands for memory pressure, so every outcome is exact.
#include <gtest/gtest.h>
#include <numaif.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "alloc/detail/host_memory.hpp"
#include "alloc/pinned_host.hpp"
#include "alloc/statistics.hpp"
#include "alloc/system_host.hpp"
#include "alloc/test_pattern.hpp"
#include "common/gpu.hpp"
#include "tier/error.hpp"

#ifdef GHT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

using namespace ght;
using namespace ght::alloc;
namespace hd = ght::alloc::detail;
using cache = hd::large_block_cache;

constexpr std::size_t KiB = 1024, MiB = 1024 * KiB;

int test_node() { return hd::numa_node_usable(0) ? 0 : -1; }

/// The default cache, without the memory-pressure bypass: outcomes must not depend on how much
/// memory the machine has free while the test runs.
hd::HostCacheOptions no_pressure(std::size_t max_bytes = std::size_t{1} << 30) {
  hd::HostCacheOptions o;
  o.max_bytes = max_bytes;
  o.min_free_bytes = 0;
  return o;
}

/// Hands out addresses that are never touched, remembers what is mapped, and can refuse to map
/// past a limit. The addresses lie in a reserved, inaccessible range: AddressSanitizer poisons
/// cached blocks, which needs addresses it considers application memory.
struct FakeMemory {
  static constexpr std::size_t kSpace = std::size_t{256} << 30;
  FakeMemory() {
    base = mmap(nullptr, kSpace, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) throw std::runtime_error("FakeMemory: cannot reserve address space");
    next = reinterpret_cast<std::uintptr_t>(base);
  }
  ~FakeMemory() { munmap(base, kSpace); }
  FakeMemory(const FakeMemory&) = delete;
  FakeMemory& operator=(const FakeMemory&) = delete;

  void* base;
  std::mutex mu;
  std::map<std::uintptr_t, std::size_t> mapped;  // address -> bytes
  std::vector<std::pair<std::uintptr_t, std::size_t>> unmapped;  // in order
  std::uintptr_t next;
  std::size_t limit = SIZE_MAX;  // most bytes mapped at once
  std::uint64_t free_bytes = std::uint64_t{1} << 40;
  int maps = 0;

  std::size_t mapped_bytes() {
    std::lock_guard lock(mu);
    std::size_t n = 0;
    for (const auto& [p, b] : mapped) n += b;
    return n;
  }
  cache make(hd::HostCacheOptions o) {
    o.pressure_check_interval = std::chrono::milliseconds(0);
    return cache(
        o,
        [this](std::size_t n) -> void* {
          std::lock_guard lock(mu);
          std::size_t used = 0;
          for (const auto& [p, b] : mapped) used += b;
          if (used + n > limit) throw ght::out_of_memory("fake: over the limit");
          const std::uintptr_t p = next;
          next += (n + 4095) / 4096 * 4096 + 4096;
          if (next > reinterpret_cast<std::uintptr_t>(base) + kSpace) {
            throw std::runtime_error("FakeMemory: reserved address space used up");
          }
          mapped[p] = n;
          ++maps;
          return reinterpret_cast<void*>(p);
        },
        [this](void* p, std::size_t n) {
          std::lock_guard lock(mu);
          const auto it = mapped.find(reinterpret_cast<std::uintptr_t>(p));
          EXPECT_NE(it, mapped.end()) << "unmap of an address never mapped";
          if (it == mapped.end()) return false;
          EXPECT_EQ(it->second, n) << "unmapped with another length than mapped";
          mapped.erase(it);
          unmapped.emplace_back(reinterpret_cast<std::uintptr_t>(p), n);
          return true;
        },
        [this] { return free_bytes; });
  }
};

hd::HostCacheOptions opts(std::size_t max_bytes, std::size_t max_block = 256 * MiB) {
  hd::HostCacheOptions o;
  o.max_bytes = max_bytes;
  o.max_block_bytes = max_block;
  o.min_free_bytes = 1 * MiB;
  return o;
}

TEST(LargeBlockCache, ClassSizes) {
  EXPECT_EQ(cache::class_bytes(256 * KiB + 1), 320 * KiB);
  EXPECT_EQ(cache::class_bytes(300 * KiB), 320 * KiB);
  EXPECT_EQ(cache::class_bytes(1 * MiB), 1 * MiB);
  EXPECT_EQ(cache::class_bytes(1 * MiB + 1), 1280 * KiB);
  EXPECT_EQ(cache::class_bytes(3 * MiB + 1), 3584 * KiB);
  EXPECT_EQ(cache::class_bytes(4 * MiB + 1), 6 * MiB);  // 2 MiB steps, as mapped_length rounds
  EXPECT_EQ(cache::class_bytes(48 * MiB + 1), 56 * MiB);
  EXPECT_EQ(cache::class_bytes(64 * MiB), 64 * MiB);
  // Every class holds the request, maps as it is (no further rounding) and wastes at most what
  // huge-page rounding does or a quarter of the request.
  std::mt19937_64 rng(7);
  ght::test::log_uniform sizes(256 * KiB + 1, std::size_t{1} << 34);
  for (int i = 0; i < 100000; ++i) {
    const std::size_t b = sizes(rng);
    const std::size_t c = cache::class_bytes(b);
    ASSERT_GE(c, b);
    ASSERT_EQ(hd::mapped_length(c), c) << b;
    ASSERT_LE(c, std::max(hd::mapped_length(b), b + b / 4)) << b;
    ASSERT_EQ(cache::class_bytes(c), c) << "a class size is its own class: " << b;
  }
}

TEST(LargeBlockCache, ReusesAFreedBlockOfTheSameClass) {
  FakeMemory m;
  cache c = m.make(opts(64 * MiB));
  void* a = c.allocate(1 * MiB);
  EXPECT_EQ(m.mapped.at(reinterpret_cast<std::uintptr_t>(a)), 1 * MiB);
  EXPECT_TRUE(c.deallocate(a, 1 * MiB));
  EXPECT_TRUE(m.unmapped.empty()) << "a freed block is kept";
  EXPECT_EQ(c.stats().cached_bytes, 1 * MiB);
  EXPECT_EQ(c.stats().cached_blocks, 1u);
  EXPECT_EQ(c.allocate(1 * MiB - 1000), a) << "same class: the cached block comes back";
  EXPECT_EQ(c.stats().cached_bytes, 0u);
  void* b = c.allocate(1 * MiB + 1);  // the next class up: a new mapping
  EXPECT_NE(b, a);
  EXPECT_EQ(m.maps, 2);
  const hd::HostCacheStats s = c.stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.released_bytes, 0u);
  EXPECT_TRUE(c.deallocate(a, 1 * MiB));
  EXPECT_TRUE(c.deallocate(b, 1 * MiB + 1));
  EXPECT_EQ(c.stats().cached_bytes, 1 * MiB + 1280 * KiB);
}

TEST(LargeBlockCache, BoundEvictsTheOldestFirst) {
  FakeMemory m;
  cache c = m.make(opts(8 * MiB));
  std::vector<void*> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(c.allocate(3 * MiB));
  for (void* p : blocks) EXPECT_TRUE(c.deallocate(p, 3 * MiB));
  // 8 MiB holds two 3 MiB blocks: the first two freed went back.
  EXPECT_EQ(c.stats().cached_bytes, 6 * MiB);
  EXPECT_EQ(c.stats().released_bytes, 6 * MiB);
  ASSERT_EQ(m.unmapped.size(), 2u);
  EXPECT_EQ(m.unmapped[0].first, reinterpret_cast<std::uintptr_t>(blocks[0]));
  EXPECT_EQ(m.unmapped[1].first, reinterpret_cast<std::uintptr_t>(blocks[1]));
  EXPECT_EQ(c.allocate(3 * MiB), blocks[3]) << "the most recently freed is reused first";
  EXPECT_TRUE(c.deallocate(blocks[3], 3 * MiB));
  // A block of another class evicts across classes, oldest first.
  void* big = c.allocate(5 * MiB);  // class 6 MiB
  EXPECT_TRUE(c.deallocate(big, 5 * MiB));
  EXPECT_LE(c.stats().cached_bytes, 8 * MiB);
  EXPECT_EQ(m.unmapped.back().first, reinterpret_cast<std::uintptr_t>(blocks[3]));
  EXPECT_EQ(m.mapped_bytes(), c.stats().cached_bytes) << "nothing live: all mapped is cached";
}

TEST(LargeBlockCache, LargeBlocksBypassTheCache) {
  FakeMemory m;
  cache c = m.make(opts(64 * MiB, 16 * MiB));
  const std::size_t n = 16 * MiB + 12345;  // above max_block_bytes: mapped exactly, not cached
  void* p = c.allocate(n);
  EXPECT_EQ(m.mapped.at(reinterpret_cast<std::uintptr_t>(p)), n);
  EXPECT_TRUE(c.deallocate(p, n));
  EXPECT_EQ(m.mapped_bytes(), 0u);
  EXPECT_EQ(c.stats().misses, 0u);
  // A cache smaller than a block cannot keep it, so such blocks bypass it too.
  FakeMemory m2;
  cache small = m2.make(opts(2 * MiB));
  EXPECT_FALSE(small.cacheable(3 * MiB));
  EXPECT_TRUE(small.cacheable(2 * MiB));
  // Off: nothing is cached or rounded.
  FakeMemory m3;
  cache off = m3.make(opts(0));
  void* q = off.allocate(300 * KiB);
  EXPECT_EQ(m3.mapped.at(reinterpret_cast<std::uintptr_t>(q)), 300 * KiB);
  EXPECT_TRUE(off.deallocate(q, 300 * KiB));
  EXPECT_EQ(m3.mapped_bytes(), 0u);
}

TEST(LargeBlockCache, TrimReleases) {
  FakeMemory m;
  cache c = m.make(opts(64 * MiB));
  std::vector<void*> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(c.allocate(2 * MiB));
  void* live = c.allocate(2 * MiB);
  for (void* p : blocks) EXPECT_TRUE(c.deallocate(p, 2 * MiB));
  EXPECT_EQ(c.trim(5 * MiB), 6 * MiB) << "down to two blocks";
  EXPECT_EQ(c.stats().cached_blocks, 2u);
  EXPECT_EQ(c.trim(), 4 * MiB);
  EXPECT_EQ(c.stats().cached_bytes, 0u);
  EXPECT_EQ(c.stats().released_bytes, 10 * MiB);
  EXPECT_EQ(m.mapped_bytes(), 2 * MiB) << "a live block is never released";
  EXPECT_EQ(c.trim(), 0u);
  EXPECT_TRUE(c.deallocate(live, 2 * MiB));
}

TEST(LargeBlockCache, MemoryPressureEmptiesTheCacheAndBypassesIt) {
  FakeMemory m;
  cache c = m.make(opts(64 * MiB));
  void* a = c.allocate(2 * MiB);
  void* b = c.allocate(2 * MiB);
  EXPECT_TRUE(c.deallocate(a, 2 * MiB));
  EXPECT_EQ(c.stats().cached_blocks, 1u);
  m.free_bytes = 512 * KiB;  // below min_free_bytes (1 MiB)
  EXPECT_TRUE(c.deallocate(b, 2 * MiB));
  EXPECT_EQ(c.stats().cached_bytes, 0u);
  EXPECT_EQ(c.stats().pressure_trims, 1u);
  EXPECT_EQ(m.mapped_bytes(), 0u) << "the freed block and the cached one went back";
  m.free_bytes = 64 * MiB;  // pressure over: frees are cached again
  void* d = c.allocate(2 * MiB);
  EXPECT_TRUE(c.deallocate(d, 2 * MiB));
  EXPECT_EQ(c.stats().cached_blocks, 1u);
}

TEST(LargeBlockCache, OutOfMemoryReleasesTheCacheAndRetries) {
  FakeMemory m;
  m.limit = 10 * MiB;
  cache c = m.make(opts(64 * MiB));
  void* a = c.allocate(4 * MiB);
  void* b = c.allocate(4 * MiB);
  EXPECT_TRUE(c.deallocate(a, 4 * MiB));
  EXPECT_TRUE(c.deallocate(b, 4 * MiB));
  // 6 MiB more does not fit beside 8 MiB of cached blocks: they are released and it does.
  void* d = c.allocate(6 * MiB);
  EXPECT_NE(d, nullptr);
  EXPECT_EQ(c.stats().cached_bytes, 0u);
  EXPECT_EQ(m.mapped_bytes(), 6 * MiB);
  // Out of memory with nothing cached: the error reaches the caller, nothing changes.
  EXPECT_THROW((void)c.allocate(6 * MiB), ght::out_of_memory);
  EXPECT_EQ(m.mapped_bytes(), 6 * MiB);
  EXPECT_TRUE(c.deallocate(d, 6 * MiB));
}

TEST(LargeBlockCache, ManyThreadsNeverShareABlock) {
  FakeMemory m;
  cache c = m.make(opts(32 * MiB));
  std::mutex live_mu;
  std::set<std::uintptr_t> live;
  std::atomic<bool> shared{false};
  std::vector<std::thread> th;
  for (int t = 0; t < 8; ++t) {
    th.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t));
      ght::test::log_uniform sizes(256 * KiB + 1, 8 * MiB);
      for (int i = 0; i < 2000; ++i) {
        const std::size_t n = sizes(rng);
        void* p = c.allocate(n);
        {
          std::lock_guard lock(live_mu);
          if (!live.insert(reinterpret_cast<std::uintptr_t>(p)).second) shared = true;
        }
        {
          std::lock_guard lock(live_mu);
          live.erase(reinterpret_cast<std::uintptr_t>(p));
        }
        EXPECT_TRUE(c.deallocate(p, n));
      }
    });
  }
  for (auto& x : th) x.join();
  EXPECT_FALSE(shared) << "one block handed to two owners";
  const hd::HostCacheStats s = c.stats();
  EXPECT_EQ(s.hits + s.misses, 16000u);
  EXPECT_LE(s.cached_bytes, 32 * MiB);
  EXPECT_EQ(m.mapped_bytes(), s.cached_bytes);
  EXPECT_EQ(c.trim(), s.cached_bytes);
  EXPECT_EQ(m.mapped_bytes(), 0u);
}

// ---- through the host resources ----------------------------------------------------------------

bool is_mapped(void* p) {
  unsigned char v = 0;
  return mincore(p, 4096, &v) == 0 || errno != ENOMEM;
}

TEST(SystemHostCache, FreedBlockComesBackWithItsNumaPolicy) {
  statistics_adaptor stats(std::make_unique<system_host>(test_node(), true, no_pressure()));
  auto& r = dynamic_cast<system_host&>(stats.upstream());
  const std::size_t n = 8 * MiB;
  char* p = static_cast<char*>(stats.allocate(n));
  std::memset(p, 0x5a, n);
  stats.deallocate(p, n);
  // Live bytes and cached bytes are counted apart.
  EXPECT_EQ(stats.tier_usage(TierKind::host).current, 0u);
  EXPECT_EQ(r.cache_stats().cached_bytes, n);
  EXPECT_TRUE(is_mapped(p));
  char* q = static_cast<char*>(stats.allocate(n - 4096));
  EXPECT_EQ(q, p) << "the cached block is reused";
  EXPECT_EQ(q[n - 1], 0x5a) << "a cached block is not cleared, nor remapped";
  EXPECT_EQ(stats.tier_usage(TierKind::host).current, n - 4096);
  EXPECT_EQ(r.cache_stats().cached_bytes, 0u);
  EXPECT_EQ(r.cache_stats().hits, 1u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(q) % hd::kHugePageBytes, 0u);
  if (test_node() >= 0) {
    int mode = -1;
    unsigned long mask[16] = {};
    ASSERT_EQ(get_mempolicy(&mode, mask, 8 * sizeof(mask), q, MPOL_F_ADDR), 0);
    EXPECT_EQ(mode, MPOL_PREFERRED) << "the NUMA policy stays with the cached block";
  }
  stats.deallocate(q, n - 4096);
  EXPECT_GE(r.physical_free(), n) << "cached bytes count as free for this resource";
}

TEST(SystemHostCache, TrimUnmaps) {
  system_host r(test_node(), true, no_pressure());
  void* a = r.allocate(1 * MiB);
  void* b = r.allocate(12 * MiB);
  r.deallocate(a, 1 * MiB);
  r.deallocate(b, 12 * MiB);
  EXPECT_TRUE(is_mapped(a));
  EXPECT_TRUE(is_mapped(b));
  EXPECT_EQ(r.trim(), 13 * MiB);
  EXPECT_FALSE(is_mapped(a)) << "trim gives the memory back to the OS";
  EXPECT_FALSE(is_mapped(b));
  EXPECT_EQ(r.cache_stats().cached_bytes, 0u);
  EXPECT_EQ(r.cache_stats().released_bytes, 13 * MiB);
}

TEST(SystemHostCache, BoundAndSwitchOff) {
  system_host r(test_node(), true, no_pressure(4 * MiB));
  void* a = r.allocate(3 * MiB);
  void* b = r.allocate(3 * MiB);
  r.deallocate(a, 3 * MiB);
  r.deallocate(b, 3 * MiB);  // evicts a
  EXPECT_EQ(r.cache_stats().cached_bytes, 3 * MiB);
  EXPECT_FALSE(is_mapped(a));
  EXPECT_TRUE(is_mapped(b));
  system_host off(test_node(), true, hd::HostCacheOptions{.max_bytes = 0});
  void* c = off.allocate(3 * MiB);
  off.deallocate(c, 3 * MiB);
  EXPECT_FALSE(is_mapped(c)) << "with the cache off a freed block is unmapped at once";
  EXPECT_EQ(off.cache_stats().cached_bytes, 0u);
}

#if defined(__SANITIZE_ADDRESS__)
TEST(SystemHostCacheDeathTest, UseOfACachedBlockIsReported) {
  // A freed block stays mapped in the cache, so only poisoning makes a use after free visible.
  system_host r(test_node(), true, no_pressure());
  char* p = static_cast<char*>(r.allocate(1 * MiB));
  r.deallocate(p, 1 * MiB);
  EXPECT_DEATH(p[100] = 1, "use-after-poison");
  void* q = r.allocate(1 * MiB);  // back from the cache: usable again
  ASSERT_EQ(q, p);
  p[100] = 1;
  r.deallocate(q, 1 * MiB);
}
#endif

TEST(PinnedHostCache, CachedBlockStaysRegistered) {
#ifdef GHT_HAVE_CUDA
  GHT_REQUIRE_GPU();
#endif
  PinnedHostOptions o;
  o.numa_node = test_node();
  o.cache = no_pressure();
  pinned_host r(o);
  const std::size_t n = 6 * MiB;
  void* p = r.allocate(n);
  r.deallocate(p, n);
  void* q = r.allocate(n);
  EXPECT_EQ(q, p);
  EXPECT_EQ(r.cache_stats().hits, 1u);
#ifdef GHT_HAVE_CUDA
  // Still registered and mapped: the device sees it, and a copy into it needs no staging.
  std::vector<unsigned char> src(n, 0xa5);
  ASSERT_EQ(cudaMemcpy(r.device_pointer(q), src.data(), n, cudaMemcpyDefault), cudaSuccess);
  EXPECT_EQ(static_cast<unsigned char*>(q)[n - 1], 0xa5);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, q), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeHost) << "registered memory";
#endif
  r.deallocate(q, n);
  EXPECT_EQ(r.trim(), n);
}

}  // namespace
