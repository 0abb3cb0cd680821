// The contract every memory resource in alloc/ keeps, as one typed suite instantiated for each
// resource, each adaptor and the tiered allocator (CONVENTIONS.md, "Contract tests").
// Device resources skip with a message where there is no GPU.
#include <gtest/gtest.h>

#include <deque>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "alloc/detail/host_memory.hpp"
#include "alloc/device_direct.hpp"
#include "alloc/device_pool.hpp"
#include "alloc/limit.hpp"
#include "alloc/logging.hpp"
#include "alloc/managed.hpp"
#include "alloc/pinned_host.hpp"
#include "alloc/statistics.hpp"
#include "alloc/system_host.hpp"
#include "alloc/tiered.hpp"
#include "alloc/test_pattern.hpp"
#include "common/gpu.hpp"
#include "tier/error.hpp"

namespace {

using namespace ght;
using namespace ght::alloc;
using ght::test::check_pattern;
using ght::test::fill_pattern;

int test_node() { return ght::alloc::detail::numa_node_usable(0) ? 0 : -1; }

#ifdef GHT_HAVE_CUDA
constexpr bool kCuda = true;
#else
constexpr bool kCuda = false;
#endif

// ---- one factory per instantiation: make() builds the resource, gpu says whether it needs one

struct SystemHost {
  static constexpr bool gpu = false;
  static std::unique_ptr<memory_resource> make() { return std::make_unique<system_host>(test_node()); }
};
/// A cache far smaller than what the random-size and threaded tests free: blocks are evicted
/// and reused all the time.
struct SystemHostSmallCache {
  static constexpr bool gpu = false;
  static std::unique_ptr<memory_resource> make() {
    ght::alloc::detail::HostCacheOptions cache;
    cache.max_bytes = std::size_t{16} << 20;
    return std::make_unique<system_host>(test_node(), true, cache);
  }
};
struct SystemHostNoCache {
  static constexpr bool gpu = false;
  static std::unique_ptr<memory_resource> make() {
    return std::make_unique<system_host>(test_node(), true,
                                         ght::alloc::detail::HostCacheOptions{.max_bytes = 0});
  }
};
/// Upstream of the adaptor and tiered instances: 4 KiB pages, since the random-size test
/// touches large blocks sparsely (system_host itself is tested with its default, huge pages).
std::unique_ptr<memory_resource> small_pages() {
  return std::make_unique<system_host>(test_node(), false);
}
struct PinnedHost {
  static constexpr bool gpu = kCuda;  // registration needs a device; without CUDA it is host memory
  static std::unique_ptr<memory_resource> make() {
    PinnedHostOptions o;
    o.numa_node = test_node();
    return std::make_unique<pinned_host>(o);
  }
};
struct DevicePool {
  static constexpr bool gpu = true;
  static std::unique_ptr<memory_resource> make() { return std::make_unique<device_pool>(); }
};
struct DeviceDirect {
  static constexpr bool gpu = true;
  static std::unique_ptr<memory_resource> make() { return std::make_unique<device_direct>(0); }
};
struct ManagedHost {
  static constexpr bool gpu = true;
  static std::unique_ptr<memory_resource> make() { return std::make_unique<managed>(); }
};
struct Statistics {
  static constexpr bool gpu = false;
  static std::unique_ptr<memory_resource> make() {
    return std::make_unique<statistics_adaptor>(small_pages());
  }
};
struct Limit {
  static constexpr bool gpu = false;
  static std::unique_ptr<memory_resource> make() {
    return std::make_unique<limit_adaptor>(small_pages(), std::uint64_t{64} << 30);
  }
};
struct Logging {
  static constexpr bool gpu = false;
  static std::unique_ptr<memory_resource> make() {
    const auto path = std::filesystem::path(::testing::TempDir()) / "ght_contract_log.csv";
    return std::make_unique<logging_adaptor>(small_pages(),
                                             std::make_shared<log_sink>(path.string()));
  }
};
/// Host tier only, as in a CPU-only build.
struct TieredHost {
  static constexpr bool gpu = false;
  static std::unique_ptr<memory_resource> make() {
    std::array<TierSetup, kNumTiers> t;
    t[1].resource = small_pages();
    return std::make_unique<tiered_allocator>(std::move(t));
  }
};
/// Two tiers, both host memory, with a small first-tier budget so many blocks spill.
struct TieredSpill {
  static constexpr bool gpu = false;
  static std::unique_ptr<memory_resource> make() {
    std::array<TierSetup, kNumTiers> t;
    t[0].resource = small_pages();
    t[0].budget = std::uint64_t{96} << 20;
    t[1].resource = std::make_unique<system_host>(-1, false);
    return std::make_unique<tiered_allocator>(std::move(t));
  }
};
/// What the configuration and the machine build (hbm + host with a GPU; host only without).
struct TieredDefault {
  static constexpr bool gpu = false;
  static std::unique_ptr<memory_resource> make() { return make_default_tiered_allocator(); }
};
/// The hbm tier on a real GPU, with a budget that forces spills to pinned host memory.
struct TieredGpu {
  static constexpr bool gpu = true;
  static std::unique_ptr<memory_resource> make() {
    std::array<TierSetup, kNumTiers> t;
    t[0].resource = std::make_unique<device_pool>();
    t[0].budget = std::uint64_t{256} << 20;
    t[1].resource = PinnedHost::make();
    return std::make_unique<tiered_allocator>(std::move(t));
  }
};

template <typename F>
class Contract : public ::testing::Test {
 protected:
  void SetUp() override {
    if (F::gpu) GHT_REQUIRE_GPU();
    r_ = F::make();
  }
  memory_resource& r() { return *r_; }

