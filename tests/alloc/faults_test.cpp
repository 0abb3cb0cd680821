// Faults: budgets that run out and recover, upstream failures injected under the adaptors and
// the tiered allocator, and what stays consistent afterwards. (Stream-ordered reuse with a
// spin kernel is in device_pool_test.cu.)
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <memory>

#include "alloc/limit.hpp"
#include "alloc/logging.hpp"
#include "alloc/replay.hpp"
#include "alloc/statistics.hpp"
#include "alloc/system_host.hpp"
#include "alloc/tiered.hpp"
#include "tier/error.hpp"

namespace {

using namespace ght;
using namespace ght::alloc;

/// Forwards to system memory, but fails the allocations and frees it is told to fail.
class faulty final : public memory_resource {
 public:
  enum class Kind { oom, cuda, logic };
  explicit faulty(TierKind tier = TierKind::host) : tier_(tier) {}
  void fail_next_allocations(int n, Kind k = Kind::oom) {
    kind_ = k;
    fail_allocs_ = n;
  }
  void fail_next_free() { fail_frees_ = 1; }
  [[nodiscard]] int live() const { return live_; }
  [[nodiscard]] TierKind tier() const noexcept override { return tier_; }
  [[nodiscard]] std::string_view name() const noexcept override { return "faulty"; }
  [[nodiscard]] bool host_accessible() const noexcept override { return true; }

