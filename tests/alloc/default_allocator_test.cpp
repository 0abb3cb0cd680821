// alloc/default_allocator.cpp: make_default_tiered_allocator() sizes its tiers with the one
// budget rule of tier/budget.hpp, warning like the plan does for a budget above capacity.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "alloc/pinned_host.hpp"
#include "alloc/system_host.hpp"
#include "alloc/tiered.hpp"
#include "tier/budget.hpp"
#include "tier/config.hpp"

namespace ght::alloc {
namespace {

constexpr std::uint64_t MiB = 1ULL << 20;

/// Set (or, with nullptr, unset) a variable and reload the process-wide registry from the
/// environment; restores both at the end of the test.
class DefaultAllocator : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("GHT_HOST_BUDGET");
    unsetenv("GHT_HOST_HEADROOM");
    unsetenv("GHT_HOST_CACHE");
    config::cfg().load();
  }
  void TearDown() override { SetUp(); }
  static void set(const char* name, const std::string& value) {
    setenv(name, value.c_str(), 1);
    config::cfg().load();
  }
};

// GHT_HOST_CACHE bounds the host resource's cache of freed large blocks (0 = off).
TEST_F(DefaultAllocator, HostCacheFollowsGhtHostCache) {
  for (const char* setting : {"64MiB", "0"}) {
    set("GHT_HOST_CACHE", setting);
    const auto a = make_default_tiered_allocator();
    void* p = a->allocate(8 * MiB, AllocRequest{TensorClass::other, "", TierKind::host, false});
    a->deallocate(p);
    memory_resource* host = a->tier_resource(TierKind::host);
    detail::HostCacheStats st;
    if (const auto* sh = dynamic_cast<const system_host*>(host)) {
      st = sh->cache_stats();
    } else if (const auto* ph = dynamic_cast<const pinned_host*>(host)) {
      st = ph->cache_stats();
    } else {
      GTEST_SKIP() << "host tier is " << host->name() << ", which has no block cache";
    }
    EXPECT_EQ(st.cached_bytes > 0, std::string(setting) != "0") << setting;
  }
}

TEST_F(DefaultAllocator, HostBudgetFromTheEnvironment) {
  set("GHT_HOST_BUDGET", "48MiB");
  const auto a = make_default_tiered_allocator();
  EXPECT_EQ(a->report(TierKind::host).budget, 48 * MiB);
}

TEST_F(DefaultAllocator, EmptyBudgetIsTheSharedRule) {
  set("GHT_HOST_HEADROOM", "1GiB");
  const auto a = make_default_tiered_allocator();
  const tier::TierBudget want =
      tier::resolve_budget(TierKind::host, tier::machine_capacities(), config::cfg());
  EXPECT_EQ(a->report(TierKind::host).budget, want.bytes) << want.origin;
  if (a->has_tier(TierKind::hbm)) {
    EXPECT_EQ(a->report(TierKind::hbm).budget,
              tier::resolve_budget(TierKind::hbm, tier::machine_capacities(), config::cfg()).bytes);
  }
}

TEST_F(DefaultAllocator, WarnsWhenTheHostBudgetExceedsTheCapacity) {
  const std::uint64_t capacity = tier::machine_capacities().host_total;
  ASSERT_GT(capacity, 0u);
  const std::uint64_t budget = capacity + 1024 * MiB;
  set("GHT_HOST_BUDGET", std::to_string(budget));
  testing::internal::CaptureStderr();
  const auto a = make_default_tiered_allocator();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(a->report(TierKind::host).budget, budget);  // kept as given
  EXPECT_NE(err.find("ght: warning: GHT_HOST_BUDGET=" + std::to_string(budget) + " (env)"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("more than the host memory capacity"), std::string::npos) << err;
}

}  // namespace
}  // namespace ght::alloc