  void round_trip(std::size_t bytes, std::size_t align) {
    void* p = r().allocate(bytes, align);
    ASSERT_NE(p, nullptr) << bytes << " bytes";
    ASSERT_EQ(reinterpret_cast<std::uintptr_t>(p) % align, 0u) << bytes << " bytes, align " << align;
    fill_pattern(r(), p, bytes);
    EXPECT_EQ(check_pattern(r(), p, bytes), "");
    r().deallocate(p, bytes, align);
  }

  std::unique_ptr<memory_resource> r_;
};

using Resources = ::testing::Types<SystemHost, SystemHostSmallCache, SystemHostNoCache, PinnedHost, DevicePool, DeviceDirect, ManagedHost,
                                   Statistics, Limit, Logging, TieredHost, TieredSpill,
                                   TieredDefault, TieredGpu>;

class ResourceNames {
 public:
  template <typename T>
  static std::string GetName(int) {
    if (std::is_same_v<T, SystemHost>) return "system_host";
    if (std::is_same_v<T, SystemHostSmallCache>) return "system_host_small_cache";
    if (std::is_same_v<T, SystemHostNoCache>) return "system_host_no_cache";
    if (std::is_same_v<T, PinnedHost>) return "pinned_host";
    if (std::is_same_v<T, DevicePool>) return "device_pool";
    if (std::is_same_v<T, DeviceDirect>) return "device_direct";
    if (std::is_same_v<T, ManagedHost>) return "managed";
    if (std::is_same_v<T, Statistics>) return "statistics";
    if (std::is_same_v<T, Limit>) return "limit";
    if (std::is_same_v<T, Logging>) return "logging";
    if (std::is_same_v<T, TieredHost>) return "tiered_host";
    if (std::is_same_v<T, TieredSpill>) return "tiered_spill";
    if (std::is_same_v<T, TieredDefault>) return "tiered_default";
    if (std::is_same_v<T, TieredGpu>) return "tiered_gpu";
    return "unknown";
  }
};
TYPED_TEST_SUITE(Contract, Resources, ResourceNames);

TYPED_TEST(Contract, BasicAllocation) {
  for (std::size_t bytes : {std::size_t{1}, std::size_t{8}, std::size_t{1000}, std::size_t{1} << 20,
                            (std::size_t{5} << 20) + 3}) {
    this->round_trip(bytes, kDefaultAlignment);
  }
  EXPECT_FALSE(this->r().name().empty());
}

TYPED_TEST(Contract, ZeroSize) {
  EXPECT_EQ(this->r().allocate(0), nullptr);
  EXPECT_NO_THROW(this->r().deallocate(nullptr, 0));
  EXPECT_NO_THROW(this->r().deallocate(nullptr, 123));
}

TYPED_TEST(Contract, AlignmentUpTo256) {
  for (std::size_t align = 1; align <= 256; align *= 2) {
    for (std::size_t bytes : {std::size_t{1}, std::size_t{3}, std::size_t{100}, std::size_t{4097},
                              std::size_t{300000}}) {
      this->round_trip(bytes, align);
    }
  }
  EXPECT_GE(this->r().max_alignment(), 256u);
}

TYPED_TEST(Contract, RejectsBadAlignment) {
  EXPECT_THROW((void)this->r().allocate(64, 3), ght::logic_error);
  EXPECT_THROW((void)this->r().allocate(64, 0), ght::logic_error);
  EXPECT_THROW((void)this->r().allocate(64, this->r().max_alignment() * 2), ght::logic_error);
}

TYPED_TEST(Contract, RandomSizes) {
  // 10,000 sizes from 1 B to 64 MiB, log-uniform, with up to 24 blocks live at once and freed
  // in random order.
  std::mt19937_64 rng(20240520);
  ght::test::log_uniform sizes(1, std::size_t{64} << 20);
  struct Block {
    void* p;
    std::size_t n;
  };
  std::vector<Block> live;
  for (int i = 0; i < 10000; ++i) {
    const std::size_t n = sizes(rng);
    void* p = this->r().allocate(n);
    ASSERT_NE(p, nullptr);
    ASSERT_EQ(reinterpret_cast<std::uintptr_t>(p) % kDefaultAlignment, 0u);
    fill_pattern(this->r(), p, n);
    live.push_back({p, n});
    if (live.size() > 24 || (i == 9999)) {
      while (!live.empty() && (live.size() > 12 || i == 9999)) {
        const std::size_t k = rng() % live.size();
        ASSERT_EQ(check_pattern(this->r(), live[k].p, live[k].n), "") << "block " << k;
        this->r().deallocate(live[k].p, live[k].n);
        live[k] = live.back();
        live.pop_back();
      }
    }
  }
  EXPECT_TRUE(live.empty());
}

TYPED_TEST(Contract, EightThreads) {
  constexpr int kThreads = 8, kOps = 1500;
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<unsigned>(t) * 7919u + 1u);
      ght::test::log_uniform sizes(1, std::size_t{1} << 20);
      std::vector<std::pair<void*, std::size_t>> mine;
      try {
        for (int i = 0; i < kOps; ++i) {
          if (mine.size() < 16 && (mine.empty() || rng() % 2 == 0)) {
            const std::size_t n = sizes(rng);
            void* p = this->r().allocate(n);
            fill_pattern(this->r(), p, n);
            mine.emplace_back(p, n);
          } else {
            const std::size_t k = rng() % mine.size();
            const std::string bad = check_pattern(this->r(), mine[k].first, mine[k].second);
            if (!bad.empty() && errors[static_cast<std::size_t>(t)].empty()) errors[static_cast<std::size_t>(t)] = bad;
            this->r().deallocate(mine[k].first, mine[k].second);
            mine[k] = mine.back();
            mine.pop_back();
          }
        }
        for (auto& [p, n] : mine) this->r().deallocate(p, n);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(t)] = e.what();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[static_cast<std::size_t>(t)], "") << "thread " << t;
}

