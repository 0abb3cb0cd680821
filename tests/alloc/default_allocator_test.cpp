// alloc/default_allocator.cpp: make_default_tiered_allocator() sizes its tiers with the one
// budget rule of tier/budget.hpp, warning like the plan does for a budget above capacity.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

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
    config::cfg().load();
  }
  void TearDown() override { SetUp(); }
  static void set(const char* name, const std::string& value) {
    setenv(name, value.c_str(), 1);
    config::cfg().load();
  }
};

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
