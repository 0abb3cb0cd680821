// Small host blocks from mimalloc (detail::small_heap behind system_host): where they come from,
// that the tiered allocator's statistics and budget count them exactly as they count blocks
// from the slab pool, and that blocks move between threads (freed on another thread, and
// after the thread that allocated them has ended).
#include <gtest/gtest.h>
#include <numaif.h>

#include <array>
#include <random>
#include <thread>
#include <vector>

#include "alloc/detail/host_memory.hpp"
#include "alloc/detail/small_heap.hpp"
#include "alloc/system_host.hpp"
#include "alloc/tiered.hpp"
#include "alloc/test_pattern.hpp"
#include "tier/error.hpp"

namespace {

using namespace ght;
using namespace ght::alloc;
namespace hd = ght::alloc::detail;

int test_node() { return hd::numa_node_usable(0) ? 0 : -1; }

// The largest block mimalloc serves at the default alignment.
constexpr std::size_t kLargest = hd::small_heap::kMaxBytes - kDefaultAlignment;

#define REQUIRE_MIMALLOC()                                                                   \
  if (!hd::small_heap::available())                                                          \
  GTEST_SKIP() << "built without mimalloc (install libmimalloc-dev and reconfigure; sanitizer " \
                  "builds leave it out): small host blocks come from the slab pool"

TEST(SmallHeap, ServesBlocksUpTo128KiBOnTheNode) {
  REQUIRE_MIMALLOC();
  system_host r(test_node());
  ASSERT_TRUE(r.mimalloc_small_blocks());
  EXPECT_FALSE(system_host(test_node(), true, {}, false).mimalloc_small_blocks());
  const std::size_t max = kLargest;
  for (std::size_t n : {std::size_t{1}, std::size_t{100}, std::size_t{4096}, max / 2 + 1, max}) {
    char* p = static_cast<char*>(r.allocate(n));
    EXPECT_TRUE(r.from_mimalloc(p)) << n << " bytes";
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % kDefaultAlignment, 0u) << n << " bytes";
    p[0] = 1;
    p[n - 1] = 2;
    if (test_node() >= 0) {
      // The arena carries the node policy of the other host blocks.
      int mode = -1;
      std::array<unsigned long, 16> mask{};
      ASSERT_EQ(get_mempolicy(&mode, mask.data(), 8 * sizeof(mask), p, MPOL_F_ADDR), 0);
      EXPECT_EQ(mode, MPOL_PREFERRED);
      EXPECT_EQ(mask[0] & 1UL, 1UL) << "preferred node 0";
    }
    r.deallocate(p, n);
  }
  void* page = r.allocate(24, 4096);
  EXPECT_TRUE(r.from_mimalloc(page));
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(page) % 4096, 0u);
  r.deallocate(page, 24, 4096);
  EXPECT_EQ(r.pool_reserved_bytes(), 0u) << "the slab pool is not used";
  void* big = r.allocate(max + 1);  // above the threshold: the slab pool, as before
  EXPECT_FALSE(r.from_mimalloc(big));
  EXPECT_EQ(r.pool_reserved_bytes(), hd::small_block_pool::kSlabBytes);
  r.deallocate(big, max + 1);
  void* huge = r.allocate(std::size_t{2} << 20);  // and the large-block cache
  EXPECT_FALSE(r.from_mimalloc(huge));
  EXPECT_EQ(r.cache_stats().misses, 1u);
  r.deallocate(huge, std::size_t{2} << 20);
}