TYPED_TEST(Contract, FreeOnAnotherThread) {
  // Four threads allocate and fill; four others check and free what they receive.
  constexpr int kProducers = 4, kConsumers = 4, kBlocksEach = 1500;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<void*, std::size_t>> queue;
  int producers_left = kProducers;
  std::atomic<int> freed{0};
  std::vector<std::string> errors(kProducers + kConsumers);
  std::vector<std::thread> threads;
  for (int t = 0; t < kProducers; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<unsigned>(t) + 99u);
      ght::test::log_uniform sizes(1, std::size_t{512} << 10);
      try {
        for (int i = 0; i < kBlocksEach; ++i) {
          const std::size_t n = sizes(rng);
          void* p = this->r().allocate(n);
          fill_pattern(this->r(), p, n);
          std::lock_guard lock(mu);
          queue.emplace_back(p, n);
          cv.notify_one();
        }
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(t)] = e.what();
      }
      std::lock_guard lock(mu);
      --producers_left;
      cv.notify_all();
    });
  }
  for (int t = 0; t < kConsumers; ++t) {
    threads.emplace_back([&, t] {
      auto& err = errors[static_cast<std::size_t>(kProducers + t)];
      for (;;) {
        std::pair<void*, std::size_t> b;
        {
          std::unique_lock lock(mu);
          cv.wait(lock, [&] { return !queue.empty() || producers_left == 0; });
          if (queue.empty()) return;
          b = queue.front();
          queue.pop_front();
        }
        try {
          const std::string bad = check_pattern(this->r(), b.first, b.second);
          if (!bad.empty() && err.empty()) err = bad;
          this->r().deallocate(b.first, b.second);
          freed.fetch_add(1);
        } catch (const std::exception& e) {
          err = e.what();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (std::size_t i = 0; i < errors.size(); ++i) EXPECT_EQ(errors[i], "") << "thread " << i;
  EXPECT_EQ(freed.load(), kProducers * kBlocksEach);
}

}  // namespace