 private:
  void* do_allocate(std::size_t bytes, std::size_t alignment, stream_t s, TensorClass c) override {
    if (fail_allocs_ > 0) {
      --fail_allocs_;
      switch (kind_) {
        case Kind::oom:
          throw ght::out_of_memory("faulty: injected out of memory");
        case Kind::cuda:
          throw ght::cuda_error("faulty: injected CUDA failure");
        case Kind::logic:
          throw ght::logic_error("faulty: injected logic error");
      }
    }
    void* p = up_.allocate(bytes, alignment, s, c);
    ++live_;
    return p;
  }
  void do_deallocate(void* p, std::size_t bytes, std::size_t alignment, stream_t s,
                     TensorClass c) override {
    if (fail_frees_ > 0) {
      --fail_frees_;
      throw ght::cuda_error("faulty: injected free failure");
    }
    up_.deallocate(p, bytes, alignment, s, c);
    --live_;
  }
  TierKind tier_;
  system_host up_{-1, false};
  Kind kind_ = Kind::oom;
  int fail_allocs_ = 0;
  int fail_frees_ = 0;
  std::atomic<int> live_{0};
};

TEST(Faults, LimitFailsThenSucceedsAfterFree) {
  system_host host;
  limit_adaptor lim(host, 1 << 20);
  void* a = lim.allocate(768 << 10);
  try {
    (void)lim.allocate(512 << 10);
    FAIL() << "the budget should have been exceeded";
  } catch (const ght::out_of_memory& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("budget of 1.00 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("512"), std::string::npos) << msg;
  }
  EXPECT_EQ(lim.used(), 768u << 10);  // the failed request reserved nothing
  lim.deallocate(a, 768 << 10);
  EXPECT_EQ(lim.used(), 0u);
  void* b = lim.allocate(512 << 10);
  ASSERT_NE(b, nullptr);
  void* c = lim.allocate(512 << 10);  // exactly at the budget is allowed
  EXPECT_EQ(lim.used(), 1u << 20);
  EXPECT_THROW((void)lim.allocate(1), ght::out_of_memory);
  lim.deallocate(b, 512 << 10);
  lim.deallocate(c, 512 << 10);
}

TEST(Faults, UpstreamFailureLeavesAdaptorsUsable) {
  const auto log = (std::filesystem::path(::testing::TempDir()) / "ght_faults.csv").string();
  auto owned = std::make_unique<faulty>();
  faulty& f = *owned;
  auto sink = std::make_shared<log_sink>(log);
  logging_adaptor logged(std::move(owned), sink);
  limit_adaptor lim(logged, 8 << 20);
  statistics_adaptor stats(lim);

  void* a = stats.allocate(1000, 256, nullptr, TensorClass::grad);
  for (auto kind : {faulty::Kind::oom, faulty::Kind::cuda, faulty::Kind::logic}) {
    f.fail_next_allocations(1, kind);
    EXPECT_ANY_THROW((void)stats.allocate(4 << 20, 256, nullptr, TensorClass::grad));
    // Nothing counted, reserved or logged for the failure.
    EXPECT_EQ(stats.total_usage().current, 1000u);
    EXPECT_EQ(stats.total_usage().count, 1u);
    EXPECT_EQ(lim.used(), 1000u);
  }
  // Usable afterwards: the whole budget is still there.
  void* b = stats.allocate((8 << 20) - 1000, 256, nullptr, TensorClass::master);
  EXPECT_EQ(lim.used(), 8u << 20);
  stats.deallocate(a, 1000, 256, nullptr, TensorClass::grad);
  stats.deallocate(b, (8 << 20) - 1000, 256, nullptr, TensorClass::master);
  EXPECT_EQ(stats.total_usage().current, 0u);
  EXPECT_EQ(f.live(), 0);
  sink->flush();
  const ReplayReport rep = replay_log(log);  // the log has no trace of the failures
  EXPECT_EQ(rep.events, 4u);
  EXPECT_EQ(rep.tiers[1].peak_live, stats.total_usage().peak);
}

std::array<TierSetup, kNumTiers> two_tiers(faulty** first) {
  std::array<TierSetup, kNumTiers> t;
  auto f = std::make_unique<faulty>(TierKind::hbm);
  *first = f.get();
  t[0].resource = std::move(f);
  t[1].resource = std::make_unique<system_host>(-1, false);
  return t;
}

TEST(Faults, TieredSpillsOnUpstreamOutOfMemory) {
  faulty* hbm = nullptr;
  tiered_allocator t(two_tiers(&hbm));
  hbm->fail_next_allocations(1, faulty::Kind::oom);  // the device itself is full, not a budget
  void* p = t.allocate(4096, AllocRequest{TensorClass::weight, "w0", {}, true});
  const auto w = t.where(p);
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->tier, TierKind::host);
  EXPECT_TRUE(w->spilled);
  EXPECT_EQ(t.spill_count(), 1u);
  EXPECT_EQ(t.report(TierKind::hbm).failures, 1u);
  EXPECT_EQ(t.report(TierKind::host).spills_in, 1u);
  // The next request lands on hbm again.
  void* q = t.allocate(4096, AllocRequest{TensorClass::weight, "w1", {}, true});
  EXPECT_EQ(t.where(q)->tier, TierKind::hbm);
  t.deallocate(p);
  t.deallocate(q);
  EXPECT_EQ(hbm->live(), 0);
}

TEST(Faults, TieredPropagatesOtherErrorsAndStaysUsable) {
  faulty* hbm = nullptr;
  tiered_allocator t(two_tiers(&hbm));
  hbm->fail_next_allocations(1, faulty::Kind::cuda);
  // Not a lack of memory: no spill, the error reaches the caller untouched.
  EXPECT_THROW((void)t.allocate(4096, AllocRequest{TensorClass::weight, "w", {}, true}),
               ght::cuda_error);
  EXPECT_EQ(t.spill_count(), 0u);
  EXPECT_EQ(t.total_usage().current, 0u);
  EXPECT_EQ(t.report(TierKind::hbm).usage.count, 0u);
  void* p = t.allocate(4096, AllocRequest{TensorClass::weight, "w", {}, true});
  EXPECT_EQ(t.where(p)->tier, TierKind::hbm);

  // A failed free leaves the block live and recorded; retrying succeeds.
  hbm->fail_next_free();
  EXPECT_THROW(t.deallocate(p), ght::cuda_error);
  ASSERT_TRUE(t.where(p).has_value());
  EXPECT_EQ(t.report(TierKind::hbm).usage.current, 4096u);
  t.deallocate(p);
  EXPECT_FALSE(t.where(p).has_value());
  EXPECT_EQ(t.total_usage().current, 0u);
  EXPECT_EQ(hbm->live(), 0);
}

TEST(Faults, OutOfMemoryWhenEveryTierFails) {
  faulty* hbm = nullptr;
  auto tiers = two_tiers(&hbm);
  tiers[1].budget = 1 << 20;
  tiered_allocator t(std::move(tiers));
  hbm->fail_next_allocations(1, faulty::Kind::oom);
  try {
    (void)t.allocate(2 << 20, AllocRequest{TensorClass::weight, "big", {}, true});
    FAIL() << "expected out_of_memory";
  } catch (const ght::out_of_memory& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("faulty: injected out of memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("raise GHT_HOST_BUDGET (now 1.00 MiB)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("free hbm memory"), std::string::npos) << msg;
  }
  // Still usable.
  void* p = t.allocate(1 << 20, AllocRequest{TensorClass::weight, "fits", {}, true});
  EXPECT_NE(p, nullptr);
  t.deallocate(p);
}

}  // namespace