TEST(SmallHeap, FallsBackToTheSlabPoolWhenTheArenaIsFull) {
  REQUIRE_MIMALLOC();
  system_host r(test_node());
  ASSERT_TRUE(r.mimalloc_small_blocks());
  // The largest small blocks until one does not come from the arena (1 GiB).
  const std::size_t n = kLargest;
  const std::size_t limit = 2 * hd::small_heap::kArenaBytes / n;
  std::vector<char*> held;
  char* outside = nullptr;
  while (outside == nullptr && held.size() < limit) {
    char* p = static_cast<char*>(r.allocate(n));
    p[0] = 1;  // mimalloc touches little else: the arena's pages stay mostly untouched
    if (r.from_mimalloc(p)) {
      held.push_back(p);
    } else {
      outside = p;
    }
  }
  ASSERT_NE(outside, nullptr) << held.size() << " blocks of " << n << " B, all from the arena";
  EXPECT_GT(held.size(), 64u);
  outside[n - 1] = 2;
  EXPECT_EQ(r.pool_reserved_bytes(), hd::small_block_pool::kSlabBytes) << "from the slab pool";
  // Small sizes go on: from a page mimalloc has, or from the slab pool; each is freed right.
  std::vector<void*> small;
  for (int i = 0; i < 20000; ++i) small.push_back(r.allocate(200));
  for (void* p : small) r.deallocate(p, 200);
  r.deallocate(outside, n);
  for (char* p : held) r.deallocate(p, n);
  char* again = static_cast<char*>(r.allocate(n));
  EXPECT_TRUE(r.from_mimalloc(again)) << "freed arena memory is used again";
  r.deallocate(again, n);
}

/// A host-only tiered allocator whose host tier is a system_host with or without mimalloc.
std::unique_ptr<tiered_allocator> make_host_tier(bool mimalloc, std::uint64_t budget) {
  std::array<TierSetup, kNumTiers> t;
  t[static_cast<std::size_t>(TierKind::host)].resource =
      std::make_unique<system_host>(test_node(), true, hd::HostCacheOptions{}, mimalloc);
  t[static_cast<std::size_t>(TierKind::host)].budget = budget;
  TieredOptions o;
  o.spill = false;
  return std::make_unique<tiered_allocator>(std::move(t), std::move(o));
}

struct Trace {
  Usage tier, cls, all;  // after every third block was freed
  std::uint64_t failures = 0;
  bool ok_at_budget = false;
  bool refused_over_budget = false;
};

/// Allocates a fixed sequence of small sizes into a budget of exactly their sum, goes one byte
/// over, frees every third block; returns what the statistics said.
Trace run_trace(bool mimalloc) {
  std::mt19937_64 rng(7);
  std::vector<std::size_t> sizes;
  std::uint64_t sum = 0;
  for (int i = 0; i < 3000; ++i) {
    sizes.push_back(1 + rng() % (kLargest / (1 + rng() % 64)));
    sum += sizes.back();
  }
  auto t = make_host_tier(mimalloc, /*budget=*/sum);
  const AllocRequest req{TensorClass::adam_m, "small", TierKind::host, false};
  std::vector<void*> ps;
  Trace tr;
  try {
    for (std::size_t n : sizes) ps.push_back(t->allocate(n, req));
    tr.ok_at_budget = true;  // the last block filled the budget to the byte
  } catch (const ght::out_of_memory& e) {
    ADD_FAILURE() << e.what();
  }
  try {
    (void)t->allocate(1, req);
  } catch (const ght::out_of_memory&) {
    tr.refused_over_budget = true;
  }
  for (std::size_t i = 0; i < ps.size(); i += 3) t->deallocate(ps[i]);
  tr.tier = t->tier_usage(TierKind::host);
  tr.cls = t->class_usage(TensorClass::adam_m);
  tr.all = t->total_usage();
  tr.failures = t->report(TierKind::host).failures;
  for (std::size_t i = 0; i < ps.size(); ++i) {
    if (i % 3 != 0) t->deallocate(ps[i]);
  }
  EXPECT_EQ(t->tier_usage(TierKind::host).current, 0u);
  return tr;
}

