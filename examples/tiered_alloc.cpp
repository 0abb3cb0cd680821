// The tiered allocator from C++: build it from the GHT_* environment, allocate on both tiers,
// run past the HBM budget so later blocks spill to host memory, print per-tier statistics, free.
//
//   build/bin/example_tiered_alloc          # small budgets: HBM 64 MiB, host 256 MiB
//   GHT_HBM_BUDGET=1GiB build/bin/example_tiered_alloc --json   # your budget; JSON statistics
//
// With a GPU the two tiers are HBM (a stream-ordered device pool) and host memory. Without one
// (no device, or a CPU-only build) the default allocator has the host tier only, and an
// allocation meant for HBM lands there without counting as a spill; to still show spilling, the
// example then stands a second host resource, with the HBM budget, in for the hbm tier, and
// says so. Exits 1 if nothing spilled or memory is left allocated after the frees.
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "alloc/system_host.hpp"
#include "alloc/tiered.hpp"
#include "tier/budget.hpp"
#include "tier/config.hpp"
#include "tier/error.hpp"

namespace {

using ght::TensorClass;
using ght::TierKind;
using ght::config::format_bytes;

constexpr std::size_t kMiB = std::size_t{1} << 20;

struct Block {
  void* p;
  std::string name;
};

void print_tiers(const ght::alloc::tiered_allocator& a) {
  std::printf("%-5s %-28s %12s %12s %12s %7s %12s %7s\n", "tier", "resource", "budget",
              "current", "peak", "allocs", "total", "spills");
  for (const TierKind t : {TierKind::hbm, TierKind::host}) {
    const ght::alloc::TierReport r = a.report(t);
    if (!r.present) {
      std::printf("%-5s %-28s\n", std::string(ght::to_string(t)).c_str(), "(absent)");
      continue;
    }
    std::printf("%-5s %-28s %12s %12s %12s %7llu %12s %7llu\n",
                std::string(ght::to_string(t)).c_str(), r.resource.c_str(),
                r.budget == UINT64_MAX ? "unlimited" : format_bytes(r.budget).c_str(),
                format_bytes(r.usage.current).c_str(), format_bytes(r.usage.peak).c_str(),
                static_cast<unsigned long long>(r.usage.count), format_bytes(r.usage.total).c_str(),
                static_cast<unsigned long long>(r.spills_in));
  }
  std::printf("spills: %llu\n", static_cast<unsigned long long>(a.spill_count()));
}

/// Weights (class default: hbm) two chunks past the HBM budget, then Adam moments (class
/// default: host). Returns false when the run did not behave as the rules say.
bool run(ght::alloc::tiered_allocator& a, bool json) {
  const std::uint64_t hbm_budget = a.report(TierKind::hbm).budget;
  // Blocks of at least 16 MiB, and about an eighth of the budget: a dozen allocations at most.
  const std::size_t chunk =
      std::max<std::size_t>(16 * kMiB, (hbm_budget / 8 + kMiB - 1) / kMiB * kMiB);
  const std::size_t n_weights = hbm_budget / chunk + 2;  // the last two cannot fit
  std::vector<Block> blocks;
  auto alloc = [&](TensorClass cls, const std::string& name) {
    ght::alloc::AllocRequest req;
    req.cls = cls;
    req.region = name;
    void* p = a.allocate(chunk, req);
    const auto where = a.where(p);
    std::printf("  %-10s %9s -> %-4s%s\n", name.c_str(), format_bytes(chunk).c_str(),
                std::string(ght::to_string(where->tier)).c_str(),
                where->spilled ? "  (spilled: its tier's budget is used up)" : "");
    // Host blocks are ordinary memory to the CPU: touch every page.
    if (where->tier == TierKind::host) std::memset(p, 0x5a, chunk);
    blocks.push_back({p, name});
  };

  std::printf("allocating %zu weights of %s (class weight, HBM by default):\n", n_weights,
              format_bytes(chunk).c_str());
  for (std::size_t i = 0; i < n_weights; ++i) alloc(TensorClass::weight, "w." + std::to_string(i));
  std::printf("allocating 2 Adam first moments (class adam_m, host by default):\n");
  for (int i = 0; i < 2; ++i) alloc(TensorClass::adam_m, "m." + std::to_string(i));

  // Past every budget: a typed out-of-memory error that names the tiers.
  try {
    ght::alloc::AllocRequest req;
    req.cls = TensorClass::adam_v;
    void* p = a.allocate(a.report(TierKind::host).budget + 1, req);
    a.deallocate(p);
    std::printf("an allocation larger than the host budget unexpectedly succeeded\n");
  } catch (const ght::out_of_memory& e) {
    const std::string msg = e.what();
    std::printf("larger than the host budget: ght::out_of_memory: %s\n",
                msg.substr(0, msg.find('\n')).c_str());
  }

  std::printf("\nper-tier statistics, all blocks live:\n");
  print_tiers(a);
  if (json) std::printf("%s\n", a.stats_json().c_str());

  for (const Block& b : blocks) a.deallocate(b.p);
  std::printf("\nafter freeing %zu blocks:\n", blocks.size());
  print_tiers(a);

  bool ok = true;
  if (a.spill_count() == 0) {
    std::printf("FAIL: nothing spilled past the HBM budget of %s\n",
                format_bytes(hbm_budget).c_str());
    ok = false;
  }
  if (a.total_usage().current != 0) {
    std::printf("FAIL: %s still allocated after the frees\n",
                format_bytes(a.total_usage().current).c_str());
    ok = false;
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const bool json = argc > 1 && std::strcmp(argv[1], "--json") == 0;
  // Small budgets so the example spills quickly; a budget already in the environment wins.
  setenv("GHT_HBM_BUDGET", "64MiB", /*overwrite=*/0);
  setenv("GHT_HOST_BUDGET", "256MiB", /*overwrite=*/0);
  try {
    auto a = ght::alloc::make_default_tiered_allocator();
    std::printf("tiered allocator: %s\n", std::string(a->name()).c_str());
    if (a->has_tier(TierKind::hbm)) {
      std::printf("GPU present: tiers hbm and host\n\n");
      return run(*a, json) ? 0 : 1;
    }

    std::printf("no GPU (or a CPU-only build): the hbm tier is absent, so the tiers are host "
                "memory only\n");
    {
      ght::alloc::AllocRequest req;
      req.cls = TensorClass::weight;
      void* p = a->allocate(16 * kMiB, req);
      std::printf("  a weight (HBM by default) went to %s, spilled=%d: an absent tier is not a "
                  "spill\n",
                  std::string(ght::to_string(a->where(p)->tier)).c_str(),
                  static_cast<int>(a->where(p)->spilled));
      a->deallocate(p);
    }
    // The same budget rule as the default allocator (tier/budget.hpp) sizes the stand-in.
    const auto caps = ght::tier::machine_capacities();
    std::array<ght::alloc::TierSetup, ght::kNumTiers> tiers;
    for (const TierKind t : {TierKind::hbm, TierKind::host}) {
      auto& setup = tiers[static_cast<std::size_t>(t)];
      setup.resource = std::make_unique<ght::alloc::system_host>(-1);
      setup.budget = ght::tier::resolve_budget(t, caps, ght::config::cfg()).bytes;
    }
    ght::alloc::tiered_allocator stand_in(std::move(tiers));
    std::printf("host tiers only: a second host resource stands in for hbm, with the HBM budget "
                "(%s): %s\n\n",
                format_bytes(stand_in.report(TierKind::hbm).budget).c_str(),
                std::string(stand_in.name()).c_str());
    return run(stand_in, json) ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tiered_alloc: %s\n", e.what());
    return 1;
  }
}
