// Stress: at least 10^6 pattern-checked operations per host resource, with blocks passed
// between threads, and zero live bytes at the end (mimalloc-style, CONVENTIONS.md).
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "alloc/detail/host_memory.hpp"
#include "alloc/pinned_host.hpp"
#include "alloc/statistics.hpp"
#include "alloc/system_host.hpp"
#include "alloc/test_pattern.hpp"
#include "alloc/tiered.hpp"
#include "common/gpu.hpp"

namespace {

using namespace ght;
using namespace ght::alloc;

// ThreadSanitizer slows every synchronised access 5-20x; it runs a fifth of the operations so
// the job stays short. The plain and ASan builds run the full 10^6.
#if defined(__SANITIZE_THREAD__)
constexpr long kOps = 200'000;
#else
constexpr long kOps = 1'000'000;
#endif

struct Slot {
  std::mutex mu;
  void* p = nullptr;
  std::size_t n = 0;
  TensorClass cls = TensorClass::other;
};

struct Result {
  long allocations = 0;
  std::string error;
};

/// kOps operations over `threads` threads on 4096 shared slots: an operation on an empty slot
/// allocates and fills a block, on a full one checks and frees it, so most blocks are freed by
/// a thread other than the one that allocated them.
Result run_stress(memory_resource& r, int threads) {
  std::vector<Slot> slots(4096);
  std::atomic<long> allocations{0};
  std::vector<std::string> errors(static_cast<std::size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(0xC0FFEEu + static_cast<unsigned>(t));
      ght::test::log_uniform small(1, std::size_t{16} << 10);
      ght::test::log_uniform large(std::size_t{256} << 10, std::size_t{8} << 20);
      std::string& err = errors[static_cast<std::size_t>(t)];
      long mine = 0;
      try {
        for (long i = 0; i < kOps / threads; ++i) {
          Slot& s = slots[rng() % slots.size()];
          std::lock_guard lock(s.mu);
          if (s.p != nullptr) {
            const std::string bad = ght::test::check_pattern(r, s.p, s.n);
            if (!bad.empty() && err.empty()) err = bad;
            r.deallocate(s.p, s.n, kDefaultAlignment, nullptr, s.cls);
            s.p = nullptr;
          } else {
            // One in 256 takes the large-block path (its own mapping).
            s.n = rng() % 256 == 0 ? large(rng) : small(rng);
            s.cls = static_cast<TensorClass>(rng() % kNumTensorClasses);
            s.p = r.allocate(s.n, kDefaultAlignment, nullptr, s.cls);
            ght::test::fill_pattern(r, s.p, s.n);
            ++mine;
          }
        }
      } catch (const std::exception& e) {
        err = e.what();
      }
      allocations.fetch_add(mine);
    });
  }
  for (auto& th : pool) th.join();
  Result res;
  for (Slot& s : slots) {
    if (s.p == nullptr) continue;
    const std::string bad = ght::test::check_pattern(r, s.p, s.n);
    if (!bad.empty() && res.error.empty()) res.error = bad;
    r.deallocate(s.p, s.n, kDefaultAlignment, nullptr, s.cls);
  }
  for (const auto& e : errors) {
    if (!e.empty() && res.error.empty()) res.error = e;
  }
  res.allocations = allocations.load();
  return res;
}

int test_node() { return ght::alloc::detail::numa_node_usable(0) ? 0 : -1; }

void expect_clean(const statistics_adaptor& stats, const Result& res) {
  EXPECT_EQ(res.error, "");
  const Usage u = stats.total_usage();
  EXPECT_EQ(u.current, 0u) << "live bytes left at the end";
  EXPECT_EQ(u.count, static_cast<std::uint64_t>(res.allocations));
  EXPECT_GT(u.peak, 0u);
  std::uint64_t class_total = 0;
  for (int c = 0; c < kNumTensorClasses; ++c) {
    const Usage cu = stats.class_usage(static_cast<TensorClass>(c));
    EXPECT_EQ(cu.current, 0u) << to_string(static_cast<TensorClass>(c));
    class_total += cu.total;
  }
  EXPECT_EQ(class_total, u.total);
}

TEST(Stress, SystemHost) {
  statistics_adaptor stats(std::make_unique<system_host>(test_node()));
  const Result res = run_stress(stats, 4);
  expect_clean(stats, res);
  EXPECT_GE(res.allocations * 2, kOps * 9 / 10);  // about half the operations allocate
}

TEST(Stress, PinnedHost) {
#ifdef GHT_HAVE_CUDA
  GHT_REQUIRE_GPU();  // registration needs a device
#endif
  PinnedHostOptions o;
  o.numa_node = test_node();
  statistics_adaptor stats(std::make_unique<pinned_host>(o));
  const Result res = run_stress(stats, 4);
  expect_clean(stats, res);
}

TEST(Stress, TieredWithSpills) {
  // Two host-memory tiers; the first has a 4 MiB budget, so the large blocks and many small
  // ones spill, and the budget check races between threads.
  std::array<TierSetup, kNumTiers> tiers;
  tiers[0].resource = std::make_unique<system_host>(test_node());
  tiers[0].budget = std::uint64_t{4} << 20;
  tiers[1].resource = std::make_unique<system_host>(-1);
  tiered_allocator t(std::move(tiers));
  statistics_adaptor stats(t);
  const Result res = run_stress(stats, 4);
  expect_clean(stats, res);
  EXPECT_GT(t.spill_count(), 0u);
  for (TierKind k : {TierKind::hbm, TierKind::host}) {
    EXPECT_EQ(t.report(k).usage.current, 0u) << to_string(k);
  }
  EXPECT_LE(t.report(TierKind::hbm).usage.peak, std::uint64_t{4} << 20);
}

}  // namespace