TEST(SmallHeap, StatisticsAndBudgetCountRequestedBytesAsBefore) {
  REQUIRE_MIMALLOC();
  const Trace slab = run_trace(false);
  const Trace mi = run_trace(true);
  for (const Trace* tr : {&slab, &mi}) {
    EXPECT_TRUE(tr->ok_at_budget);
    EXPECT_TRUE(tr->refused_over_budget) << "one byte over the budget is refused";
    EXPECT_EQ(tr->failures, 1u);
    EXPECT_EQ(tr->tier.current, tr->cls.current);
    EXPECT_EQ(tr->all.current, tr->tier.current);
  }
  // Exactly the numbers of the slab pool: requested bytes, not what either allocator rounds to.
  for (const auto& [a, b] : {std::pair{mi.tier, slab.tier}, std::pair{mi.cls, slab.cls},
                             std::pair{mi.all, slab.all}}) {
    EXPECT_EQ(a.current, b.current);
    EXPECT_EQ(a.peak, b.peak);
    EXPECT_EQ(a.total, b.total);
    EXPECT_EQ(a.count, b.count);
  }
  EXPECT_LT(mi.tier.current, mi.tier.peak) << "every third block was freed";
  EXPECT_EQ(mi.tier.count, 3000u);
}

TEST(SmallHeap, BlocksFreedOnOtherThreadsAndAfterTheirThreadEnded) {
  REQUIRE_MIMALLOC();
  auto t = make_host_tier(true, UINT64_MAX);
  const memory_resource& base = *t->tier_resource(TierKind::host);
  const auto& host = dynamic_cast<const system_host&>(base);
  const AllocRequest req{TensorClass::other, {}, TierKind::host, false};
  constexpr int kThreads = 4, kBlocks = 2000;
  // Allocated on threads that end before anything is freed; patterned from the address.
  std::vector<std::vector<std::pair<void*, std::size_t>>> got(kThreads);
  {
    std::vector<std::thread> th;
    for (int k = 0; k < kThreads; ++k) {
      th.emplace_back([&, k] {
        std::mt19937_64 rng(100 + static_cast<std::uint64_t>(k));
        for (int i = 0; i < kBlocks; ++i) {
          const std::size_t n = 1 + rng() % (i % 50 == 0 ? kLargest : 4096);
          void* p = t->allocate(n, req);
          test::fill_pattern(base, p, n);
          got[static_cast<std::size_t>(k)].emplace_back(p, n);
        }
      });
    }
    for (auto& x : th) x.join();
  }
  std::uint64_t from_mi = 0;
  for (const auto& v : got) {
    for (const auto& [p, n] : v) from_mi += host.from_mimalloc(p) ? 1 : 0;
  }
  EXPECT_EQ(from_mi, std::uint64_t{kThreads} * kBlocks);
  // Each thread frees another's blocks while allocating and freeing its own.
  std::vector<std::string> errors(kThreads);
  {
    std::vector<std::thread> th;
    for (int k = 0; k < kThreads; ++k) {
      th.emplace_back([&, k] {
        for (const auto& [p, n] : got[static_cast<std::size_t>((k + 1) % kThreads)]) {
          if (std::string e = test::check_pattern(base, p, n); !e.empty() && errors[static_cast<std::size_t>(k)].empty()) errors[static_cast<std::size_t>(k)] = e;
          t->deallocate(p);
          void* q = t->allocate(n, req);
          test::fill_pattern(base, q, n);
          if (std::string e = test::check_pattern(base, q, n); !e.empty() && errors[static_cast<std::size_t>(k)].empty()) errors[static_cast<std::size_t>(k)] = e;
          t->deallocate(q);
        }
      });
    }
    for (auto& x : th) x.join();
  }
  for (const std::string& e : errors) EXPECT_TRUE(e.empty()) << e;
  EXPECT_EQ(t->tier_usage(TierKind::host).current, 0u);
  EXPECT_EQ(t->tier_usage(TierKind::host).count, 2u * kThreads * kBlocks);
}

}  // namespace
