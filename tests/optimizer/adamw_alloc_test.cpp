// AdamW takes its memory from a tiered allocator: master, m and v are allocations named by the
// region, with their class, on the tier the installed placement gives; running out is the
// allocator's typed out-of-memory error, naming the region and the budget to raise.
#include <gtest/gtest.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "alloc/system_host.hpp"
#include "alloc/tiered.hpp"
#include "common/expect.hpp"
#include "optimizer/adamw.hpp"
#include "tier/error.hpp"

namespace ght::optimizer {
namespace {

// Host memory only, with a budget: what a CPU-only machine's allocator looks like.
std::shared_ptr<alloc::tiered_allocator> host_allocator(std::uint64_t budget) {
  std::array<alloc::TierSetup, kNumTiers> tiers;
  auto& host = tiers[static_cast<std::size_t>(TierKind::host)];
  host.resource = std::make_unique<alloc::system_host>();
  host.budget = budget;
  return std::make_shared<alloc::tiered_allocator>(std::move(tiers));
}

std::vector<Region> regions(std::vector<float>& grads, std::size_t n_a, std::size_t n_b) {
  grads.assign(n_a + n_b, 0.5f);
  Region a;
  a.name = "layer0.attn";
  a.n = n_a;
  a.grad = grads.data();
  a.grad_type = GradType::fp32;
  Region b = a;
  b.name = "layer0.expert3";
  b.n = n_b;
  b.grad = grads.data() + n_a;
  return {a, b};
}

AdamWOptions cpu() {
  AdamWOptions o;
  o.path = PathChoice::cpu;
  o.cpu_threads = 1;
  return o;
}

TEST(AdamWAllocation, StateIsNamedClassedAndCountedByTheAllocator) {
  auto a = host_allocator(UINT64_MAX);
  std::vector<float> grads;
  AdamW opt(regions(grads, 1000, 3000), cpu(), a);
  for (TensorClass c : {TensorClass::master, TensorClass::adam_m, TensorClass::adam_v}) {
    EXPECT_EQ(a->tier_class_usage(TierKind::host, c).current, 4u * 4000u) << to_string(c);
  }
  const auto where = a->where(opt.state(1, TensorClass::adam_v).host);
  ASSERT_TRUE(where.has_value());
  EXPECT_EQ(where->region, "layer0.expert3");
  EXPECT_EQ(where->cls, TensorClass::adam_v);
  EXPECT_EQ(where->tier, TierKind::host);
  // A step through the allocator's memory works as before.
  const StepResult r = opt.step(1e-3);
  EXPECT_TRUE(r.taken);
}

TEST(AdamWAllocation, StateGoesBackWhenTheOptimizerGoes) {
  auto a = host_allocator(UINT64_MAX);
  {
    std::vector<float> grads;
    AdamW opt(regions(grads, 64, 64), cpu(), a);
    EXPECT_GT(a->total_usage().current, 0u);
  }
  EXPECT_EQ(a->total_usage().current, 0u);
}

TEST(AdamWAllocation, OverBudgetIsTheTypedErrorNamingRegionAndBudget) {
  // Room for the first region's state (and scratch), not the second's.
  auto a = host_allocator(3 * 4 * 1000 + (1 << 20));
  std::vector<float> grads;
  try {
    AdamW opt(regions(grads, 1000, 100000), cpu(), a);
    FAIL() << "state over the host budget was allocated";
  } catch (const ght::out_of_memory& e) {
    const std::string m = e.what();
    EXPECT_CONTAINS(m, "layer0.expert3");
    EXPECT_CONTAINS(m, "GHT_HOST_BUDGET");
  }
  // Nothing leaks from the half-built optimizer.
  EXPECT_EQ(a->total_usage().current, 0u);
}

}  // namespace
}  // namespace ght::optimizer
