// tier/budget.*: the one budget rule (GHT_<TIER>_BUDGET, else free minus GHT_<TIER>_HEADROOM)
// and the warning for a budget above the tier's capacity.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/registry.hpp"
#include "tier/budget.hpp"
#include "tier/config.hpp"
#include "tier/error.hpp"

namespace ght::tier {
namespace {

constexpr std::uint64_t GiB = 1ULL << 30;

using ght::test::registry_with;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// 100 GiB of HBM with 90 free; 400 GiB of host memory with 300 available.
const Capacities kCaps{"test machine", 100 * GiB, 90 * GiB, 400 * GiB, 300 * GiB};

TEST(Budget, EmptyBudgetIsFreeMinusHeadroom) {
  const auto reg = registry_with({"GHT_HBM_HEADROOM=5GiB", "GHT_HOST_HEADROOM=25%"});
  const TierBudget hbm = resolve_budget(TierKind::hbm, kCaps, reg);
  EXPECT_EQ(hbm.bytes, 85 * GiB);
  EXPECT_TRUE(contains(hbm.origin, "free HBM 90.00 GiB (test machine)")) << hbm.origin;
  EXPECT_TRUE(contains(hbm.origin, "GHT_HBM_HEADROOM=5GiB (env)")) << hbm.origin;
  EXPECT_TRUE(hbm.warning.empty());
  const TierBudget host = resolve_budget(TierKind::host, kCaps, reg);
  EXPECT_EQ(host.bytes, 200 * GiB);  // 25% of the 400 GiB capacity, not of what is available
  EXPECT_TRUE(contains(host.origin, "GHT_HOST_HEADROOM=25% (env)")) << host.origin;
}

TEST(Budget, HeadroomLargerThanFreeLeavesNothing) {
  const auto reg = registry_with({"GHT_HBM_HEADROOM=95GiB"});
  EXPECT_EQ(resolve_budget(TierKind::hbm, kCaps, reg).bytes, 0u);
}

TEST(Budget, ExplicitSizesAndPercentages) {
  const auto reg = registry_with({"GHT_HBM_BUDGET=40G", "GHT_HOST_BUDGET=40GB"});
  EXPECT_EQ(resolve_budget(TierKind::hbm, kCaps, reg).bytes, 40 * GiB);
  EXPECT_EQ(resolve_budget(TierKind::host, kCaps, reg).bytes, 40'000'000'000ULL);
  const auto pct = registry_with({"GHT_HBM_BUDGET=25%", "GHT_HOST_BUDGET=12.5%"});
  const TierBudget hbm = resolve_budget(TierKind::hbm, kCaps, pct);
  EXPECT_EQ(hbm.bytes, 25 * GiB);  // of capacity, not of free memory
  EXPECT_TRUE(contains(hbm.origin, "GHT_HBM_BUDGET=25% (env) of 100.00 GiB HBM (test machine)"))
      << hbm.origin;
  EXPECT_EQ(resolve_budget(TierKind::host, kCaps, pct).bytes, 50 * GiB);
}

TEST(Budget, PercentageOfAnUnknownCapacityThrows) {
  const auto reg = registry_with({"GHT_HBM_BUDGET=50%"});
  EXPECT_THROW((void)resolve_budget(TierKind::hbm, Capacities{"none", 0, 0, 0, 0}, reg),
               config_error);
}

TEST(Budget, BudgetsOfBothTiersMatchTheRule) {
  for (const auto& env : std::vector<std::vector<std::string>>{
           {}, {"GHT_HBM_BUDGET=7GiB"}, {"GHT_HOST_BUDGET=60%", "GHT_HBM_HEADROOM=1%"}}) {
    const auto reg = registry_with(env);
    const Budgets b = resolve_budgets(kCaps, reg);
    const TierBudget hbm = resolve_budget(TierKind::hbm, kCaps, reg);
    const TierBudget host = resolve_budget(TierKind::host, kCaps, reg);
    EXPECT_EQ(b.hbm, hbm.bytes);
    EXPECT_EQ(b.hbm_origin, hbm.origin);
    EXPECT_EQ(b.host, host.bytes);
    EXPECT_EQ(b.host_origin, host.origin);
  }
}

// Issue 16: `--hbm 96G` is 96 GiB, above the gh200 profile's 95.58 GiB of HBM.
TEST(Budget, WarnsWhenABudgetExceedsTheCapacity) {
  const Capacities gh200 = *nominal_capacities("gh200");
  auto reg = registry_with({});
  reg.set_flag("GHT_HBM_BUDGET", "96G");
  testing::internal::CaptureStderr();
  const TierBudget b = resolve_budget(TierKind::hbm, gh200, reg);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(b.bytes, 96 * GiB);  // kept as given
  for (const char* part : {"GHT_HBM_BUDGET=96G (flag)", "96.00 GiB", "103079215104 bytes",
                           "95.58 GiB", "gh200 nominal",
                           "K/M/G/T are powers of 1024, KB/MB/GB/TB of 1000"}) {
    EXPECT_TRUE(contains(b.warning, part)) << part << " not in: " << b.warning;
  }
  EXPECT_EQ(err, "ght: warning: " + b.warning + "\n");

  // Once per process: resolving the same budget again (plan, allocator, re-plan) stays quiet.
  testing::internal::CaptureStderr();
  EXPECT_EQ(resolve_budget(TierKind::hbm, gh200, reg).warning, b.warning);
  (void)resolve_budgets(gh200, reg);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

TEST(Budget, DecimalUnitsAndBudgetsWithinCapacityDoNotWarn) {
  const Capacities gh200 = *nominal_capacities("gh200");
  const auto reg = registry_with({"GHT_HBM_BUDGET=96GB", "GHT_HOST_BUDGET=100%"});
  testing::internal::CaptureStderr();
  const TierBudget hbm = resolve_budget(TierKind::hbm, gh200, reg);
  const TierBudget host = resolve_budget(TierKind::host, gh200, reg);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(hbm.bytes, 96'000'000'000ULL);  // 89.41 GiB
  EXPECT_TRUE(hbm.warning.empty()) << hbm.warning;
  EXPECT_EQ(host.bytes, gh200.host_total);
  EXPECT_TRUE(host.warning.empty()) << host.warning;
}

TEST(Budget, WarnsForEitherTier) {
  const auto reg = registry_with({"GHT_HBM_BUDGET=101GiB", "GHT_HOST_BUDGET=401GiB"});
  const TierBudget hbm = resolve_budget(TierKind::hbm, kCaps, reg);
  EXPECT_EQ(hbm.bytes, 101 * GiB);
  EXPECT_TRUE(contains(hbm.warning, "more than the HBM capacity of 100.00 GiB")) << hbm.warning;
  // Exactly the capacity is not more than it.
  EXPECT_TRUE(resolve_budget(TierKind::hbm, kCaps, registry_with({"GHT_HBM_BUDGET=100GiB"}))
                  .warning.empty());
  const TierBudget host = resolve_budget(TierKind::host, kCaps, reg);
  EXPECT_TRUE(contains(host.warning, "more than the host memory capacity of 400.00 GiB"))
      << host.warning;
}

TEST(Budget, NoWarningWithoutAKnownCapacity) {
  // A machine without a GPU may plan for another machine's HBM budget.
  const auto reg = registry_with({"GHT_HBM_BUDGET=80G"});
  const Capacities no_gpu{"no gpu", 0, 0, 64 * GiB, 32 * GiB};
  const TierBudget b = resolve_budget(TierKind::hbm, no_gpu, reg);
  EXPECT_EQ(b.bytes, 80 * GiB);
  EXPECT_TRUE(b.warning.empty()) << b.warning;
}

}  // namespace
}  // namespace ght::tier
